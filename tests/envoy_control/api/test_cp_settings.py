"""The control plane's one setting that is not a flag, the admin token (pydantic-settings):
``MODELFLEET_CONTROL_PLANE_ADMIN_TOKEN`` (or the older ``MODELFLEET_ADMIN_TOKEN``), a secret file
under them, ``--admin-token-file`` over all, and a bad token ending the process with exit 2."""

from __future__ import annotations

import asyncio
import warnings
from pathlib import Path

import pytest
from envoy_control.__main__ import run
from envoy_control.cli_args import ControlPlaneSettings, parse_args
from pydantic import ValidationError

from modelfleet.settings import SECRETS_DIR_ENV

REPO = Path(__file__).resolve().parents[3]
TOKEN = "cp-admin-token-0123456789"


def test_the_token_comes_from_the_prefixed_variable_then_the_older_name() -> None:
    assert ControlPlaneSettings.from_env({}).admin_token is None
    assert ControlPlaneSettings.from_env(
        {"MODELFLEET_CONTROL_PLANE_ADMIN_TOKEN": TOKEN}).admin_token == TOKEN
    assert ControlPlaneSettings.from_env({"MODELFLEET_ADMIN_TOKEN": TOKEN}).admin_token == TOKEN
    both = {"MODELFLEET_CONTROL_PLANE_ADMIN_TOKEN": TOKEN, "MODELFLEET_ADMIN_TOKEN": "x" * 20}
    assert ControlPlaneSettings.from_env(both).admin_token == TOKEN
    assert ControlPlaneSettings.from_env({"MODELFLEET_ADMIN_TOKEN": ""}).admin_token is None
    assert TOKEN not in repr(ControlPlaneSettings.from_env(both))


def test_a_secret_file_supplies_the_token(tmp_path: Path) -> None:
    folder = tmp_path / "secrets"
    folder.mkdir()
    (folder / "MODELFLEET_CONTROL_PLANE_ADMIN_TOKEN").write_text(TOKEN + "\n")
    assert ControlPlaneSettings.from_env({SECRETS_DIR_ENV: str(folder)}).admin_token == TOKEN
    env = {SECRETS_DIR_ENV: str(folder), "MODELFLEET_CONTROL_PLANE_ADMIN_TOKEN": "e" * 16}
    assert ControlPlaneSettings.from_env(env).admin_token == "e" * 16
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        absent = ControlPlaneSettings.from_env({SECRETS_DIR_ENV: str(tmp_path / "absent")})
    assert absent.admin_token is None


def test_a_short_token_is_an_error_that_does_not_show_it() -> None:
    with pytest.raises(ValidationError, match="at least 16 characters") as caught:
        ControlPlaneSettings.from_env({"MODELFLEET_ADMIN_TOKEN": "short-tok"})
    assert "short-tok" not in str(caught.value)


def cp_args(*extra: str) -> list[str]:
    return ["--config", str(REPO / "config"), "--xds-port", "0", "--http-port", "0",
            "--listener-port", "0", *extra]


def test_run_exits_2_on_a_bad_token_and_the_file_flag_wins(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        tmp_path: Path) -> None:
    monkeypatch.setenv("MODELFLEET_CONTROL_PLANE_ADMIN_TOKEN", "short-tok")
    assert asyncio.run(run(parse_args(cp_args()))) == 2
    err = capsys.readouterr().err
    assert err.startswith("envoy_control: ") and "at least 16 characters" in err
    assert "MODELFLEET_CONTROL_PLANE_ADMIN_TOKEN" in err and "short-tok" not in err
    # --admin-token-file wins: the variable is not read at all (an empty file: its own error)
    (tmp_path / "token").write_text("")
    assert asyncio.run(run(parse_args(cp_args("--admin-token-file", str(tmp_path / "token"))))) == 2
    assert "empty admin token file" in capsys.readouterr().err

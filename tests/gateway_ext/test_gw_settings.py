"""gateway_ext's settings (pydantic-settings): ``MODELFLEET_GATEWAY_*`` variables, flags over
them, secret files under them, and a bad value ending ``python -m gateway_ext`` with exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from pydantic_settings import SettingsError

from gateway_ext.__main__ import main, parse_args
from gateway_ext.settings import Settings
from modelfleet.settings import DEFAULT_SECRETS_DIR, SECRETS_DIR_ENV

REPO = Path(__file__).resolve().parents[2]


def secrets(tmp_path: Path, **files: str) -> Path:
    """A secrets directory holding one file per keyword (file name -> content)."""
    folder = tmp_path / "secrets"
    folder.mkdir()
    for name, content in files.items():
        (folder / name).write_text(content)
    return folder


def test_variables_are_read_with_the_prefix_and_json_for_lists_and_mappings() -> None:
    env = {"MODELFLEET_GATEWAY_PORT": "9001", "MODELFLEET_GATEWAY_REPLICAS": '{"chat-7b@v13": 2}',
           "MODELFLEET_GATEWAY_QUEUE_TIMEOUT_STANDARD_S": "7.5",
           "MODELFLEET_GATEWAY_ROUTER_STATE_WRITE": "1", "MODELFLEET_GATEWAY_PICKING": "round_robin",
           "PORT": "1", "MODELFLEET_BATCH_PORT": "2", "MODELFLEET_GATEWAY_UNKNOWN": "x"}
    s = Settings.from_env(env)
    assert (s.port, s.replicas, s.queue_timeouts_s["standard"], s.router_state_write,
            s.picking) == (9001, {"chat-7b@v13": 2}, 7.5, True, "round_robin")
    assert (s.redis_url, s.host, s.config_dir) == (None, "127.0.0.1", Path("config"))


def test_the_process_environment_is_read_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODELFLEET_GATEWAY_MAX_QUEUE", "3")
    monkeypatch.setenv("MODELFLEET_GATEWAY_REDIS_URL", "redis://env:6379/0")
    assert (Settings().max_queue, Settings.from_env().redis_url) == (3, "redis://env:6379/0")
    assert Settings.from_env({}).max_queue == 256  # a given mapping replaces os.environ


def test_flags_win_over_the_environment() -> None:
    env = {"MODELFLEET_GATEWAY_PORT": "9001", "MODELFLEET_GATEWAY_REDIS_URL": "redis://env",
           "MODELFLEET_GATEWAY_REGION": "eu-west-1", "MODELFLEET_GATEWAY_DEBUG": "false"}
    args = parse_args(["--port", "9100", "--redis-url", "redis://flag", "--debug"])
    s = Settings.from_env(env, **vars(args))
    assert (s.port, s.redis_url, s.debug, s.region) == (9100, "redis://flag", True, "eu-west-1")


def test_a_secret_file_supplies_a_value_under_the_variable_and_the_flag(tmp_path: Path) -> None:
    folder = secrets(tmp_path, MODELFLEET_GATEWAY_REDIS_URL="rediss://:pw@redis:6379/0\n",
                     modelfleet_gateway_usage_db_url="postgresql+psycopg://u:pw@db/usage",
                     MODELFLEET_GATEWAY_REPLICAS='{"chat-7b@v13": 4}')
    env = {SECRETS_DIR_ENV: str(folder)}
    s = Settings.from_env(env)
    assert (s.redis_url, s.usage_db_url, s.replicas) == (
        "rediss://:pw@redis:6379/0", "postgresql+psycopg://u:pw@db/usage", {"chat-7b@v13": 4})
    assert Settings.from_env({**env, "MODELFLEET_GATEWAY_REDIS_URL": "redis://env"}).redis_url \
        == "redis://env"
    assert Settings.from_env(env, redis_url="redis://flag").redis_url == "redis://flag"
    given: dict[str, Any] = {"_secrets_dir": folder}  # pydantic-settings' own keyword wins too
    assert Settings(**given).redis_url == "rediss://:pw@redis:6379/0"
    assert Settings.from_env({SECRETS_DIR_ENV: str(tmp_path)}, **given).redis_url \
        == "rediss://:pw@redis:6379/0"


def test_a_missing_secrets_directory_is_harmless(tmp_path: Path) -> None:
    assert Path("/run/secrets/modelfleet") == DEFAULT_SECRETS_DIR
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s = Settings.from_env({SECRETS_DIR_ENV: str(tmp_path / "absent")})
    assert s.redis_url is None


def test_bad_values_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="port"):
        Settings.from_env({"MODELFLEET_GATEWAY_PORT": "not a port"})
    with pytest.raises(ValidationError, match="queue_timeout_batch_s"):
        Settings.from_env({"MODELFLEET_GATEWAY_QUEUE_TIMEOUT_BATCH_S": "-1"})
    with pytest.raises(SettingsError, match='"replicas"'):
        Settings.from_env({"MODELFLEET_GATEWAY_REPLICAS": "{chat-7b@v13: 2}"})
    folder = secrets(tmp_path, MODELFLEET_GATEWAY_PORT="70000")
    with pytest.raises(ValidationError, match="port"):
        Settings.from_env({SECRETS_DIR_ENV: str(folder)})
    with pytest.raises(SettingsError, match="directory"):
        Settings.from_env({SECRETS_DIR_ENV: str(folder / "MODELFLEET_GATEWAY_PORT")})


@pytest.mark.parametrize(("var", "value", "words"), [
    ("MODELFLEET_GATEWAY_PORT", "not a port", ["gateway_ext:", "port", "valid integer"]),
    ("MODELFLEET_GATEWAY_REPLICAS", "{bad", ["gateway_ext:", '"replicas"', "double quotes"]),
])
def test_main_exits_2_with_the_message(monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str], var: str, value: str,
                                       words: list[str]) -> None:
    monkeypatch.setenv(var, value)
    assert main(["--config", str(REPO / "config")]) == 2
    err = capsys.readouterr().err
    assert all(w in err for w in words) and "Traceback" not in err


def test_python_m_gateway_ext_exits_2_on_a_bad_variable() -> None:
    env = {**os.environ, "MODELFLEET_GATEWAY_MAX_QUEUE": json.dumps([1])}
    r = subprocess.run([sys.executable, "-m", "gateway_ext", "--config", str(REPO / "config")],
                       capture_output=True, text=True, timeout=60, env=env, cwd=REPO)
    assert r.returncode == 2
    assert "gateway_ext: 1 validation error for Settings" in r.stderr and "max_queue" in r.stderr

"""The batch service's settings (pydantic-settings): ``MODELFLEET_BATCH_*`` variables, flags
over them, secret files under them, a bad value ending ``python -m batch`` with exit 2, and
no import of the gateway's package."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from pydantic import ValidationError
from pydantic_settings import SettingsError

from batch.service import main, parse_args
from batch.settings import BatchSettings
from modelfleet.settings import SECRETS_DIR_ENV

REPO = Path(__file__).resolve().parents[2]


def test_variables_are_read_with_the_prefix_and_json_for_lists() -> None:
    env = {"MODELFLEET_BATCH_FILE_ROOTS": '["/data/batches", "/data/{team}"]',
           "MODELFLEET_BATCH_S3_BUCKETS": '["b1/prefix/{team}/"]', "MODELFLEET_BATCH_ROLE": "api",
           "MODELFLEET_BATCH_MAX_ATTEMPTS": "2", "MODELFLEET_BATCH_DEV_KEYS": "true",
           "MODELFLEET_BATCH_TEAM_KEYS_FILE": "/run/keys.json", "ROLE": "worker",
           "MODELFLEET_GATEWAY_PORT": "1"}
    s = BatchSettings.from_env(env)
    assert (s.file_roots, s.s3_buckets, s.role, s.max_attempts, s.dev_keys, s.team_keys_file) == (
        [Path("/data/batches"), Path("/data/{team}")], ["b1/prefix/{team}/"], "api", 2, True,
        Path("/run/keys.json"))
    assert (s.port, s.concurrency, s.s3_endpoint_url) == (8091, 8, None)


def test_the_process_environment_is_read_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODELFLEET_BATCH_LEASE_S", "30")
    assert (BatchSettings().lease_s, BatchSettings.from_env().lease_s) == (30.0, 30.0)
    assert BatchSettings.from_env({}).lease_s == 15.0


def test_flags_win_over_the_environment() -> None:
    env = {"MODELFLEET_BATCH_CONCURRENCY": "3", "MODELFLEET_BATCH_FILE_ROOTS": '["/env"]',
           "MODELFLEET_BATCH_DB_URL": "sqlite:///env.db", "MODELFLEET_BATCH_LEASE_S": "30"}
    args = parse_args(["--concurrency", "5", "--file-root", "/flag/a", "--file-root", "/flag/b",
                       "--db-url", "sqlite:///flag.db"])
    s = BatchSettings.from_env(env, **vars(args))
    assert (s.concurrency, s.file_roots, s.db_url, s.lease_s) == (
        5, [Path("/flag/a"), Path("/flag/b")], "sqlite:///flag.db", 30.0)


def test_a_secret_file_supplies_a_value_under_the_variable_and_the_flag(tmp_path: Path) -> None:
    folder = tmp_path / "secrets"
    folder.mkdir()
    (folder / "MODELFLEET_BATCH_DB_URL").write_text("postgresql+psycopg://batch:pw@db/mf\n")
    (folder / "MODELFLEET_BATCH_S3_BUCKETS").write_text(json.dumps(["secret-bucket"]))
    env = {SECRETS_DIR_ENV: str(folder)}
    s = BatchSettings.from_env(env)
    assert (s.db_url, s.s3_buckets) == ("postgresql+psycopg://batch:pw@db/mf", ["secret-bucket"])
    assert BatchSettings.from_env({**env, "MODELFLEET_BATCH_DB_URL": "sqlite:///env.db"}).db_url \
        == "sqlite:///env.db"
    assert BatchSettings.from_env(env, db_url="sqlite:///flag.db").db_url == "sqlite:///flag.db"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        absent = BatchSettings.from_env({SECRETS_DIR_ENV: str(tmp_path / "absent")})
    assert absent.s3_buckets is None


def test_bad_values_are_clear_errors() -> None:
    with pytest.raises(ValidationError, match="concurrency"):
        BatchSettings.from_env({"MODELFLEET_BATCH_CONCURRENCY": "0"})
    with pytest.raises(ValidationError, match="role"):
        BatchSettings.from_env({"MODELFLEET_BATCH_ROLE": "both"})
    with pytest.raises(SettingsError, match='"file_roots"'):
        BatchSettings.from_env({"MODELFLEET_BATCH_FILE_ROOTS": "/data/batches"})


def test_main_exits_2_with_the_message(monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("MODELFLEET_BATCH_FILE_ROOTS", "/data/batches")
    assert main(["--config", str(REPO / "config")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("batch: ") and '"file_roots"' in err and "Traceback" not in err


def test_python_m_batch_exits_2_on_a_bad_variable_and_never_imports_the_gateway() -> None:
    env = {**os.environ, "MODELFLEET_BATCH_POLL_INTERVAL_S": "soon"}
    r = subprocess.run([sys.executable, "-m", "batch", "--config", str(REPO / "config")],
                       capture_output=True, text=True, timeout=60, env=env, cwd=REPO)
    assert r.returncode == 2
    assert "batch: 1 validation error for BatchSettings" in r.stderr
    assert "poll_interval_s" in r.stderr
    probe = subprocess.run([sys.executable, "-c", "import sys, batch.service; "
                            "print(sorted(m for m in sys.modules if m.startswith('gateway_ext')))"],
                           capture_output=True, text=True, timeout=60, cwd=REPO)
    assert probe.returncode == 0 and probe.stdout.strip() == "[]"

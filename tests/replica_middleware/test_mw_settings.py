"""The middleware's settings (pydantic-settings): ``MODELFLEET_*`` variables (with the replica's
own names for host and port), keywords (the simulated replica's flags) over them, secret files
under them, and clear errors."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from pydantic import ValidationError

from modelfleet.settings import SECRETS_DIR_ENV
from replica_middleware.settings import MiddlewareSettings

POD = {"MODELFLEET_REPLICA_ID": "chat-7b-v13-abc", "MODELFLEET_REPLICA_IP": "10.2.3.4",
       "MODELFLEET_REPLICA_PORT": "8001", "MODELFLEET_REGION": "eu-west-1",
       "MODELFLEET_MODEL": "chat-7b", "MODELFLEET_VERSION": "v13",
       "MODELFLEET_CONTROL_PLANE_URL": "http://cp:8081", "MODELFLEET_DRAIN_GRACE_S": "2.5",
       "MODELFLEET_DEFAULT_MAX_TOKENS": "512", "MODELFLEET_TIME_SCALE": "10"}


def test_variables_are_read_with_the_prefix() -> None:
    s = MiddlewareSettings.from_env({**POD, "REGION": "x", "MODELFLEET_GATEWAY_PORT": "1"})
    assert (s.replica_id, s.host, s.port, s.region, s.model, s.version) == (
        "chat-7b-v13-abc", "10.2.3.4", 8001, "eu-west-1", "chat-7b", "v13")
    assert (s.drain_grace_s, s.default_max_tokens, s.time_scale, s.shutdown_timeout_s) == (
        2.5, 512, 10.0, 10.0)
    assert s.beats and s.handle_sigterm


def test_host_and_port_come_from_the_replica_variables_only() -> None:
    assert MiddlewareSettings.from_env({"MODELFLEET_REPLICA_HOST": "h"}).host == "h"
    both = {"MODELFLEET_REPLICA_IP": "ip", "MODELFLEET_REPLICA_HOST": "h"}
    assert MiddlewareSettings.from_env(both).host == "ip"
    s = MiddlewareSettings.from_env({"MODELFLEET_HOST": "no", "MODELFLEET_PORT": "1"})
    assert (s.host, s.port) == ("", 8000)


def test_an_empty_variable_is_unset_and_booleans_parse() -> None:
    s = MiddlewareSettings.from_env({"MODELFLEET_REPLICA_PORT": "", "MODELFLEET_BEAT_INTERVAL_S": "",
                                     "MODELFLEET_HANDLE_SIGTERM": "off"})
    assert (s.port, s.beat_interval_s, s.handle_sigterm) == (8000, 1.0, False)


def test_the_process_environment_is_read_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODELFLEET_SETTLE_URL", "http://gw:8090/v1/settle")
    monkeypatch.setenv("MODELFLEET_REPLICA_PORT", "8002")
    s = MiddlewareSettings.from_env()
    assert (s.settle_url, s.port) == ("http://gw:8090/v1/settle", 8002)
    assert MiddlewareSettings.from_env({}).settle_url == ""


def test_keywords_win_over_the_environment_and_none_is_not_given() -> None:
    s = MiddlewareSettings.from_env(POD, host="127.0.0.1", port=9001, region=None,
                                    time_scale=2.0, shutdown_timeout_s=3.0)
    assert (s.host, s.port, s.region, s.time_scale, s.shutdown_timeout_s) == (
        "127.0.0.1", 9001, "eu-west-1", 2.0, 3.0)


def test_a_secret_file_supplies_a_value_under_the_variable(tmp_path: Path) -> None:
    folder = tmp_path / "secrets"
    folder.mkdir()
    (folder / "MODELFLEET_SETTLE_URL").write_text("http://gw:8090/v1/settle\n")
    (folder / "modelfleet_replica_port").write_text("8003")
    env = {SECRETS_DIR_ENV: str(folder)}
    s = MiddlewareSettings.from_env(env)
    assert (s.settle_url, s.port) == ("http://gw:8090/v1/settle", 8003)
    over = MiddlewareSettings.from_env({**env, "MODELFLEET_SETTLE_URL": "http://env/v1/settle"},
                                       port=8004)
    assert (over.settle_url, over.port) == ("http://env/v1/settle", 8004)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert MiddlewareSettings.from_env({SECRETS_DIR_ENV: str(tmp_path / "absent")}).port == 8000


@pytest.mark.parametrize(("var", "value", "where"), [
    ("MODELFLEET_REPLICA_PORT", "eighty", "MODELFLEET_REPLICA_PORT"),
    ("MODELFLEET_REPLICA_PORT", "70000", "MODELFLEET_REPLICA_PORT"),
    ("MODELFLEET_BEAT_INTERVAL_S", "0", "beat_interval_s"),
    ("MODELFLEET_DEFAULT_MAX_TOKENS", "0", "default_max_tokens"),
    ("MODELFLEET_HANDLE_SIGTERM", "maybe", "handle_sigterm"),
])
def test_a_bad_value_is_a_clear_error(var: str, value: str, where: str) -> None:
    with pytest.raises(ValidationError, match=where) as caught:
        MiddlewareSettings.from_env({var: value})
    assert isinstance(caught.value, ValueError) and value in str(caught.value)

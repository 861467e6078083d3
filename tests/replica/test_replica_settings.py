"""``python -m replica``'s middleware settings: its flags win over the ``MODELFLEET_*``
variables, which fill in what the flags leave out; a bad variable exits 2."""

from __future__ import annotations

import pytest

from replica.__main__ import config_from_args, main, middleware_settings, parse_args


def test_flags_win_and_variables_fill_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODELFLEET_SHUTDOWN_TIMEOUT_S", "410.5")
    monkeypatch.setenv("MODELFLEET_DRAIN_GRACE_S", "1.5")
    monkeypatch.setenv("MODELFLEET_REGION", "env-region")
    monkeypatch.setenv("MODELFLEET_SETTLE_URL", "http://env/v1/settle")
    args = parse_args(["--port", "8005", "--model-version", "chat-7b@v13", "--region", "local",
                       "--replica-id", "chat-7b@v13-0", "--advertise-host", "10.0.0.9"])
    s = middleware_settings(args, config_from_args(args))
    assert (s.port, s.region, s.replica_id, s.host, s.model, s.version) == (
        8005, "local", "chat-7b@v13-0", "10.0.0.9", "chat-7b", "v13")
    assert (s.shutdown_timeout_s, s.drain_grace_s, s.settle_url) == (
        410.5, 1.5, "http://env/v1/settle")
    flagged = parse_args(["--shutdown-timeout", "3", "--settle-url", "http://flag/v1/settle"])
    s = middleware_settings(flagged, config_from_args(flagged))
    assert (s.shutdown_timeout_s, s.settle_url) == (3.0, "http://flag/v1/settle")


def test_a_bad_variable_exits_2_with_the_message(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("MODELFLEET_BEAT_INTERVAL_S", "0")
    assert main(["--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("replica: ") and "beat_interval_s" in err

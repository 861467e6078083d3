"""Fixtures of the live tests: a real local stack (control plane, gateway, replicas, Envoy), and
the machine's Postgres."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from modelfleet.local.harness import RunningStack, assert_all_stopped, start_stack, write_config
from modelfleet.testing import postgres_url  # noqa: F401  (fixture)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    """The default local stack (3 x chat-7b@v13, 1 x chat-7b@v14, 1 x reason-70b@v1), 20x real time."""
    cwd = tmp_path_factory.mktemp("stack")
    config = write_config(cwd / "config", time_scale=20.0)
    running = start_stack(cwd, config, "--debug")
    try:
        yield running
    finally:
        code = running.stop(signal.SIGINT)
        assert code == 0, running.log.read_text()
        assert_all_stopped(running)

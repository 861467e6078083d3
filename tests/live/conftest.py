"""Fixtures of the live tests: a real local stack (control plane, gateway, replicas, Envoy), and
the machine's Postgres."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest
import sqlalchemy

from modelfleet.local.harness import RunningStack, assert_all_stopped, start_stack, write_config


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


POSTGRES_URL = os.environ.get("MODELFLEET_TEST_POSTGRES_URL",
                              "postgresql+psycopg://postgres@127.0.0.1:5432/test")


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """A reachable Postgres (fails under CI=true, skips otherwise, when unreachable)."""
    engine = sqlalchemy.create_engine(POSTGRES_URL, connect_args={"connect_timeout": 3})
    try:
        with engine.connect() as conn:
            conn.execute(sqlalchemy.text("select 1"))
    except sqlalchemy.exc.SQLAlchemyError as exc:
        message = f"Postgres at {POSTGRES_URL} is not reachable: {exc}"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    finally:
        engine.dispose()
    return POSTGRES_URL

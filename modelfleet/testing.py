"""Helpers and fixtures the test suites share (imported by tests only; a test folder's conftest
imports the fixtures it uses): the repository's config and dev keys, and real Postgres.

Tests that need Postgres talk to a real server over a real connection. Where it is not
reachable they fail under ``CI=true`` (CI must not pass by skipping) and skip otherwise.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
import sqlalchemy

from modelfleet.config import PlatformConfig, load_config

REPO = Path(__file__).resolve().parents[1]

POSTGRES_URL = os.environ.get("MODELFLEET_TEST_POSTGRES_URL",
                              "postgresql+psycopg://postgres@127.0.0.1:5432/test")
"""The test database (``$MODELFLEET_TEST_POSTGRES_URL``; default the machine's ``test``)."""


def service_missing(message: str) -> None:
    """Fail the test under ``CI=true``, skip it otherwise."""
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


def require_postgres(url: str = POSTGRES_URL, timeout_s: int = 3) -> str:
    """``url`` once a ``select 1`` went through (within ``timeout_s`` seconds to connect)."""
    engine = sqlalchemy.create_engine(url, connect_args={"connect_timeout": timeout_s})
    try:
        with engine.connect() as conn:
            conn.execute(sqlalchemy.text("select 1"))
    except sqlalchemy.exc.SQLAlchemyError as exc:
        service_missing(f"Postgres at {url} is not reachable: {exc}")
    finally:
        engine.dispose()
    return url


@pytest.fixture(scope="session")
def platform_config() -> PlatformConfig:
    """The repository's declared config (config/*.yaml)."""
    return load_config(REPO / "config").config


@pytest.fixture(scope="session")
def dev_keys(platform_config: PlatformConfig) -> dict[str, str]:
    """Team -> dev key, from the config's ``local.dev_keys``."""
    found = dict(platform_config.local.dev_keys)
    assert found, "no dev keys in config/local.yaml"
    return found


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """The URL of a reachable Postgres (fails under CI=true, skips otherwise, when unreachable)."""
    return require_postgres()


@pytest.fixture
def table_prefix() -> str:
    """A table-name prefix of this test alone (the store's ``drop_tables`` removes its tables)."""
    return f"gwt_{uuid.uuid4().hex[:10]}_"


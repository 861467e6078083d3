"""Helpers the test suites share for the real services they need (imported by tests only).

Tests that need Postgres talk to a real server over a real connection. Where it is not
reachable they fail under ``CI=true`` (CI must not pass by skipping) and skip otherwise.
"""

from __future__ import annotations

import os

import pytest
import sqlalchemy

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

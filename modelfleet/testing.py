"""Helpers and fixtures the test suites share (imported by tests only; a test folder's conftest
imports the fixtures it uses): the repository's config and dev keys, and real Postgres.

Tests that need Postgres talk to a real server over a real connection. Where it is not
reachable they fail under ``CI=true`` (CI must not pass by skipping) and skip otherwise.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

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


def schema_diffs(engine: sqlalchemy.Engine, metadata: sqlalchemy.MetaData) -> list[Any]:
    """What Alembic's autogenerate finds between ``metadata``'s tables and the database (other
    tables in it are ignored): empty when the migrations made exactly the declared shape."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    names = set(metadata.tables)
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={
            "include_name": lambda name, kind, _parent: kind != "table" or name in names,
            "compare_server_default": True})
        return list(compare_metadata(ctx, metadata))


def recorded_revisions(engine: sqlalchemy.Engine, version_table: str) -> list[str]:
    """The revisions an Alembic version table holds."""
    with engine.connect() as conn:
        return [r[0] for r in conn.execute(sqlalchemy.text(
            f'SELECT version_num FROM "{version_table}"'))]


def migration_database(request: pytest.FixtureRequest, tmp_path: Path, name: str) -> tuple[str, str]:
    """For a fixture parametrised ``["sqlite", "postgres"]``: a database URL and a table prefix,
    a SQLite file ``<name>.db`` under ``tmp_path`` (prefix ``mf_``) or the test Postgres with
    this test's own prefix."""
    if request.param == "postgres":
        return request.getfixturevalue("postgres_url"), request.getfixturevalue("table_prefix")
    return f"sqlite:///{tmp_path / f'{name}.db'}", "mf_"

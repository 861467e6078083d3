"""SQL engines for the platform's databases (SQLAlchemy 2): SQLite by default, Postgres in
production; the metering database that gateway_ext's usage rows and the batch service's tables
share, and its defaults."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, create_engine, event, make_url

DEFAULT_URL = "sqlite:///modelfleet-usage.db"
"""The metering database of a process started without a URL (a SQLite file in its directory)."""
DEFAULT_TABLE_PREFIX = "mf_"
"""Prefix of every metering table name (usage and batch), so tests and other data never collide."""

SQLITE_BUSY_TIMEOUT_S = 15.0
"""How long a SQLite writer waits for another process's write lock, in seconds (the gateway's
usage flush and the batch service share the local stack's file)."""


def _connect_args(url: str, connect_timeout_s: float) -> dict[str, Any]:
    driver = make_url(url).get_backend_name()
    if driver == "postgresql":
        return {"connect_timeout": max(1, round(connect_timeout_s))}
    if driver == "sqlite":
        return {"timeout": max(connect_timeout_s, SQLITE_BUSY_TIMEOUT_S)}
    raise ValueError(f"usage store supports postgresql and sqlite URLs, not {driver!r}")


def make_engine(url: str, connect_timeout_s: float) -> Engine:
    """The engine for ``url``. A SQLite file is put in WAL mode (readers never block the writer,
    several processes share it) with a busy timeout of :data:`SQLITE_BUSY_TIMEOUT_S`."""
    engine = create_engine(url, pool_pre_ping=True,
                           connect_args=_connect_args(url, connect_timeout_s))
    if engine.dialect.name == "sqlite":
        @event.listens_for(engine, "connect")
        def _wal(dbapi_conn: Any, _record: Any) -> None:
            cursor = dbapi_conn.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute(f"PRAGMA busy_timeout={int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
            cursor.close()
    return engine

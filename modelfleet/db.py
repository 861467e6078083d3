"""SQL engines for the platform's databases (SQLAlchemy 2): SQLite by default, Postgres in
production; the metering database that gateway_ext's usage rows and the batch service's tables
share, and its defaults; and :func:`run_migrations`, which brings one schema's Alembic
:class:`History` (the registry's, the usage tables', the batch tables') to head at start."""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    MetaData,
    Table,
    create_engine,
    event,
    inspect,
    make_url,
    text,
)

log = logging.getLogger(__name__)

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


# -- schema migrations (Alembic, run in code at start) ----------------------------------------

MIGRATION_PREFIX = "table_prefix"
"""Key of the table prefix in the Alembic ``Config.attributes`` of a run (read by the revisions
through :func:`migration_prefix`)."""

_MIGRATING = threading.Lock()
"""Alembic's ``op``/``context`` proxies are process-wide: one migration run at a time."""


@dataclass(frozen=True)
class History:
    """One schema's Alembic history: ``location`` holds its ``versions/`` (revision modules),
    ``schema`` names its version table (:func:`version_table`).

    ``detect(conn, prefix)`` reads the tables' shape: the newest revision of ``known`` whose
    tables are all there, or None. ``known`` are the revisions of the pre-Alembic era, each
    written to be applied again safely (it skips what is already there); while the version table
    holds one of them, or is missing, the shape decides the revision (a database made before
    Alembic is stamped; a table altered or restored behind Alembic's back is stamped back and
    upgraded again). Later revisions are trusted to the version table alone.
    """

    location: Path
    schema: str
    detect: Callable[[Connection, str], str | None]
    known: frozenset[str]


def version_table(prefix: str, schema: str) -> str:
    """The Alembic version table of ``schema`` (``registry``, ``usage``, ``batch``) under
    ``prefix``: ``<prefix>alembic_<schema>``, so histories and prefixes never share one."""
    return f"{prefix}alembic_{schema}"


def advisory_key(name: str) -> int:
    """The signed 64-bit Postgres advisory-lock key of ``name`` (its SHA-256's first 8 bytes)."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


def migration_prefix() -> str:
    """The table prefix of the migration running now (inside a revision's ``upgrade``)."""
    from alembic import op

    config = op.get_context().config
    if config is None or MIGRATION_PREFIX not in config.attributes:
        raise RuntimeError("no table prefix: run revisions through modelfleet.db.run_migrations")
    return str(config.attributes[MIGRATION_PREFIX])


def has_tables(conn: Connection, *names: str) -> bool:
    """True if every table of ``names`` exists."""
    found = inspect(conn)
    return all(found.has_table(name) for name in names)


def _lock(conn: Connection, name: str) -> None:
    """Open the migration's transaction holding the schema's write lock: a transaction-level
    advisory lock on Postgres, ``BEGIN IMMEDIATE`` (the file's write lock) on SQLite. A second
    process starting at the same time waits, then finds the schema at head."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": advisory_key(name)})
    elif conn.dialect.name == "sqlite":
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def run_migrations(engine: Engine, history: History, prefix: str, target: str = "heads",
                   downgrade: bool = False) -> list[str]:
    """Upgrade ``history``'s schema under ``prefix`` in ``engine``'s database to ``target``
    (default: head), or with ``downgrade`` down to it; returns the revisions reached. No
    alembic.ini, no env.py: the ``Config`` is built here, the prefix in its attributes.

    One transaction under :func:`_lock` (Postgres and SQLite both roll DDL back on error):
    while the version table is missing or holds a revision of ``history.known``, the shape read
    by ``history.detect`` is stamped first (see :class:`History`); then Alembic upgrades. A
    database at a revision this code does not know (newer code migrated it) is left alone,
    with a warning."""
    from alembic.config import Config
    from alembic.runtime.environment import EnvironmentContext
    from alembic.script import ScriptDirectory

    config = Config(attributes={MIGRATION_PREFIX: prefix})
    config.set_main_option("script_location", str(history.location).replace("%", "%%"))
    config.set_main_option("path_separator", "os")
    script = ScriptDirectory.from_config(config)
    table = version_table(prefix, history.schema)

    def steps(heads: Any, _context: Any) -> Any:
        if downgrade:
            return script._downgrade_revs(target, heads)
        return script._upgrade_revs(target, heads)

    with _MIGRATING, engine.connect() as conn:
        _lock(conn, table)
        with EnvironmentContext(config, script, fn=steps) as env:
            env.configure(connection=conn, version_table=table)
            context = env.get_context()
            recorded = context.get_current_heads()
            ours = {rev.revision for rev in script.walk_revisions()}
            if not set(recorded) <= ours:  # newer code migrated it (a rolled-back deploy)
                log.warning("%s tables with prefix %r are at %s, which this code does not know "
                            "(its head: %s): left as they are", history.schema, prefix,
                            list(recorded), script.get_current_head())
                return list(recorded)
            if set(recorded) <= history.known:
                found = history.detect(conn, prefix)
                if recorded != ((found,) if found else ()):
                    context.stamp(script, found or "base")
                    log.warning("%s tables with prefix %r: version table %s, tables' shape %s; "
                                "stamped %s", history.schema, prefix, list(recorded) or None,
                                found, found or "base")
            env.run_migrations()
            reached = list(context.get_current_heads())
        conn.commit()
    return reached


def drop_version_table(engine: Engine, prefix: str, schema: str) -> None:
    """Drop ``schema``'s version table under ``prefix`` if it is there (tests)."""
    Table(version_table(prefix, schema), MetaData()).drop(engine, checkfirst=True)

"""Usage rows in a SQL database through SQLAlchemy 2: SQLite by default, Postgres in production.

Two tables, named with a prefix (default ``mf_``) so that tests and other data never collide:

* ``<prefix>usage``: one row per (team, model, version, region, tier, minute) with the counters
  of :mod:`gateway_ext.metering.meter`; writing adds to an existing row (upsert ``ON CONFLICT DO
  UPDATE``).
* ``<prefix>usage_batches``: the id of every batch written, inserted in the same transaction as its
  rows, so writing a batch a second time (a spool replayed after a crash) adds nothing.

The tables are created and upgraded at start by their Alembic history
(:mod:`gateway_ext.metering.migrations`, version table ``<prefix>alembic_usage``); the
declarations here are the head revision's shape, for queries.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Engine,
    Integer,
    MetaData,
    String,
    Table,
    select,
)
from sqlalchemy.dialects import postgresql, sqlite

from gateway_ext.metering.meter import (
    COUNTERS,
    DEFAULT_TIER,
    UsageCounts,
    UsageKey,
    UsageRow,
    merge_rows,
)
from gateway_ext.metering.migrations import HISTORY
from modelfleet import db
from modelfleet.db import DEFAULT_TABLE_PREFIX, DEFAULT_URL, make_engine

KEY_COLUMNS = ("team", "model", "version", "region", "tier", "minute")


def _minute(epoch_s: int) -> datetime:
    return datetime.fromtimestamp(epoch_s, UTC)


def _epoch(value: datetime) -> int:
    return int((value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp())


class UsageStore:
    """The usage tables at ``url`` (a SQLAlchemy URL such as
    ``postgresql+psycopg://postgres@127.0.0.1:5432/test`` or ``sqlite:///usage.db``)."""

    def __init__(self, url: str = DEFAULT_URL, table_prefix: str = DEFAULT_TABLE_PREFIX,
                 connect_timeout_s: float = 3.0) -> None:
        self.engine: Engine = make_engine(url, connect_timeout_s)
        self.table_prefix = table_prefix
        self.metadata = MetaData()
        self.usage = Table(
            f"{table_prefix}usage", self.metadata,
            Column("team", String(63), primary_key=True),
            Column("model", String(63), primary_key=True),
            Column("version", String(63), primary_key=True),
            Column("region", String(63), primary_key=True),
            Column("tier", String(16), primary_key=True, server_default=DEFAULT_TIER),
            Column("minute", DateTime(timezone=True), primary_key=True),
            *(Column(name, BigInteger, nullable=False, default=0) for name in COUNTERS),
        )
        self.batches = Table(
            f"{table_prefix}usage_batches", self.metadata,
            Column("batch_id", String(64), primary_key=True),
            Column("rows", Integer, nullable=False),
            Column("written_at", DateTime(timezone=True), nullable=False),
        )

    def create_tables(self) -> None:
        """Bring both tables to head: create them in an empty database, stamp tables made
        before Alembic, upgrade older ones (a usage table from before tiers gets the ``tier``
        column and key; its rows read as :data:`~gateway_ext.metering.meter.DEFAULT_TIER`).
        Two processes starting together migrate once (:func:`modelfleet.db.run_migrations`)."""
        db.run_migrations(self.engine, HISTORY, self.table_prefix)

    def drop_tables(self) -> None:
        """Drop both tables and the version table (tests)."""
        self.metadata.drop_all(self.engine)
        db.drop_version_table(self.engine, self.table_prefix, HISTORY.schema)

    def dispose(self) -> None:
        """Close every pooled connection."""
        self.engine.dispose()

    def _insert(self, table: Table) -> Any:
        if self.engine.dialect.name == "postgresql":
            return postgresql.insert(table)
        return sqlite.insert(table)

    def write_batch(self, batch_id: str, rows: Sequence[UsageRow], now: float) -> bool:
        """Add ``rows`` to the usage table as batch ``batch_id`` at ``now`` (seconds since the
        epoch), in one transaction. False, and nothing written, if the batch was written before.

        Raises SQLAlchemy's errors when the database cannot be reached (the caller spools).
        """
        merged = merge_rows(list(rows))
        with self.engine.begin() as conn:
            mark = self._insert(self.batches).values(
                batch_id=batch_id, rows=len(merged), written_at=datetime.fromtimestamp(now, UTC))
            marked = mark.on_conflict_do_nothing().returning(self.batches.c.batch_id)
            if conn.execute(marked).first() is None:
                return False
            if not merged:
                return True
            values = [{"team": r.key.team, "model": r.key.model, "version": r.key.version,
                       "region": r.key.region, "tier": r.key.tier,
                       "minute": _minute(r.key.minute),
                       **{name: getattr(r.counts, name) for name in COUNTERS}} for r in merged]
            stmt = self._insert(self.usage).values(values)
            stmt = stmt.on_conflict_do_update(
                index_elements=list(KEY_COLUMNS),
                set_={name: self.usage.c[name] + stmt.excluded[name] for name in COUNTERS})
            conn.execute(stmt)
        return True

    def rows(self, team: str | None = None, model: str | None = None,
             since_s: float | None = None, tier: str | None = None) -> list[UsageRow]:
        """Usage rows sorted by key: every row, or those of ``team``/``model``/``tier`` whose
        minute starts at or after ``since_s`` (seconds since the epoch)."""
        query = select(self.usage)
        if tier is not None:
            query = query.where(self.usage.c.tier == tier)
        if team is not None:
            query = query.where(self.usage.c.team == team)
        if model is not None:
            query = query.where(self.usage.c.model == model)
        if since_s is not None:
            query = query.where(self.usage.c.minute >= _minute(int(since_s) // 60 * 60))
        with self.engine.connect() as conn:
            result = conn.execute(query).mappings().all()
        out = [UsageRow(UsageKey(r["team"], r["model"], r["version"], r["region"],
                                 _epoch(r["minute"]), r["tier"]),
                        UsageCounts(**{name: int(r[name]) for name in COUNTERS}))
               for r in result]
        return sorted(out, key=lambda row: row.key)

    def batch_ids(self) -> set[str]:
        """Ids of every batch written."""
        with self.engine.connect() as conn:
            return set(conn.execute(select(self.batches.c.batch_id)).scalars())

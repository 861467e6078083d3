"""The usage tables' Alembic history on SQLite and real Postgres: an empty database, tables made
before Alembic (today's shape, and the older one without ``tier``), a second start, two prefixes
in one database, a downgrade, and two processes starting together on one database."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Engine,
    Integer,
    MetaData,
    String,
    Table,
    event,
    insert,
    inspect,
    text,
)

from batch.store import BatchStore
from gateway_ext.metering.meter import UsageCounts, UsageKey, UsageRow
from gateway_ext.metering.migrations import HISTORY
from gateway_ext.metering.store import UsageStore
from modelfleet import db, testing

REPO = Path(__file__).resolve().parents[3]
T0 = 1_700_000_040  # a minute start
COUNTERS = ("prompt_tokens", "cached_tokens", "output_tokens", "requests", "rejected_429",
            "shed_503")


def key(tier: str, minute: int = T0) -> UsageKey:
    return UsageKey("search", "chat-7b", "v13", "us-east-1", minute, tier)


def pre_alembic_tables(prefix: str, tiered: bool) -> MetaData:
    """The usage tables as ``UsageStore.create_tables`` made them before Alembic: at HEAD~2
    (``tiered``), or before tiers (no ``tier`` column, key without it)."""
    md = MetaData()
    tier = [Column("tier", String(16), primary_key=True, server_default="standard")]
    Table(f"{prefix}usage", md,
          *(Column(c, String(63), primary_key=True) for c in ("team", "model", "version", "region")),
          *(tier if tiered else []),
          Column("minute", DateTime(timezone=True), primary_key=True),
          *(Column(name, BigInteger, nullable=False, default=0) for name in COUNTERS))
    Table(f"{prefix}usage_batches", md,
          Column("batch_id", String(64), primary_key=True),
          Column("rows", Integer, nullable=False),
          Column("written_at", DateTime(timezone=True), nullable=False))
    return md


def make_pre_alembic(url: str, prefix: str, tiered: bool) -> None:
    """Create the tables of :func:`pre_alembic_tables` with two rows and one batch id."""
    md = pre_alembic_tables(prefix, tiered)
    engine = db.make_engine(url, 3.0)
    md.create_all(engine)
    minute = datetime.fromtimestamp(T0, UTC)
    base = {"team": "search", "model": "chat-7b", "version": "v13", "region": "us-east-1",
            **({"tier": "batch"} if tiered else {})}
    with engine.begin() as conn:
        conn.execute(insert(md.tables[f"{prefix}usage"]), [
            {**base, "minute": minute, **dict(zip(COUNTERS, (7, 0, 3, 1, 0, 0), strict=True))},
            {**base, "minute": datetime.fromtimestamp(T0 + 60, UTC),
             **dict(zip(COUNTERS, (2, 1, 1, 1, 0, 0), strict=True))}])
        conn.execute(insert(md.tables[f"{prefix}usage_batches"]).values(
            batch_id="old-batch", rows=2, written_at=minute))
    engine.dispose()


def schema_diffs(store: UsageStore) -> list[Any]:
    """What Alembic's autogenerate finds between the declared tables and the database."""
    return testing.schema_diffs(store.engine, store.metadata)


def recorded(store: UsageStore) -> list[str]:
    return testing.recorded_revisions(store.engine, db.version_table(store.table_prefix, "usage"))


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A database URL and a table prefix of this test; its usage tables dropped after."""
    url, prefix = testing.migration_database(request, tmp_path, "usage")
    yield url, prefix
    store = UsageStore(url, prefix)
    store.drop_tables()
    store.dispose()


def test_an_empty_database_is_created_at_head(database: tuple[str, str]) -> None:
    store = UsageStore(*database)
    store.create_tables()
    assert recorded(store) == ["usage0002"]
    assert schema_diffs(store) == []
    row = UsageRow(key("batch"), UsageCounts(1, 0, 2, 1, 0, 0))
    assert store.write_batch("b1", [row], T0)
    assert store.rows() == [row]
    store.dispose()


def test_tables_made_before_alembic_are_stamped_and_keep_their_rows(
        database: tuple[str, str]) -> None:
    make_pre_alembic(*database, tiered=True)
    store = UsageStore(*database)
    store.create_tables()
    assert recorded(store) == ["usage0002"]
    assert schema_diffs(store) == []
    assert store.rows() == [UsageRow(key("batch"), UsageCounts(7, 0, 3, 1, 0, 0)),
                            UsageRow(key("batch", T0 + 60), UsageCounts(2, 1, 1, 1, 0, 0))]
    assert store.batch_ids() == {"old-batch"}
    store.dispose()


def test_a_usage_table_from_before_tiers_gets_tier_in_its_key(database: tuple[str, str]) -> None:
    make_pre_alembic(*database, tiered=False)
    store = UsageStore(*database)
    store.create_tables()
    assert recorded(store) == ["usage0002"]
    assert schema_diffs(store) == []
    assert store.rows(tier="standard") == [
        UsageRow(key("standard"), UsageCounts(7, 0, 3, 1, 0, 0)),
        UsageRow(key("standard", T0 + 60), UsageCounts(2, 1, 1, 1, 0, 0))]
    assert store.write_batch("new", [UsageRow(key("batch"), UsageCounts(5, 0, 5, 1, 0, 0))], T0)
    assert len(store.rows()) == 3 and store.batch_ids() == {"old-batch", "new"}
    assert inspect(store.engine).get_pk_constraint(f"{database[1]}usage")[
        "constrained_columns"] == ["team", "model", "version", "region", "tier", "minute"]
    store.dispose()


def writes(engine: Engine) -> Callable[[], list[str]]:
    """Start recording the statements that change a schema or rows; returns the reader."""
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if re.match(r"\s*(CREATE|ALTER|DROP|INSERT|UPDATE|DELETE)", statement, re.I):
            seen.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    return lambda: seen


def test_a_second_start_changes_nothing(database: tuple[str, str]) -> None:
    make_pre_alembic(*database, tiered=False)
    UsageStore(*database).create_tables()
    again = UsageStore(*database)
    seen = writes(again.engine)
    again.create_tables()
    assert seen() == []
    assert recorded(again) == ["usage0002"] and len(again.rows()) == 2
    again.dispose()


def test_two_prefixes_and_the_batch_history_share_one_database(
        database: tuple[str, str]) -> None:
    url, prefix = database
    first, second = UsageStore(url, prefix), UsageStore(url, prefix + "two_")
    batches = BatchStore(url, prefix)
    try:
        make_pre_alembic(url, prefix, tiered=False)
        first.create_tables()
        second.create_tables()
        batches.create_tables()
        assert recorded(first) == recorded(second) == ["usage0002"]
        assert len(first.rows()) == 2 and second.rows() == []
        with batches.engine.connect() as conn:
            assert conn.execute(text(
                f'SELECT version_num FROM "{prefix}alembic_batch"')).scalars().all() == [
                "batch0002"]
        second.drop_tables()
        assert not inspect(first.engine).has_table(db.version_table(prefix + "two_", "usage"))
        assert recorded(first) == ["usage0002"] and len(first.rows()) == 2
    finally:
        second.drop_tables()
        batches.drop_tables()
        for store in (first, second, batches):
            store.dispose()


def test_a_downgrade_sums_the_tiers_and_an_upgrade_splits_them_again(
        database: tuple[str, str]) -> None:
    store = UsageStore(*database)
    store.create_tables()
    store.write_batch("b", [UsageRow(key("batch"), UsageCounts(1, 0, 1, 1, 0, 0)),
                            UsageRow(key("standard"), UsageCounts(2, 0, 2, 1, 0, 0))], T0)
    assert db.run_migrations(store.engine, HISTORY, database[1], "usage0001",
                             downgrade=True) == ["usage0001"]
    columns = {c["name"] for c in inspect(store.engine).get_columns(f"{database[1]}usage")}
    assert "tier" not in columns
    store.create_tables()
    assert store.rows() == [UsageRow(key("standard"), UsageCounts(3, 0, 3, 2, 0, 0))]
    assert schema_diffs(store) == []
    store.dispose()


CHILD = """import sys
from gateway_ext.metering.store import UsageStore
store = UsageStore(sys.argv[1], sys.argv[2])
print("ready", flush=True)
store.create_tables()
store.dispose()
"""


def waiting_on_lock(engine: Engine, lock_key: int) -> int:
    """How many sessions wait for the advisory lock ``lock_key`` (Postgres)."""
    hi, lo = (lock_key >> 32) & 0xFFFFFFFF, lock_key & 0xFFFFFFFF
    with engine.connect() as conn:
        return int(conn.execute(text(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
            "AND classid::bigint = :hi AND objid::bigint = :lo AND objsubid = 1"),
            {"hi": hi, "lo": lo}).scalar_one())


def test_two_processes_starting_together_migrate_once(database: tuple[str, str]) -> None:
    """Both wait for the migration lock the test holds, then start at once: one migrates, the
    other finds the schema at head; neither fails, every row is kept."""
    url, prefix = database
    make_pre_alembic(url, prefix, tiered=False)
    engine = db.make_engine(url, 3.0)
    lock_key = db.advisory_key(db.version_table(prefix, "usage"))
    with engine.connect() as holder:
        if engine.dialect.name == "postgresql":
            holder.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": lock_key})
        else:
            holder.exec_driver_sql("BEGIN IMMEDIATE")
        children = [subprocess.Popen([sys.executable, "-c", CHILD, url, prefix], cwd=REPO,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                    for _ in range(2)]
        assert [c.stdout.readline().strip() for c in children if c.stdout] == ["ready"] * 2
        deadline = time.monotonic() + 60
        while engine.dialect.name == "postgresql" and waiting_on_lock(engine, lock_key) < 2:
            assert time.monotonic() < deadline, "the two starts never waited for the lock"
            time.sleep(0.02)
        holder.rollback()
    outs = [c.communicate(timeout=120) for c in children]
    assert [c.returncode for c in children] == [0, 0], outs
    engine.dispose()
    store = UsageStore(url, prefix)
    assert recorded(store) == ["usage0002"] and len(store.rows(tier="standard")) == 2
    store.dispose()

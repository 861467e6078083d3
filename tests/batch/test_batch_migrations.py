"""The batch tables' Alembic history on SQLite and real Postgres: an empty database, tables made
before Alembic (HEAD~2's shape, the only one released) with rows that survive, a second start,
two prefixes in one database, a downgrade, and two processes starting together."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import (
    Column,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    event,
    insert,
    inspect,
)

from batch.migrations import HISTORY
from batch.models import BatchStatus, LineCounts
from batch.store import BatchStore
from batch.uploads import UploadStore
from modelfleet import db, testing

REPO = Path(__file__).resolve().parents[2]
NOW = 1_800_000_000.0
HEAD = "batch0002"


def pre_alembic_tables(prefix: str) -> MetaData:
    """The batch tables as ``BatchStore.create_tables`` made them before Alembic (HEAD~2)."""
    md = MetaData()
    Table(f"{prefix}batches", md,
          Column("batch_id", String(64), primary_key=True),
          Column("team", String(63), nullable=False, index=True),
          Column("model", String(127), nullable=False),
          Column("endpoint", String(64), nullable=False),
          Column("input_uri", Text, nullable=False), Column("output_uri", Text, nullable=False),
          Column("status", String(16), nullable=False, index=True),
          Column("deadline", Float, nullable=False), Column("created_at", Float, nullable=False),
          *(Column(name, Float, nullable=True) for name in (
              "in_progress_at", "finalizing_at", "completed_at", "failed_at", "expired_at",
              "cancelling_at", "cancelled_at", "output_written_at")),
          Column("errors", Text, nullable=False, default="[]"),
          Column("metadata", Text, nullable=False, default="{}"),
          Column("deadline_risk", String(16), nullable=True),
          Column("tier", String(16), nullable=False, default="batch"),
          Column("paused_until", Float, nullable=True),
          Column("throttled", Integer, nullable=False, default=0),
          Column("lease_owner", String(255), nullable=True),
          Column("lease_until", Float, nullable=True))
    Table(f"{prefix}batch_lines", md,
          Column("batch_id", String(64), primary_key=True),
          Column("line_no", Integer, primary_key=True),
          Column("custom_id", String(512), nullable=True),
          Column("state", String(16), nullable=False),
          Column("request", Text, nullable=True), Column("result", Text, nullable=True),
          Column("attempts", Integer, nullable=False, default=0),
          Column("updated_at", Float, nullable=False),
          Index(f"ix_{prefix}batch_lines_state", "batch_id", "state"))
    return md


def make_pre_alembic(url: str, prefix: str) -> None:
    """Create the tables of :func:`pre_alembic_tables` with one batch of three lines."""
    md = pre_alembic_tables(prefix)
    engine = db.make_engine(url, 3.0)
    md.create_all(engine)
    with engine.begin() as conn:
        conn.execute(insert(md.tables[f"{prefix}batches"]).values(
            batch_id="batch_old", team="research", model="chat-7b",
            endpoint="/v1/chat/completions", input_uri="file:///d/in.jsonl",
            output_uri="file:///d/out.jsonl", status="in_progress", deadline=NOW + 3600,
            created_at=NOW, in_progress_at=NOW + 1, metadata='{"k": "v"}'))
        conn.execute(insert(md.tables[f"{prefix}batch_lines"]), [
            {"batch_id": "batch_old", "line_no": i, "custom_id": f"c{i}", "updated_at": NOW,
             "state": "done" if i == 0 else "pending", "request": "{}"} for i in range(3)])
    engine.dispose()


def schema_diffs(store: BatchStore) -> list[Any]:
    """What Alembic's autogenerate finds between the declared tables and the database."""
    return testing.schema_diffs(store.engine, store.metadata)


def recorded(store: BatchStore) -> list[str]:
    return testing.recorded_revisions(store.engine, db.version_table(store.table_prefix, "batch"))


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A database URL and a table prefix of this test; its batch tables dropped after."""
    url, prefix = testing.migration_database(request, tmp_path, "batches")
    yield url, prefix
    store = BatchStore(url, prefix)
    store.drop_tables()
    store.dispose()


def test_an_empty_database_is_created_at_head(database: tuple[str, str]) -> None:
    store = BatchStore(*database)
    store.create_tables()
    assert recorded(store) == [HEAD]
    assert schema_diffs(store) == []
    store.dispose()


def test_tables_made_before_alembic_are_stamped_and_keep_their_rows(
        database: tuple[str, str]) -> None:
    make_pre_alembic(*database)
    store = BatchStore(*database)
    store.create_tables()
    assert recorded(store) == [HEAD]
    assert schema_diffs(store) == []
    record = store.get("batch_old", "research")
    assert record is not None and record.status is BatchStatus.IN_PROGRESS
    assert record.metadata == {"k": "v"} and record.errors == []
    assert store.counts("batch_old") == LineCounts.of({"done": 1, "pending": 2})
    store.dispose()


def test_uploads_made_before_alembic_keep_their_rows(database: tuple[str, str]) -> None:
    url, prefix = database
    make_pre_alembic(url, prefix)
    old = MetaData()  # the files table as UploadStore created it before Alembic
    files = Table(f"{prefix}files", old,
                  Column("file_id", String(64), primary_key=True),
                  Column("team", String(63), nullable=False, index=True),
                  Column("filename", String(255), nullable=False),
                  Column("purpose", String(32), nullable=False),
                  Column("bytes", Integer, nullable=False),
                  Column("created_at", Float, nullable=False), Column("uri", Text, nullable=False))
    engine = db.make_engine(url, 3.0)
    old.create_all(engine)
    with engine.begin() as conn:
        assert HISTORY.detect(conn, prefix) == "batch0002"
        conn.execute(insert(files).values(file_id="file-1", team="research", filename="in.jsonl",
                                          purpose="batch", bytes=10, created_at=NOW,
                                          uri="file:///d/in.jsonl"))
    engine.dispose()
    store = BatchStore(url, prefix)
    store.create_tables()
    assert recorded(store) == [HEAD] and schema_diffs(store) == []
    uploads = UploadStore(store.engine, prefix)
    got = uploads.get("file-1", "research")
    assert got is not None and got.bytes == 10 and uploads.get("file-1", "search") is None
    store.dispose()


def test_tables_before_uploads_existed_gain_the_files_table(database: tuple[str, str]) -> None:
    url, prefix = database
    make_pre_alembic(url, prefix)
    engine = db.make_engine(url, 3.0)
    with engine.connect() as conn:
        assert HISTORY.detect(conn, prefix) == "batch0001"
    engine.dispose()
    store = BatchStore(url, prefix)
    store.create_tables()
    assert inspect(store.engine).has_table(f"{prefix}files")
    assert recorded(store) == [HEAD] and schema_diffs(store) == []
    store.dispose()


def test_a_second_start_changes_nothing(database: tuple[str, str]) -> None:
    make_pre_alembic(*database)
    BatchStore(*database).create_tables()
    again = BatchStore(*database)
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if re.match(r"\s*(CREATE|ALTER|DROP|INSERT|UPDATE|DELETE)", statement, re.I):
            seen.append(statement)

    event.listen(again.engine, "before_cursor_execute", record)
    again.create_tables()
    assert seen == [] and recorded(again) == [HEAD]
    again.dispose()


def test_two_prefixes_share_one_database(database: tuple[str, str]) -> None:
    url, prefix = database
    first, second = BatchStore(url, prefix), BatchStore(url, prefix + "two_")
    try:
        make_pre_alembic(url, prefix)
        first.create_tables()
        second.create_tables()
        assert recorded(first) == recorded(second) == [HEAD]
        assert first.get("batch_old") is not None and second.get("batch_old") is None
        second.drop_tables()
        assert not inspect(first.engine).has_table(db.version_table(prefix + "two_", "batch"))
        assert recorded(first) == [HEAD] and schema_diffs(first) == []
    finally:
        second.drop_tables()
        first.dispose()
        second.dispose()


def test_a_downgrade_to_base_drops_the_tables(database: tuple[str, str]) -> None:
    store = BatchStore(*database)
    store.create_tables()
    assert db.run_migrations(store.engine, HISTORY, database[1], "base", downgrade=True) == []
    assert not inspect(store.engine).has_table(f"{database[1]}batches")
    store.create_tables()
    assert recorded(store) == [HEAD] and schema_diffs(store) == []
    store.dispose()


CHILD = """import sys
from batch.store import BatchStore
from batch.uploads import UploadStore
store = BatchStore(sys.argv[1], sys.argv[2])
store.create_tables()
store.dispose()
"""


def test_two_services_starting_together_on_tables_made_before_alembic(
        database: tuple[str, str]) -> None:
    url, prefix = database
    make_pre_alembic(url, prefix)
    children = [subprocess.Popen([sys.executable, "-c", CHILD, url, prefix], cwd=REPO,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for _ in range(2)]
    outs = [c.communicate(timeout=120) for c in children]
    assert [c.returncode for c in children] == [0, 0], outs
    store = BatchStore(url, prefix)
    assert recorded(store) == [HEAD] and store.counts("batch_old").total == 3
    store.dispose()

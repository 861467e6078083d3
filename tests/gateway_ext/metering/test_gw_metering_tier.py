"""Metering by tier: rows keyed by tier too, tier through the gateway's decision, old spool lines
and old usage tables (no ``tier`` column) migrated on SQLite and real Postgres."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from gateway_ext.metering.meter import UsageCounts, UsageKey, UsageMeter, UsageRow
from gateway_ext.metering.spool import UsageSpool
from gateway_ext.metering.store import UsageStore

T0 = 1_700_000_040  # a minute start


def key(tier: str) -> UsageKey:
    return UsageKey("search", "chat-7b", "v13", "us-east-1", T0, tier)


def test_rows_of_one_minute_are_kept_apart_by_tier() -> None:
    meter = UsageMeter("us-east-1")
    meter.record_usage("search", "chat-7b", "v13", T0, 100, 0, 10, tier="batch")
    meter.record_usage("search", "chat-7b", "v13", T0 + 1, 200, 0, 20, tier="interactive")
    meter.record_usage("search", "chat-7b", "v13", T0 + 2, 300, 0, 30)
    meter.record_shed("search", "chat-7b", T0 + 3, "v13", "batch")
    rows = {r.key: r.counts for r in meter.drain()}
    assert rows == {key("batch"): UsageCounts(100, 0, 10, 1, 0, 1),
                    key("interactive"): UsageCounts(200, 0, 20, 1, 0, 0),
                    key("standard"): UsageCounts(300, 0, 30, 1, 0, 0)}


def test_a_spool_line_from_before_tiers_reads_as_standard(tmp_path: Path) -> None:
    spool = UsageSpool(tmp_path / "spool.jsonl")
    old = {"team": "search", "model": "chat-7b", "version": "v13", "region": "us-east-1",
           "minute": T0, "prompt_tokens": 1, "cached_tokens": 0, "output_tokens": 2,
           "requests": 1, "rejected_429": 0, "shed_503": 0}
    spool.path.write_text(json.dumps({"batch_id": "old", "rows": [old]}) + "\n")
    [batch] = spool.batches()
    assert batch.rows[0].key == key("standard")


OLD_TABLE = """CREATE TABLE {t} (team VARCHAR(63) NOT NULL, model VARCHAR(63) NOT NULL,
 version VARCHAR(63) NOT NULL, region VARCHAR(63) NOT NULL, minute TIMESTAMP{tz} NOT NULL,
 prompt_tokens BIGINT NOT NULL, cached_tokens BIGINT NOT NULL, output_tokens BIGINT NOT NULL,
 requests BIGINT NOT NULL, rejected_429 BIGINT NOT NULL, shed_503 BIGINT NOT NULL,
 PRIMARY KEY (team, model, version, region, minute))"""


@pytest.fixture(params=["sqlite", "postgres"])
def old_db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A database URL and prefix holding a usage table as created before tiers, with one row."""
    if request.param == "postgres":
        url, prefix = request.getfixturevalue("postgres_url"), request.getfixturevalue(
            "table_prefix")
        tz = " WITH TIME ZONE"
    else:
        url, prefix, tz = f"sqlite:///{tmp_path / 'old.db'}", "mf_", ""
    engine = create_engine(url)
    minute: object = datetime.fromtimestamp(T0, UTC)
    if request.param == "sqlite":  # as SQLAlchemy's DateTime stores it there
        minute = datetime.fromtimestamp(T0, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    with engine.begin() as conn:
        conn.execute(text(OLD_TABLE.format(t=f"{prefix}usage", tz=tz)))
        conn.execute(text(f"INSERT INTO {prefix}usage VALUES ('search', 'chat-7b', 'v13', "
                          "'us-east-1', :m, 7, 0, 3, 1, 0, 0)"), {"m": minute})
    engine.dispose()
    yield url, prefix
    store = UsageStore(url, prefix)
    store.drop_tables()
    store.dispose()


def test_an_old_usage_table_is_migrated_at_start(old_db: tuple[str, str]) -> None:
    url, prefix = old_db
    store = UsageStore(url, prefix)
    store.create_tables()  # what the gateway does at start
    assert store.rows() == [UsageRow(key("standard"), UsageCounts(7, 0, 3, 1, 0, 0))]
    batch = UsageRow(key("batch"), UsageCounts(5, 0, 5, 1, 0, 0))
    standard = UsageRow(key("standard"), UsageCounts(1, 0, 1, 1, 0, 0))
    assert store.write_batch("after", [batch, standard], T0 + 5)
    assert store.rows() == [UsageRow(key("batch"), UsageCounts(5, 0, 5, 1, 0, 0)),
                            UsageRow(key("standard"), UsageCounts(8, 0, 4, 2, 0, 0))]
    assert store.rows(tier="batch") == [batch]
    store.create_tables()  # a second start changes nothing
    assert len(store.rows()) == 2
    store.dispose()


def test_a_sqlite_usage_file_is_shared_in_wal_mode(tmp_path: Path) -> None:
    """The local stack's gateway and batch service write the same file: WAL and a busy timeout."""
    store = UsageStore(f"sqlite:///{tmp_path / 'usage.db'}")
    store.create_tables()
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert int(conn.exec_driver_sql("PRAGMA busy_timeout").scalar() or 0) >= 10_000
    store.dispose()

"""Metering: per-minute aggregation, the usage store's upsert (SQLite and real Postgres), and the
spool that keeps rows through a database outage and writes them exactly once."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway_ext.metering.meter import UsageCounts, UsageKey, UsageMeter, UsageRow, merge_rows
from gateway_ext.metering.spool import Batch, UsageFlusher, UsageSpool
from gateway_ext.metering.store import UsageStore

T0 = 1_700_000_040.0  # 1_700_000_040 is a minute start


@pytest.fixture
def pg_store(postgres_url: str, table_prefix: str) -> Iterator[UsageStore]:
    store = UsageStore(postgres_url, table_prefix=table_prefix)
    store.create_tables()
    yield store
    store.drop_tables()
    store.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[UsageStore]:
    if request.param == "postgres":
        yield request.getfixturevalue("pg_store")
        return
    store = UsageStore(f"sqlite:///{tmp_path / 'usage.db'}")
    store.create_tables()
    yield store
    store.dispose()


def record_some(meter: UsageMeter, now: float) -> None:
    meter.record_usage("search", "chat-7b", "v13", now, 1200, 800, 300)
    meter.record_usage("search", "chat-7b", "v13", now + 1, 100, 0, 50)
    meter.record_usage("search", "chat-7b", "v14", now + 2, 10, 0, 5)
    meter.record_rejected("support", "chat-7b", now + 3)
    meter.record_shed("support", "chat-7b", now + 4, version="v13")


def key(team: str, version: str, minute: float = T0) -> UsageKey:
    return UsageKey(team, "chat-7b", version, "us-east-1", int(minute))


def test_the_meter_aggregates_per_team_model_version_region_and_minute() -> None:
    meter = UsageMeter("us-east-1")
    record_some(meter, T0)
    meter.record_usage("search", "chat-7b", "v13", T0 + 60, 1, 0, 1)  # next minute
    rows = meter.drain()
    assert rows == [
        UsageRow(key("search", "v13"), UsageCounts(1300, 800, 350, 2, 0, 0)),
        UsageRow(key("search", "v13", T0 + 60), UsageCounts(1, 0, 1, 1, 0, 0)),
        UsageRow(key("search", "v14"), UsageCounts(10, 0, 5, 1, 0, 0)),
        UsageRow(key("support", "-"), UsageCounts(0, 0, 0, 0, 1, 0)),
        UsageRow(key("support", "v13"), UsageCounts(0, 0, 0, 0, 0, 1)),
    ]
    assert meter.drain() == [] and meter.pending() == 0
    assert [UsageRow.from_json(r.to_json()) for r in rows] == rows


def test_the_store_adds_to_existing_rows_and_writes_a_batch_once(any_store: UsageStore) -> None:
    meter = UsageMeter("us-east-1")
    record_some(meter, T0)
    first = meter.drain()
    record_some(meter, T0 + 10)
    second = meter.drain()
    assert any_store.write_batch("batch-1", first, T0 + 20)
    assert any_store.write_batch("batch-2", second, T0 + 30)
    assert not any_store.write_batch("batch-2", second, T0 + 40)  # replayed: nothing added
    assert any_store.rows() == merge_rows(first + second)
    assert any_store.batch_ids() == {"batch-1", "batch-2"}


def test_postgres_rows_match_what_was_recorded_through_the_flusher(pg_store: UsageStore,
                                                                   tmp_path: Path) -> None:
    meter, expected = UsageMeter("us-east-1"), UsageMeter("us-east-1")
    flusher = UsageFlusher(meter, pg_store, UsageSpool(tmp_path / "spool.jsonl"))
    for step in range(3):
        for m in (meter, expected):
            record_some(m, T0 + 50 * step)
        result = flusher.flush(T0 + 50 * step + 5)
        assert (result.written, result.pending) == (1, 0)
    assert pg_store.rows() == expected.drain()
    assert not (tmp_path / "spool.jsonl").exists()


def test_an_outage_spools_rows_and_writes_them_exactly_once_later(
        postgres_url: str, pg_store: UsageStore, table_prefix: str, tmp_path: Path) -> None:
    spool = UsageSpool(tmp_path / "spool.jsonl")
    meter, expected = UsageMeter("us-east-1"), UsageMeter("us-east-1")
    ids = (f"b{i}" for i in itertools.count())
    down = UsageStore(postgres_url.replace(":5432/", ":1/"), table_prefix=table_prefix,
                      connect_timeout_s=1)
    flusher = UsageFlusher(meter, down, spool, lambda: next(ids))
    for step in range(2):
        for m in (meter, expected):
            record_some(m, T0 + step)
        result = flusher.flush(T0 + step)
        assert (result.written, result.pending, result.rows) == (0, step + 1, 4)
    assert [b.batch_id for b in spool.batches()] == ["b0", "b1"]
    assert pg_store.rows() == []
    down.dispose()

    # a restart with the URL fixed: a new flusher finds the batches in the spool file
    flusher = UsageFlusher(meter, pg_store, UsageSpool(spool.path), lambda: next(ids))
    for m in (meter, expected):
        record_some(m, T0 + 2)
    result = flusher.flush(T0 + 3)
    assert (result.written, result.skipped, result.pending) == (3, 0, 0)
    recorded = expected.drain()
    assert pg_store.rows() == recorded
    assert spool.batches() == []
    assert flusher.flush(T0 + 4).written == 0
    assert pg_store.rows() == recorded  # nothing counted twice


def test_a_batch_written_before_a_crash_is_not_counted_again(pg_store: UsageStore,
                                                              tmp_path: Path) -> None:
    spool = UsageSpool(tmp_path / "spool.jsonl")
    meter = UsageMeter("us-east-1")
    record_some(meter, T0)
    rows = tuple(meter.drain())
    spool.append(Batch("crashed", rows))
    assert pg_store.write_batch("crashed", rows, T0)  # written; the spool was never trimmed
    result = UsageFlusher(UsageMeter("us-east-1"), pg_store, spool).flush(T0 + 1)
    assert (result.written, result.skipped, result.pending) == (0, 1, 0)
    assert pg_store.rows() == list(rows)


def test_a_torn_spool_line_is_dropped(tmp_path: Path) -> None:
    spool = UsageSpool(tmp_path / "spool.jsonl")
    meter = UsageMeter("local")
    record_some(meter, T0)
    spool.append(Batch("ok", tuple(meter.drain())))
    with spool.path.open("a") as f:
        f.write('{"batch_id": "torn", "rows": [{"team"')
    assert [b.batch_id for b in spool.batches()] == ["ok"]


def test_only_sql_databases_it_knows() -> None:
    with pytest.raises(ValueError):
        UsageStore("mysql://localhost/x")

"""The batch tables on SQLite and real Postgres: team scoping, leases, one result per line,
status transitions that do not overwrite each other, and the output in input order."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from batch.lines import LineError, ParsedLine
from batch.models import BatchRecord, BatchStatus, LineCounts, LineState
from batch.store import BatchStore, LineResult

NOW = 1_800_000_000.0


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path, table_prefix: str) -> Iterator[BatchStore]:
    if request.param == "postgres":
        url = request.getfixturevalue("postgres_url")
    else:
        url = f"sqlite:///{tmp_path / 'batches.db'}"
    s = BatchStore(url, table_prefix)
    s.create_tables()
    yield s
    s.drop_tables()
    s.dispose()


def batch(batch_id: str = "batch_1", team: str = "research", created: float = NOW) -> BatchRecord:
    return BatchRecord(batch_id=batch_id, team=team, model="chat-7b",
                       input_uri="file:///d/in.jsonl", output_uri="file:///d/out.jsonl",
                       deadline=created + 3600, created_at=created, metadata={"k": "v"})


def lines(n: int, bad: tuple[int, ...] = ()) -> list[ParsedLine]:
    return [ParsedLine(i, f"c{i}", None, LineError("invalid_json", "no")) if i in bad else
            ParsedLine(i, f"c{i}", {"model": "chat-7b", "messages": [], "n": i})
            for i in range(1, n + 1)]


def done(line_no: int, text: str = "ok") -> LineResult:
    return LineResult(line_no, LineState.DONE, {"custom_id": f"c{line_no}", "text": text}, 1)


def test_a_batch_is_visible_to_its_team_only(store: BatchStore) -> None:
    store.insert(batch())
    store.insert(batch("batch_2", created=NOW + 1))
    store.insert(batch("batch_3", team="support"))
    got = store.get("batch_1", "research")
    assert got is not None and got.metadata == {"k": "v"} and got.status is BatchStatus.VALIDATING
    assert store.get("batch_1", "support") is None
    assert store.request_cancel("batch_1", "support", NOW) is None
    assert [b.batch_id for b in store.list_team("research")] == ["batch_2", "batch_1"]
    assert [b.batch_id for b in store.list_team("research", after="batch_2")] == ["batch_1"]


def test_a_lease_keeps_other_workers_out_until_it_runs_out(store: BatchStore) -> None:
    store.insert(batch())
    first = store.claim("w1", NOW, lease_s=10)
    assert first is not None and first.lease_owner == "w1"
    assert store.claim("w2", NOW + 5, lease_s=10) is None
    assert store.claim("w1", NOW + 5, lease_s=10) is not None  # the same worker, restarted
    assert store.renew("batch_1", "w1", NOW + 8, 10, tier="standard", throttled=3)
    assert store.claim("w2", NOW + 15, lease_s=10) is None  # renewed until NOW + 18
    taken = store.claim("w2", NOW + 19, lease_s=10)
    assert taken is not None and taken.tier == "standard" and taken.throttled == 3
    assert not store.renew("batch_1", "w1", NOW + 20, 10)  # w1 learns it lost the batch
    store.release("batch_1", "w2")
    assert store.claim("w3", NOW + 21, lease_s=10) is not None
    assert store.claim("w4", NOW + 22, lease_s=10, skip=()) is None


def test_lines_start_in_one_step_and_each_keeps_its_first_result(store: BatchStore) -> None:
    store.insert(batch())
    store.claim("w1", NOW, 10)
    assert not store.start("batch_1", "w2", lines(3), NOW)  # not the lease holder
    assert store.counts("batch_1") == LineCounts()
    assert store.start("batch_1", "w1", lines(5, bad=(2,)), NOW)
    assert not store.start("batch_1", "w1", lines(5), NOW)  # not validating any more
    assert store.counts("batch_1") == LineCounts(5, 0, 1, 4, 0)
    assert [p.line_no for p in store.pending("batch_1")] == [1, 3, 4, 5]
    assert [p.line_no for p in store.pending("batch_1", after_line_no=3, limit=1)] == [4]
    assert store.record("batch_1", [done(1), done(3)], NOW) == 2
    assert store.record("batch_1", [done(1, "again"), done(4)], NOW) == 1  # line 1 is kept
    assert store.close_pending("batch_1", LineState.EXPIRED, "batch_expired", "late", NOW) == 1
    assert store.counts("batch_1") == LineCounts(5, 3, 1, 0, 1)
    out = [json.loads(x) for x in store.output("batch_1")]
    assert [o.get("custom_id") for o in out] == ["c1", "c2", "c3", "c4", "c5"]
    assert out[0]["text"] == "ok" and out[1]["error"]["code"] == "invalid_json"
    assert out[4]["error"] == {"code": "batch_expired", "message": "late", "line": 5}


def test_a_cancel_and_the_worker_never_overwrite_each_other(store: BatchStore) -> None:
    store.insert(batch())
    store.claim("w1", NOW, 10)
    store.start("batch_1", "w1", lines(2), NOW)
    cancelling = store.request_cancel("batch_1", "research", NOW + 1)
    assert cancelling is not None and cancelling.status is BatchStatus.CANCELLING
    assert cancelling.cancelling_at == NOW + 1
    assert not store.transition("batch_1", (BatchStatus.IN_PROGRESS,), BatchStatus.FINALIZING,
                                NOW + 2, "w1")  # the worker's finish loses to the cancel
    assert not store.transition("batch_1", (BatchStatus.CANCELLING,), BatchStatus.CANCELLED,
                                NOW + 2, "w2")  # only the lease holder ends it
    assert store.transition("batch_1", (BatchStatus.CANCELLING,), BatchStatus.CANCELLED,
                            NOW + 3, "w1", output_written_at=NOW + 3)
    final = store.get("batch_1")
    assert final is not None and final.cancelled_at == NOW + 3 == final.output_written_at
    again = store.request_cancel("batch_1", "research", NOW + 4)
    assert again is not None and again.status is BatchStatus.CANCELLED  # nothing changes
    assert store.claim("w1", NOW + 100, 10) is None  # final batches are never claimed


def test_a_failed_batch_keeps_its_errors(store: BatchStore) -> None:
    store.insert(batch())
    store.claim("w1", NOW, 10)
    error = {"code": "input_not_found", "message": "gone", "param": "input_uri", "line": None}
    assert store.transition("batch_1", (BatchStatus.VALIDATING,), BatchStatus.FAILED, NOW, "w1",
                            errors=[error])
    got = store.get("batch_1")
    assert got is not None and got.errors == [error] and got.failed_at == NOW

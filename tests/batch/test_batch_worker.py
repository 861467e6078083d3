"""The batch worker in process against a fake gateway (httpx's MockTransport): it pauses for
Retry-After on 429/503, retries transient failures, keeps final answers, expires at the
deadline with partial results, raises urgency only where allowed, stops on cancel, and resumes
after a stop with one result per line."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from batch.context import RunContext
from batch.files import BatchFiles
from batch.metrics import make_batch_metrics
from batch.models import BatchRecord, BatchStatus
from batch.settings import BatchSettings
from batch.store import BatchStore
from batch.worker import BatchWorker
from modelfleet.config import Tier
from modelfleet.contract.headers import PRIORITY_HEADER

Handler = Callable[[dict[str, Any], "Seen"], Awaitable[httpx.Response]]


@dataclass
class Seen:
    """Requests the fake gateway received: (time sent, custom id from the prompt, tier)."""

    requests: list[tuple[float, str, str]] = field(default_factory=list)

    def count(self, cid: str) -> int:
        return sum(1 for _, c, _ in self.requests if c == cid)


def ok(body: dict[str, Any]) -> httpx.Response:
    cid = body["messages"][0]["content"]
    return httpx.Response(200, json={"id": f"chatcmpl-{cid}", "object": "chat.completion",
                                     "choices": [{"message": {"content": f"answer {cid}"}}]})


@dataclass
class Rig:
    store: BatchStore
    settings: BatchSettings
    data: Path
    seen: Seen
    handler: Handler
    tiers: tuple[Tier, ...] = ("standard", "batch")

    def batch(self, n: int, deadline_s: float = 3600.0, bid: str = "batch_t",
              team: str = "research", extra: list[str] | None = None) -> BatchRecord:
        lines = [json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions",
                             "body": {"messages": [{"role": "user", "content": f"c{i}"}],
                                      "max_tokens": 4}}) for i in range(n)] + (extra or [])
        (self.data / f"{bid}.jsonl").write_text("\n".join(lines) + "\n")
        now = time.time()
        record = BatchRecord(batch_id=bid, team=team, model="chat-7b",
                             input_uri=(self.data / f"{bid}.jsonl").as_uri(),
                             output_uri=(self.data / f"{bid}.out.jsonl").as_uri(),
                             deadline=now + deadline_s, created_at=now)
        self.store.insert(record)
        return record

    def worker(self, worker_id: str = "w1") -> BatchWorker:
        async def route(request: httpx.Request) -> httpx.Response:
            body = json.loads(request.content)
            self.seen.requests.append((time.time(), body["messages"][0]["content"],
                                       request.headers[PRIORITY_HEADER]))
            assert request.headers["authorization"] == "Bearer key-research"
            return await self.handler(body, self.seen)

        client = httpx.AsyncClient(transport=httpx.MockTransport(route), base_url="http://envoy/v1/")
        settings = self.settings.model_copy(update={"worker_id": worker_id})
        ctx = RunContext(self.store, BatchFiles([self.data]), settings, client,
                         {"research": "key-research"}, lambda team, model: self.tiers,
                         make_batch_metrics(CollectorRegistry()), time.time, random.Random(1))
        return BatchWorker(ctx)

    async def run_until(self, done: Callable[[BatchRecord], bool], worker_id: str = "w1",
                        timeout_s: float = 10.0, during: Callable[[], None] | None = None
                        ) -> BatchRecord:
        stop = asyncio.Event()
        task = asyncio.create_task(self.worker(worker_id).run(stop))
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                record = self.store.get("batch_t")
                assert record is not None
                if done(record):
                    return record
                assert time.monotonic() < deadline, f"stuck at {record.status}"
                if during is not None:
                    during()
                await asyncio.sleep(0.02)
        finally:
            stop.set()
            await task

    def output(self) -> list[dict[str, Any]]:
        text = (self.data / "batch_t.out.jsonl").read_text()
        return [json.loads(line) for line in text.splitlines()]


def final(record: BatchRecord) -> bool:
    return record.status in (BatchStatus.COMPLETED, BatchStatus.FAILED, BatchStatus.EXPIRED,
                             BatchStatus.CANCELLED)


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    store = BatchStore(f"sqlite:///{tmp_path / 'b.db'}", "t_")
    store.create_tables()
    settings = BatchSettings.from_env({}, concurrency=4, poll_interval_s=0.05, lease_s=5,
                                      max_attempts=2, file_roots=[tmp_path])

    async def answer(body: dict[str, Any], seen: Seen) -> httpx.Response:
        return ok(body)
    return Rig(store, settings, tmp_path, Seen(), answer)


async def test_throttled_lines_wait_for_retry_after_then_run(rig: Rig) -> None:
    refused: list[float] = []

    async def busy_then_idle(body: dict[str, Any], seen: Seen) -> httpx.Response:
        if len(seen.requests) <= 3:
            refused.append(time.time())
            return httpx.Response(503, headers={"retry-after-ms": "300", "retry-after": "1"},
                                  json={"error": {"code": "pool_overloaded"}})
        return ok(body)
    rig.handler = busy_then_idle
    rig.batch(12)
    record = await rig.run_until(final)
    assert record.status is BatchStatus.COMPLETED and record.throttled == 3
    resumed = [t for t, _, _ in rig.seen.requests[4:]]  # after the first window of 4
    assert resumed and min(resumed) >= refused[0] + 0.3  # nothing sent during the pause
    out = rig.output()
    assert [o["custom_id"] for o in out] == [f"c{i}" for i in range(12)]
    assert all(o["response"]["status_code"] == 200 for o in out)
    assert out[0]["response"]["request_id"] == "chatcmpl-c0"
    assert {tier for _, _, tier in rig.seen.requests} == {"batch"}


async def test_transient_failures_are_retried_and_final_answers_kept(rig: Rig) -> None:
    async def mixed(body: dict[str, Any], seen: Seen) -> httpx.Response:
        cid = body["messages"][0]["content"]
        if cid == "c0" and seen.count("c0") == 1:
            return httpx.Response(502, json={"error": {"code": "upstream_reset"}})
        if cid == "c1":
            return httpx.Response(400, json={"error": {"code": "invalid_request",
                                                       "param": "max_tokens"}})
        if cid == "c2":
            return httpx.Response(500, text="boom")
        if cid == "c3":
            raise httpx.ReadTimeout("sent, never answered")
        return ok(body)
    rig.handler = mixed
    rig.batch(5, extra=["{broken"])
    record = await rig.run_until(final)
    assert record.status is BatchStatus.COMPLETED  # bad lines never fail a batch
    counts = rig.store.counts("batch_t")
    assert (counts.total, counts.completed, counts.failed) == (6, 2, 4)
    out = {o["custom_id"] or "line6": o for o in rig.output()}
    assert out["c0"]["response"]["status_code"] == 200 and rig.seen.count("c0") == 2
    assert out["c1"]["response"] == {"status_code": 400, "request_id": None, "body": {
        "error": {"code": "invalid_request", "param": "max_tokens"}}}
    assert rig.seen.count("c1") == 1  # a 400 is final: not sent again
    assert out["c2"]["response"]["body"] == "boom" and rig.seen.count("c2") == 2  # max_attempts
    assert out["c3"]["error"]["code"] == "request_failed" and out["c3"]["response"] is None
    assert out["line6"]["error"]["code"] == "invalid_json"


async def test_an_unreachable_api_pauses_the_batch_without_failing_lines(rig: Rig) -> None:
    async def down_then_up(body: dict[str, Any], seen: Seen) -> httpx.Response:
        if len(seen.requests) <= 2:
            raise httpx.ConnectError("connection refused")
        return ok(body)
    rig.handler = down_then_up
    rig.settings = rig.settings.model_copy(update={"concurrency": 1, "max_attempts": 1})
    rig.batch(3)
    record = await rig.run_until(final)
    assert record.status is BatchStatus.COMPLETED and record.throttled == 2
    assert rig.store.counts("batch_t").completed == 3  # never counted as attempts
    gaps = [b[0] - a[0] for a, b in zip(rig.seen.requests, rig.seen.requests[1:], strict=False)]
    assert gaps[0] >= 0.5 and gaps[1] >= 1.0  # a backoff that grows while it stays down


@pytest.mark.parametrize(("tiers", "raised"), [(("standard", "batch"), True), (("batch",), False)])
async def test_a_passed_deadline_expires_the_batch_with_its_partial_results(
        rig: Rig, tiers: tuple[Tier, ...], raised: bool) -> None:
    async def slow(body: dict[str, Any], seen: Seen) -> httpx.Response:
        await asyncio.sleep(0.15)
        return ok(body)
    rig.handler, rig.tiers = slow, tiers
    rig.settings = rig.settings.model_copy(update={"concurrency": 1})
    rig.batch(30, deadline_s=1.0)
    record = await rig.run_until(final)
    assert record.status is BatchStatus.EXPIRED and record.expired_at is not None
    assert record.deadline_risk is not None and record.deadline_risk == "at_risk"
    assert record.tier == ("standard" if raised else "batch")
    assert {t for _, _, t in rig.seen.requests} == ({"standard"} if raised else {"batch"})
    out = rig.output()
    assert [o["custom_id"] for o in out] == [f"c{i}" for i in range(30)]
    answered = [o for o in out if o["response"] is not None]
    assert 2 <= len(answered) < 30 and all(o["response"]["status_code"] == 200 for o in answered)
    assert {o["error"]["code"] for o in out if o["response"] is None} == {"batch_expired"}
    counts = rig.store.counts("batch_t")
    assert counts.completed == len(answered) and counts.incomplete == 30 - len(answered)


async def test_a_cancel_stops_the_batch_and_keeps_what_finished(rig: Rig) -> None:
    async def slow(body: dict[str, Any], seen: Seen) -> httpx.Response:
        await asyncio.sleep(0.05)
        return ok(body)
    rig.handler = slow
    rig.settings = rig.settings.model_copy(update={"concurrency": 2})
    rig.batch(200)

    def cancel_after_some() -> None:
        if rig.store.counts("batch_t").completed >= 6:
            rig.store.request_cancel("batch_t", "research", time.time())
    record = await rig.run_until(final, during=cancel_after_some)
    assert record.status is BatchStatus.CANCELLED and record.output_written_at is not None
    out = rig.output()
    assert len(out) == 200
    done = [o for o in out if o["response"] is not None]
    assert 6 <= len(done) < 200
    assert {o["error"]["code"] for o in out if o["response"] is None} == {"batch_cancelled"}


async def test_a_stopped_worker_resumes_with_one_result_per_line(rig: Rig) -> None:
    async def slow(body: dict[str, Any], seen: Seen) -> httpx.Response:
        await asyncio.sleep(0.02)
        return ok(body)
    rig.handler = slow
    rig.batch(60)
    first = await rig.run_until(lambda r: rig.store.counts("batch_t").completed >= 10)
    assert first.status is BatchStatus.IN_PROGRESS
    after_stop = rig.store.get("batch_t")
    assert after_stop is not None and after_stop.lease_owner is None  # given back on stop
    record = await rig.run_until(final, worker_id="w2")  # another worker takes over at once
    assert record.status is BatchStatus.COMPLETED
    ids = [o["custom_id"] for o in rig.output()]
    assert ids == [f"c{i}" for i in range(60)]  # each line once, in input order


async def test_unusable_inputs_and_missing_keys_fail_the_batch(rig: Rig) -> None:
    record = rig.batch(1)
    (rig.data / "batch_t.jsonl").unlink()
    failed = await rig.run_until(final)
    assert failed.status is BatchStatus.FAILED and failed.errors[0]["code"] == "input_not_found"
    assert not (rig.data / "batch_t.out.jsonl").exists()
    rig.store.insert(BatchRecord(  # a team the worker has no key for
        batch_id="batch_k", team="support", model="chat-7b", input_uri=record.input_uri,
        output_uri=record.output_uri, deadline=record.deadline, created_at=record.created_at))
    stop = asyncio.Event()
    task = asyncio.create_task(rig.worker().run(stop))
    for _ in range(200):
        keyless = rig.store.get("batch_k")
        if keyless is not None and keyless.status is BatchStatus.FAILED:
            break
        await asyncio.sleep(0.02)
    stop.set()
    await task
    assert keyless is not None and keyless.errors[0]["code"] == "team_key_unavailable"

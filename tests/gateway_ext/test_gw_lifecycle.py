"""The lifecycle on one event loop with a fake clock: queueing and release by settle, a client that
leaves the queue, queue timeouts and sheds with Retry-After, expired and foreign reservations."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gateway_ext.decision import Admitted, GatewayCore, Refused
from gateway_ext.lifecycle import CLIENT_GONE, RequestLifecycle, UsageReport
from gateway_ext.limits.admission_types import AdmissionDecision
from gateway_ext.limits.bucket_store import BucketKey, MemoryBucketStore, SettleVerdict
from gateway_ext.limits.pools import make_pools
from gateway_ext.limits.retry_budget import RetryBudget, RetryBudgetConfig
from gateway_ext.metering.meter import UsageMeter
from gateway_ext.metrics import make_metrics
from modelfleet.config import PlatformConfig
from modelfleet.contract.headers import PRIORITY_HEADER

PROMPT = 7  # "Hi!" through the ChatML template


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def make_gate(config: PlatformConfig, capacity: int, max_queue: int = 256,
              standard_timeout_s: float = 20.0) -> tuple[RequestLifecycle, Clock, CollectorRegistry]:
    clock = Clock()
    pools = make_pools(config, {v.key: capacity for v in config.versions}, max_queue,
                       {"interactive": 60.0, "standard": standard_timeout_s, "batch": 120.0})
    retry = RetryBudget(random.Random(1), RetryBudgetConfig(jitter=0.0))
    core = GatewayCore(config, MemoryBucketStore(), pools, retry, UsageMeter("local"),
                       choose_version=lambda r: r.version or "v13")
    registry = CollectorRegistry()
    ids = iter(f"r{i}" for i in range(1000))
    return RequestLifecycle(core, make_metrics(registry), clock, lambda: next(ids)), clock, registry


def request(key: str, max_tokens: int, tier: str = "standard") -> tuple[dict[str, str], bytes]:
    body = {"model": "chat-7b", "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": "Hi!"}]}
    return ({"authorization": f"Bearer {key}", PRIORITY_HEADER: tier}, json.dumps(body).encode())


def usage(admitted: Admitted, completion: int, prompt: int = PROMPT) -> UsageReport:
    return UsageReport(admitted.reservation_id, admitted.team, admitted.request.model,
                       admitted.version, prompt, 0, completion)


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(f"modelfleet_gateway_{name}", labels) or 0.0


async def test_a_queued_request_runs_when_a_settle_frees_capacity(
        platform_config: PlatformConfig, dev_keys: dict[str, str]) -> None:
    lifecycle, clock, registry = make_gate(platform_config, capacity=1000)
    first = await lifecycle.check(*request(dev_keys["search"], 900))
    assert isinstance(first, Admitted) and lifecycle.running == 1
    waiting = asyncio.ensure_future(lifecycle.check(*request(dev_keys["support"], 200)))
    await asyncio.sleep(0)
    assert lifecycle.queued == 1 and not waiting.done()
    clock.now += 2.0
    settlement = lifecycle.settle(usage(first, 50))
    assert settlement.verdict is SettleVerdict.SETTLED
    assert settlement.reserved_tokens == PROMPT + 900
    second = await asyncio.wait_for(waiting, 1)
    assert isinstance(second, Admitted) and second.team == "support"
    assert lifecycle.queued == 0 and lifecycle.running == 1
    assert sample(registry, "team_bucket_tokens_total", team="search", model="chat-7b",
                  event="refunded") == 850
    assert sample(registry, "pool_queue_wait_seconds_sum", pool="chat-7b@v13",
                  tier="standard") == pytest.approx(2.0)
    assert lifecycle.settle(usage(first, 50)).verdict is SettleVerdict.DUPLICATE


async def test_a_client_that_leaves_the_queue_is_refunded(
        platform_config: PlatformConfig, dev_keys: dict[str, str]) -> None:
    lifecycle, _, registry = make_gate(platform_config, capacity=1000)
    assert isinstance(await lifecycle.check(*request(dev_keys["search"], 990)), Admitted)
    gone = asyncio.Event()
    waiting = asyncio.ensure_future(lifecycle.check(*request(dev_keys["support"], 100),
                                               gone=gone.wait))
    await asyncio.sleep(0)
    assert lifecycle.queued == 1
    gone.set()
    answer = await asyncio.wait_for(waiting, 1)
    assert isinstance(answer, Refused) and answer.error is CLIENT_GONE
    assert lifecycle.queued == 0
    assert lifecycle.core.pools["chat-7b@v13"].view().queued["standard"] == 0
    state = lifecycle.core.store.bucket_state(BucketKey("support", "chat-7b"))
    assert state is not None and state.tokens == 3_000_000  # refunded in full
    assert sample(registry, "team_shed_total", team="support", model="chat-7b",
                  tier="standard") == 0


async def test_a_queue_timeout_is_a_503_with_retry_after(
        platform_config: PlatformConfig, dev_keys: dict[str, str]) -> None:
    lifecycle, clock, registry = make_gate(platform_config, capacity=1000, standard_timeout_s=3.0)
    assert isinstance(await lifecycle.check(*request(dev_keys["search"], 990)), Admitted)
    waiting = asyncio.ensure_future(lifecycle.check(*request(dev_keys["support"], 100)))
    await asyncio.sleep(0)
    assert lifecycle.tick() == pytest.approx(clock.now + 3.0)  # the timer's next deadline
    clock.now += 3.0
    lifecycle.tick()
    answer = await asyncio.wait_for(waiting, 1)
    assert isinstance(answer, Refused) and answer.error.status == 503
    assert answer.error.headers["retry-after"] == "5"  # queue timeout: 5 s, no jitter here
    assert "queue_timeout" in answer.error.message
    assert sample(registry, "team_shed_total", team="support", model="chat-7b",
                  tier="standard") == 1
    assert [r.counts.shed_503 for r in lifecycle.core.meter.drain() if r.key.team == "support"] == [1]


async def test_past_the_queue_bound_the_lowest_tier_is_shed(
        platform_config: PlatformConfig, dev_keys: dict[str, str]) -> None:
    lifecycle, _, _ = make_gate(platform_config, capacity=1000, max_queue=1)
    assert isinstance(await lifecycle.check(*request(dev_keys["search"], 990)), Admitted)
    batch = asyncio.ensure_future(lifecycle.check(*request(dev_keys["support"], 100, "batch")))
    await asyncio.sleep(0)
    standard = asyncio.ensure_future(lifecycle.check(*request(dev_keys["research"], 50)))
    shed = await asyncio.wait_for(batch, 1)  # evicted to make room for a higher tier
    assert isinstance(shed, Refused) and shed.error.status == 503
    assert int(shed.error.headers["retry-after"]) >= 5
    assert not standard.done() and lifecycle.queued == 1
    standard.cancel()  # the check is cancelled (Envoy went away): it leaves the queue
    with pytest.raises(asyncio.CancelledError):
        await standard
    assert lifecycle.queued == 0


async def test_an_expired_reservation_is_charged_in_full_and_frees_its_slot(
        platform_config: PlatformConfig, dev_keys: dict[str, str]) -> None:
    lifecycle, clock, _ = make_gate(platform_config, capacity=1000)
    lost = await lifecycle.check(*request(dev_keys["search"], 900))
    assert isinstance(lost, Admitted)
    clock.now += 4096 / 10 + 180 - 5  # the replica died: no settle within the reservation's life
    waiting = asyncio.ensure_future(lifecycle.check(*request(dev_keys["support"], 200)))
    await asyncio.sleep(0)
    assert lifecycle.queued == 1
    clock.now += 6
    lifecycle.tick()  # the pool drops the admitted request: the queued one runs
    assert isinstance(await asyncio.wait_for(waiting, 1), Admitted)
    state = lifecycle.core.store.bucket_state(BucketKey("search", "chat-7b"))
    assert state is not None
    late = lifecycle.settle(usage(lost, 10))  # a settle that arrives after all
    assert late.verdict is SettleVerdict.EXPIRED and late.reserved_tokens == PROMPT + 900
    assert lifecycle.core.store.bucket_state(BucketKey("search", "chat-7b")) == state  # no refund
    rows = [r for r in lifecycle.core.meter.drain() if r.key.team == "search"]
    assert sum(r.counts.output_tokens for r in rows) == 10  # the usage is still metered


async def test_a_settle_for_another_process_still_settles_the_bucket(
        platform_config: PlatformConfig, dev_keys: dict[str, str]) -> None:
    lifecycle, _, _ = make_gate(platform_config, capacity=1000)
    other, _, _ = make_gate(platform_config, capacity=1000)
    other.core.store = lifecycle.core.store  # the shared (Redis) store of a region
    admitted = await other.check(*request(dev_keys["search"], 900))
    assert isinstance(admitted, Admitted)
    settlement = lifecycle.settle(usage(admitted, 20))
    assert settlement.verdict is SettleVerdict.SETTLED
    assert settlement.remaining_tokens == 6_000_000 - PROMPT - 20
    unknown = UsageReport("nope", "ghost", "chat-7b", "v13", 1, 0, 1)
    assert lifecycle.settle(unknown).verdict is SettleVerdict.UNKNOWN


async def test_refusals_are_counted_by_reason(
        platform_config: PlatformConfig, dev_keys: dict[str, str]) -> None:
    lifecycle, _, registry = make_gate(platform_config, capacity=1000)
    headers, _ = request(dev_keys["search"], 10)
    refused = await lifecycle.check(headers, b"{not json")
    assert isinstance(refused, Refused) and refused.error.status == 400
    first = await lifecycle.check(*request(dev_keys["search"], 900))
    assert isinstance(first, Admitted) and first.outcome.decision is AdmissionDecision.ADMIT
    over = await lifecycle.check(*request(dev_keys["search"], 200))  # above its 50 % share
    assert isinstance(over, Refused) and over.error.status == 429
    assert sample(registry, "team_rejected_total", team="search", model="chat-7b",
                  reason="above_guaranteed_share") == 1


def test_the_check_needs_a_running_loop_only_when_queued(
        platform_config: PlatformConfig) -> None:
    lifecycle, _, _ = make_gate(platform_config, capacity=1000)
    answer: Any = asyncio.run(lifecycle.check({}, b"{}"))
    assert isinstance(answer, Refused) and answer.error.status == 401

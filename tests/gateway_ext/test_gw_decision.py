"""The composed decision (key -> retry budget -> parse -> permission -> bucket -> admission) on the
repository's config, with the memory and the Redis bucket stores; and the metrics definitions."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from prometheus_client import CollectorRegistry

from gateway_ext.decision import Admitted, GatewayCore, Refused
from gateway_ext.limits.admission import PoolAdmission
from gateway_ext.limits.admission_types import (
    AdmissionConfig,
    AdmissionDecision,
    AdmissionReason,
    PoolView,
)
from gateway_ext.limits.bucket_store import BucketKey, BucketStore, MemoryBucketStore, SettleVerdict
from gateway_ext.limits.redis_buckets import RedisBucketStore
from gateway_ext.limits.retry_budget import RetryBudget, RetryBudgetConfig
from gateway_ext.metering.meter import UsageMeter
from gateway_ext.metrics import make_metrics
from modelfleet.config import PlatformConfig
from modelfleet.contract.metrics import GATEWAY_POOL_QUEUE_DEPTH

NOW = 1_700_000_000.0
PROMPT = 7  # "Hi!" through the ChatML template: <|im_start|> user Hi ! <|im_end|> <|im_start|> assistant


@pytest.fixture(params=["memory", "redis"])
def store(request: pytest.FixtureRequest) -> Iterator[BucketStore]:
    if request.param == "memory":
        yield MemoryBucketStore()
        return
    client: redis.Redis = request.getfixturevalue("redis_client")
    yield RedisBucketStore(client, prefix=request.getfixturevalue("redis_prefix"))


def make_core(config: PlatformConfig, store: BucketStore, capacity: int = 1_000_000) -> GatewayCore:
    pools = {v.key: PoolAdmission(capacity, AdmissionConfig()) for v in config.versions}
    budget = RetryBudget(random.Random(3), RetryBudgetConfig(min_early_retries=1, jitter=0.0))
    return GatewayCore(config, store, pools, budget, UsageMeter("us-east-1"))


def body(**fields: Any) -> bytes:
    return json.dumps({"model": "chat-7b", "messages": [{"role": "user", "content": "Hi!"}],
                       **fields}).encode()


def auth(key: str, **headers: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}", **{k.replace("_", "-"): v for k, v in headers.items()}}


def refused(result: Admitted | Refused) -> tuple[int, str]:
    assert isinstance(result, Refused), result
    return result.error.status, result.error.code


def test_an_admitted_request_carries_its_route_and_limits(
        platform_config: PlatformConfig, dev_keys: dict[str, str], store: BucketStore) -> None:
    core = make_core(platform_config, store)
    result = core.decide(auth(dev_keys["search"], x_priority="interactive"),
                         body(max_tokens=100), NOW, "req-1")
    assert isinstance(result, Admitted)
    assert (result.pool, result.team, result.outcome.decision) == ("chat-7b@v13", "search",
                                                                   AdmissionDecision.ADMIT)
    assert result.request.reserve_tokens == PROMPT + 100
    assert result.headers == {
        "x-ratelimit-limit-tokens": "6000000", "x-ratelimit-remaining-tokens": str(6_000_000 - 107),
        "x-ratelimit-reset-tokens": "2ms", "x-route-version": "chat-7b@v13",
        "x-modelfleet-team": "search", "x-modelfleet-tier": "interactive",
        "x-modelfleet-reservation": "req-1"}
    explicit = core.decide(auth(dev_keys["search"]), body(model="chat-7b@v14"), NOW, "req-2")
    assert isinstance(explicit, Admitted) and explicit.pool == "chat-7b@v14"


def test_the_order_of_refusals(platform_config: PlatformConfig, dev_keys: dict[str, str],
                               store: BucketStore) -> None:
    core = make_core(platform_config, store)
    assert refused(core.decide({}, b"{broken", NOW, "r1")) == (401, "missing_api_key")
    assert refused(core.decide(auth(dev_keys["search"]), b"{broken", NOW, "r2")) == (
        400, "invalid_json")
    assert refused(core.decide(auth(dev_keys["support"]), body(model="reason-70b"), NOW,
                               "r3")) == (403, "model_not_allowed")
    assert refused(core.decide(auth(dev_keys["research"], x_priority="interactive"), body(), NOW,
                               "r4")) == (403, "tier_not_allowed")
    assert store.bucket_state(BucketKey("research", "chat-7b")) is None  # nothing charged


def test_over_the_token_limit_is_429_with_the_exact_wait(
        platform_config: PlatformConfig, dev_keys: dict[str, str], store: BucketStore) -> None:
    core = make_core(platform_config, store)
    key = dev_keys["research"]  # 1,000,000 tokens per minute on chat-7b
    for i in range(4):
        assert isinstance(core.decide(auth(key), body(max_tokens=4096), NOW, f"r{i}"), Admitted)
    # 4 x (7 + 4096) charged, 983,588 left; ask for more than that with n
    big = body(max_tokens=4096, n=241)
    result = core.decide(auth(key, x_conversation_id="c-1"), big, NOW, "r-big")
    assert refused(result) == (429, "rate_limit_exceeded")
    assert isinstance(result, Refused)
    left = 1_000_000 - 4 * (PROMPT + 4096)
    needed = PROMPT + 241 * 4096 - left
    wait_ms = -(-needed * 60_000 // 1_000_000)
    assert result.error.headers["retry-after-ms"] == str(wait_ms)  # jitter 0 in this core
    assert result.error.headers["x-ratelimit-remaining-tokens"] == str(left)
    # back inside its Retry-After window: the first early retry is within the budget (1) ...
    assert refused(core.decide(auth(key, x_conversation_id="c-1"), big, NOW + 0.1, "r5"))[1] == (
        "rate_limit_exceeded")
    # ... the next is refused cheaply, before the body is even parsed
    assert refused(core.decide(auth(key, x_conversation_id="c-1"), b"{broken", NOW + 0.15, "r6")) == (
        429, "retry_budget_exceeded")
    rows = core.meter.drain()
    assert sum(r.counts.rejected_429 for r in rows) == 2


def test_a_request_larger_than_the_whole_bucket_is_400(
        platform_config: PlatformConfig, dev_keys: dict[str, str], store: BucketStore) -> None:
    core = make_core(platform_config, store)
    result = core.decide(auth(dev_keys["research"]), body(max_tokens=4096, n=300), NOW, "r1")
    assert refused(result) == (400, "exceeds_token_limit")
    assert store.bucket_state(BucketKey("research", "chat-7b")) is None


def test_an_admission_refusal_refunds_the_reservation(
        platform_config: PlatformConfig, dev_keys: dict[str, str], store: BucketStore) -> None:
    core = make_core(platform_config, store, capacity=1000)
    key = dev_keys["search"]  # guaranteed share 0.5 of 1000 tokens in flight
    first = core.decide(auth(key), body(max_tokens=900), NOW, "r1")
    assert isinstance(first, Admitted)
    after_first = store.bucket_state(BucketKey("search", "chat-7b"))
    second = core.decide(auth(key), body(max_tokens=100), NOW, "r2")
    assert refused(second) == (429, str(AdmissionReason.ABOVE_SHARE))
    assert store.bucket_state(BucketKey("search", "chat-7b")) == after_first
    queued = core.decide(auth(dev_keys["support"]), body(max_tokens=200), NOW, "r3")
    assert isinstance(queued, Admitted) and queued.outcome.decision is AdmissionDecision.QUEUE

    settlement, admitted = core.finish(first, PROMPT, 0, 40, NOW + 5)
    assert (settlement.verdict, settlement.reserved_tokens) == (SettleVerdict.SETTLED, PROMPT + 900)
    assert [o.request_id for o in admitted] == ["r3"]
    assert core.finish(first, PROMPT, 0, 40, NOW + 6)[0].verdict is SettleVerdict.DUPLICATE
    usage = [r for r in core.meter.drain() if r.counts.requests]
    assert len(usage) == 1 and (usage[0].counts.prompt_tokens, usage[0].counts.output_tokens,
                                usage[0].counts.requests) == (PROMPT, 40, 1)


def test_a_queued_request_that_leaves_is_refunded(
        platform_config: PlatformConfig, dev_keys: dict[str, str], store: BucketStore) -> None:
    core = make_core(platform_config, store, capacity=1000)
    running = core.decide(auth(dev_keys["search"]), body(max_tokens=990), NOW, "r1")
    assert isinstance(running, Admitted)
    before = store.bucket_state(BucketKey("support", "chat-7b"))
    waiting = core.decide(auth(dev_keys["support"]), body(max_tokens=100), NOW, "r2")
    assert isinstance(waiting, Admitted) and waiting.outcome.decision is AdmissionDecision.QUEUE
    assert core.abandon(waiting, NOW, shed=True) == []  # same instant: no refill hides it
    state = store.bucket_state(BucketKey("support", "chat-7b"))
    assert before is None and state is not None and state.level == 3_000_000 * 60_000
    assert core.pools["chat-7b@v13"].view().queued["standard"] == 0
    assert [r.counts.shed_503 for r in core.meter.drain()] == [1]


def test_metrics_live_on_the_registry_passed_in() -> None:
    registry, other = CollectorRegistry(), CollectorRegistry()
    metrics = make_metrics(registry)
    make_metrics(other)  # a second set does not collide: nothing global
    metrics.count_usage("search", "chat-7b", 1200, 800, 300)
    metrics.team_rejected.labels(team="search", model="chat-7b", reason="rate_limit").inc()
    metrics.team_shed.labels(team="search", model="chat-7b", tier="batch").inc()
    metrics.pool_admitted.labels(pool="chat-7b@v13", tier="standard").inc()
    metrics.pool_queue_wait.labels(pool="chat-7b@v13", tier="standard").observe(0.3)
    metrics.observe_pool("chat-7b@v13", PoolView(
        1000, 400, {"interactive": 1, "standard": 2, "batch": 3}))

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(f"modelfleet_gateway_{name}", labels)

    assert value("team_tokens_total", team="search", model="chat-7b", kind="output") == 300
    assert value("team_rejected_total", team="search", model="chat-7b", reason="rate_limit") == 1
    assert value("team_shed_total", team="search", model="chat-7b", tier="batch") == 1
    assert value("pool_queue_depth", pool="chat-7b@v13", tier="batch") == 3
    assert value("pool_tokens_in_flight", pool="chat-7b@v13") == 400
    assert value("pool_capacity_tokens", pool="chat-7b@v13") == 1000
    assert value("pool_queue_wait_seconds_bucket", pool="chat-7b@v13", tier="standard",
                 le="0.5") == 1
    assert other.get_sample_value(GATEWAY_POOL_QUEUE_DEPTH,
                                  {"pool": "chat-7b@v13", "tier": "batch"}) is None

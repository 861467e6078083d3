"""Several gateway processes over one Redis, in one event loop on a fake clock: the share of pool
capacity, max_concurrency counted exactly in Redis (and per process while Redis is down), a
settle on the other process freeing the slot, refunds of refused requests."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
from collections.abc import AsyncIterator, Callable

import pytest
import redis
import redis.asyncio
from prometheus_client import CollectorRegistry

from gateway_ext.decision import Admitted, GatewayCore, Refused
from gateway_ext.lifecycle import UsageReport
from gateway_ext.limits.async_fallback_store import AsyncFallbackBucketStore
from gateway_ext.limits.bucket_store import BucketKey, Concurrency, CountedReservation, Settlement
from gateway_ext.limits.buckets import BucketState, Verdict
from gateway_ext.limits.pools import make_pools
from gateway_ext.limits.redis_buckets import AsyncRedisBucketStore, RedisBucketStore, open_redis_key
from gateway_ext.limits.retry_budget import RetryBudget, RetryBudgetConfig
from gateway_ext.metering.meter import UsageMeter
from gateway_ext.metrics import make_metrics
from gateway_ext.routing.peers import gateway_share
from gateway_ext.shared_lifecycle import SharedLifecycle
from modelfleet.config import PlatformConfig

PROMPT = 7
KEY = BucketKey("search", "chat-7b")


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(("capacity", "live", "share"), [
    (12_000, 1, 12_000), (12_000, 2, 6_000), (12_000, 5, 2_400), (10, 3, 3),
    (2, 3, 1),  # an idle share still runs one request
    (0, 3, 0), (12_000, 0, 12_000), (-5, 2, 0)])
def test_each_gateway_admits_against_an_equal_floor_share(capacity: int, live: int,
                                                          share: int) -> None:
    assert gateway_share(capacity, live) == share
    assert gateway_share(capacity, live) * max(1, live) <= max(capacity, max(1, live))


class DownStore:
    """A shared store that is always unreachable."""

    calls = 0

    async def reserve_counted(self, *_: object) -> CountedReservation:
        self.calls += 1
        raise redis.ConnectionError("down")

    async def settle(self, *_: object) -> Settlement:
        self.calls += 1
        raise redis.ConnectionError("down")

    async def bucket_state(self, key: BucketKey) -> BucketState | None:
        self.calls += 1
        raise redis.ConnectionError("down")


async def test_redis_down_fails_open_to_memory_and_the_local_count() -> None:
    clock, down, fell = Clock(), DownStore(), list[str]()
    store = AsyncFallbackBucketStore(down, (redis.RedisError, OSError), clock, 1.0,
                                     on_fallback=fell.append)
    counted = await store.reserve(KEY, 6000, 100, "r1", clock(), 300.0, 2)
    assert counted.concurrency is Concurrency.LOCAL
    assert counted.reservation.verdict is Verdict.RESERVED and store.degraded
    await store.reserve(KEY, 6000, 100, "r2", clock(), 300.0, 2)
    assert down.calls == 1  # skipped while degraded
    assert (await store.settle(KEY, 6000, "r1", 10, clock())).verdict == "settled"  # in memory
    clock.now += 1.0
    assert not store.degraded
    assert (await store.settle(KEY, 6000, "other", 10, clock())).verdict == "unknown"
    assert fell == ["reserve", "settle"]


@pytest.fixture
async def aclient(redis_url: str) -> AsyncIterator[redis.asyncio.Redis]:
    client = redis.asyncio.Redis.from_url(redis_url)
    yield client
    await client.aclose()


async def test_the_open_count_is_exact_and_freed_by_any_settle_or_expiry(
        aclient: redis.asyncio.Redis, redis_client: redis.Redis, redis_prefix: str) -> None:
    store = AsyncRedisBucketStore(aclient, prefix=redis_prefix)
    now = 1_700_000_000.0
    first = await store.reserve_counted(KEY, 6000, 100, "a", now, 60.0, 2)
    again = await store.reserve_counted(KEY, 6000, 100, "a", now, 60.0, 2)  # idempotent
    second = await store.reserve_counted(KEY, 6000, 100, "b", now, 60.0, 2)
    third = await store.reserve_counted(KEY, 6000, 100, "c", now, 60.0, 2)
    assert [first.concurrency, again.concurrency, second.concurrency] == ["granted"] * 3
    assert third.concurrency is Concurrency.REFUSED
    assert third.reservation.remaining_tokens == 5800  # refused: nothing charged
    # the sync store (another process) settles "a": the slot is free at once, twice is harmless
    sync = RedisBucketStore(redis_client, prefix=redis_prefix)
    assert sync.settle(KEY, 6000, "a", 50, now).verdict == "settled"
    assert sync.settle(KEY, 6000, "a", 50, now).verdict == "duplicate"
    assert (await store.reserve_counted(KEY, 6000, 100, "c", now, 60.0, 2)).concurrency \
        is Concurrency.GRANTED
    assert redis_client.zcard(open_redis_key(redis_prefix, KEY)) == 2
    # unsettled reservations expire with their reservation: their slots go too
    later = await store.reserve_counted(KEY, 6000, 100, "d", now + 60.0, 60.0, 2)
    assert later.concurrency is Concurrency.GRANTED
    assert redis_client.zcard(open_redis_key(redis_prefix, KEY)) == 1


def make_gate(config: PlatformConfig, client: redis.asyncio.Redis, prefix: str, clock: Clock,
              name: str, capacity: int = 100_000) -> SharedLifecycle:
    pools = make_pools(config, {v.key: capacity for v in config.versions}, 256,
                       {"interactive": 60.0, "standard": 20.0, "batch": 120.0})
    store = AsyncFallbackBucketStore(AsyncRedisBucketStore(client, prefix=prefix),
                                     (redis.RedisError, OSError), clock)
    core = GatewayCore(config, store.fallback, pools,
                       RetryBudget(random.Random(1), RetryBudgetConfig(jitter=0.0)),
                       UsageMeter("local"), choose_version=lambda r: r.version or "v13")
    ids = iter(f"{name}{i}" for i in range(1000))
    return SharedLifecycle(core, make_metrics(CollectorRegistry()), clock, store,
                      new_id=lambda: next(ids))


def chat(key: str, max_tokens: int = 100) -> tuple[dict[str, str], bytes]:
    body = {"model": "chat-7b", "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": "Hi!"}]}
    return {"authorization": f"Bearer {key}"}, json.dumps(body).encode()


def report(admitted: Admitted, completion: int = 5) -> UsageReport:
    return UsageReport(admitted.reservation_id, admitted.team, "chat-7b", admitted.version,
                       PROMPT, 0, completion)


@pytest.fixture
def two_gates(platform_config: PlatformConfig, aclient: redis.asyncio.Redis,
              redis_prefix: str) -> Callable[[int], tuple[SharedLifecycle, SharedLifecycle, Clock]]:
    def make(max_concurrency: int) -> tuple[SharedLifecycle, SharedLifecycle, Clock]:
        teams = [t.model_copy(update={"limits": tuple(
            lim.model_copy(update={"max_concurrency": max_concurrency}) for lim in t.limits)})
            for t in platform_config.teams]
        config = platform_config.model_copy(update={"teams": tuple(teams)})
        clock = Clock()
        return (make_gate(config, aclient, redis_prefix, clock, "a"),
                make_gate(config, aclient, redis_prefix, clock, "b"), clock)
    return make


async def test_max_concurrency_holds_across_gates_and_a_foreign_settle_frees_it(
        two_gates: Callable[[int], tuple[SharedLifecycle, SharedLifecycle, Clock]],
        dev_keys: dict[str, str]) -> None:
    a, b, _ = two_gates(2)
    first = await a.check(*chat(dev_keys["search"]))
    second = await b.check(*chat(dev_keys["search"]))
    assert isinstance(first, Admitted) and isinstance(second, Admitted)
    for lifecycle in (a, b):
        third = await lifecycle.check(*chat(dev_keys["search"]))
        assert isinstance(third, Refused) and third.error.code == "max_concurrency"
    other_team = await b.check(*chat(dev_keys["support"]))
    assert isinstance(other_team, Admitted)
    pool = a.core.pools[first.pool]
    held = pool.view().in_flight_tokens
    settled = await b.settle_async(report(first))  # the replica's settle lands on b
    assert settled.verdict == "settled" and a.running == 1
    a.release_foreign(first.reservation_id)  # what a hears on the release channel
    a.release_foreign(first.reservation_id)  # twice: nothing more
    assert a.running == 0 and pool.view().in_flight_tokens == held - first.request.reserve_tokens
    assert isinstance(await a.check(*chat(dev_keys["search"])), Admitted)


async def test_a_request_refused_by_the_pool_gives_its_slot_and_tokens_back(
        two_gates: Callable[[int], tuple[SharedLifecycle, SharedLifecycle, Clock]],
        dev_keys: dict[str, str]) -> None:
    a, _, _ = two_gates(1)
    big = chat(dev_keys["search"], max_tokens=4000)
    pool = a.core.pools["chat-7b@v13"]
    a.set_capacity("chat-7b@v13", 0)  # no replica: everything queues...
    pool.config = dataclasses.replace(pool.config, max_queue=0)  # ...and the queue holds none
    refused = await a.check(*big)
    assert isinstance(refused, Refused) and refused.error.status == 503
    await asyncio.gather(*a._tasks)  # the refund runs in the background
    a.set_capacity("chat-7b@v13", 100_000)
    admitted = await a.check(*big)
    assert isinstance(admitted, Admitted)  # the one slot was given back, and the tokens:
    tpm = admitted.tokens_per_minute
    assert admitted.headers["x-ratelimit-remaining-tokens"] == str(
        tpm - admitted.request.reserve_tokens)


async def test_capacity_is_split_between_live_gateways(
        two_gates: Callable[[int], tuple[SharedLifecycle, SharedLifecycle, Clock]]) -> None:
    a, _, _ = two_gates(5)
    a.set_capacity("chat-7b@v13", 9_000)
    a.set_live_gateways(3)
    assert a.core.pools["chat-7b@v13"].capacity_tokens == 3_000
    a.set_capacity("chat-7b@v13", 12_000)
    assert a.core.pools["chat-7b@v13"].capacity_tokens == 4_000
    a.set_live_gateways(1)
    assert a.core.pools["chat-7b@v13"].capacity_tokens == 12_000

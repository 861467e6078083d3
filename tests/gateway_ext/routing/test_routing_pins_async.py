"""Conversation pins on the asyncio Redis client: the same script and keys as the sync store, calls
pipelined with the bucket reservations, fail-open to memory and back, and two shared lifecycles (two
gateway processes) agreeing on a conversation's version, never touching the sync pin store and
writing no pin for a request the bucket refuses."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator, Collection, Iterator
from pathlib import Path

import httpx
import pytest
import redis
import redis.asyncio
from prometheus_client import CollectorRegistry
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff

from gateway_ext.decision import Admitted, GatewayCore, Refused
from gateway_ext.limits.async_fallback_store import AsyncFallbackBucketStore
from gateway_ext.limits.bucket_store import BucketKey
from gateway_ext.limits.pools import make_pools
from gateway_ext.limits.redis_buckets import AsyncRedisBucketStore
from gateway_ext.limits.retry_budget import RetryBudget, RetryBudgetConfig
from gateway_ext.metering.meter import UsageMeter
from gateway_ext.metrics import make_metrics
from gateway_ext.routing.async_pins import AsyncFallbackPinStore, AsyncRedisPinStore
from gateway_ext.routing.pins import MemoryPinStore, RedisPinStore, pin_key
from gateway_ext.routing.router import Router
from gateway_ext.routing.versions import conversation_key, split_point
from gateway_ext.runtime import build_runtime
from gateway_ext.service import create_app
from gateway_ext.settings import Settings
from gateway_ext.shared_lifecycle import SharedLifecycle
from modelfleet.config import PlatformConfig
from modelfleet.contract.headers import CONVERSATION_HEADER
from modelfleet.contract.router_state_types import ModelAlias

ERRORS = (redis.RedisError, OSError)
BOTH = ("v13", "v14")


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def aclient(redis_url: str) -> AsyncIterator[redis.asyncio.Redis]:
    client = redis.asyncio.Redis.from_url(redis_url)
    yield client
    await client.aclose()


async def test_async_pins_use_the_sync_stores_script_and_keys(
        aclient: redis.asyncio.Redis, redis_client: redis.Redis, redis_prefix: str) -> None:
    pins = AsyncRedisPinStore(aclient, redis_prefix, ttl_s=30)
    sync = RedisPinStore(redis_client, redis_prefix, ttl_s=30)
    assert pins.key("search", "chat-7b", "c1") == sync.key("search", "chat-7b", "c1")
    assert await pins.resolve("search", "chat-7b", "c1", "v14", BOTH) == ("v14", True)
    assert sync.resolve("search", "chat-7b", "c1", "v13", BOTH) == ("v14", False)
    assert 0 < redis_client.pttl(sync.key("search", "chat-7b", "c1")) <= 30_000
    assert await pins.resolve("ads", "chat-7b", "c1", "v13", BOTH) == ("v13", True)  # own team
    # a rollback (v14 no longer valid) moves the conversation, and the pin with it
    assert await pins.resolve("search", "chat-7b", "c1", "v13", ("v13",)) == ("v13", True)
    assert sync.resolve("search", "chat-7b", "c1", "v14", BOTH) == ("v13", False)
    redis_client.set(sync.legacy_key("chat-7b", "old"), "v14", px=30_000)  # pre-team layout
    assert await pins.resolve("search", "chat-7b", "old", "v13", BOTH) == ("v14", False)


async def test_pins_share_round_trips_with_the_bucket_reservations(
        aclient: redis.asyncio.Redis, redis_prefix: str) -> None:
    buckets = AsyncRedisBucketStore(aclient, prefix=redis_prefix)
    pins = AsyncRedisPinStore(aclient, redis_prefix, ttl_s=30, pipeline=buckets.pipeline)
    reserve = asyncio.ensure_future(buckets.reserve_counted(
        BucketKey("search", "chat-7b"), 6000, 100, "r1", 1_700_000_000.0, 60.0, 5))
    pinned = await asyncio.gather(
        *(pins.resolve("search", "chat-7b", f"c{i}", "v13", BOTH) for i in range(40)))
    assert pinned == [("v13", True)] * 40 and (await reserve).reservation.verdict == "reserved"
    assert buckets.pipeline.pipelines == 1  # 41 script calls, one round trip


class Switch:
    """A pin store that is down while ``down`` is set, else ``inner``."""

    def __init__(self, inner: AsyncRedisPinStore) -> None:
        self.inner, self.down = inner, False

    async def resolve(self, team: str, model: str, conversation_id: str, candidate: str,
                      valid: Collection[str]) -> tuple[str, bool]:
        if self.down:
            raise redis.ConnectionError("down")
        return await self.inner.resolve(team, model, conversation_id, candidate, valid)


async def test_redis_down_pins_in_memory_then_back(aclient: redis.asyncio.Redis,
                                                    redis_client: redis.Redis,
                                                    redis_prefix: str) -> None:
    clock, fallen = Clock(), list[int]()
    unreachable = redis.asyncio.Redis(port=1, socket_connect_timeout=0.05,
                                      retry=AsyncRetry(NoBackoff(), 0))
    broken = AsyncFallbackPinStore(AsyncRedisPinStore(unreachable, "x"), MemoryPinStore(clock=clock),
                                   ERRORS, retry_s=1.0, clock=clock)
    assert await broken.resolve("t", "m", "c", "v14", BOTH) == ("v14", True)
    assert broken.degraded
    await unreachable.aclose()

    switch = Switch(AsyncRedisPinStore(aclient, redis_prefix, ttl_s=30))
    store = AsyncFallbackPinStore(switch, MemoryPinStore(clock=clock), ERRORS, retry_s=1.0,
                                  clock=clock, on_fallback=lambda: fallen.append(1))
    switch.down = True
    assert await store.resolve("search", "chat-7b", "c", "v14", BOTH) == ("v14", True)
    switch.down = False  # back, but not tried again before retry_s: pins stay in memory
    assert await store.resolve("search", "chat-7b", "c", "v13", BOTH) == ("v14", False)
    assert store.degraded and fallen == [1]
    assert redis_client.get(pin_key(redis_prefix, "search", "chat-7b", "c")) is None
    clock.now += 1.0
    assert not store.degraded  # Redis again: the conversation is split afresh and pinned there
    assert await store.resolve("search", "chat-7b", "c", "v13", BOTH) == ("v13", True)
    assert redis_client.get(pin_key(redis_prefix, "search", "chat-7b", "c")) == b"v13"


class NoSyncPins:
    """The sync pin store, which the shared lifecycle must never call (it would block the loop)."""

    def resolve(self, *_: object) -> tuple[str, bool]:
        raise AssertionError("the sync pin store was called on the event loop")


class AliasRouter(Router):
    """A router whose alias is set by the test (another process saw another canary percent)."""

    fixed = ModelAlias("chat-7b", live="v13", canary="v14", canary_percent=50.0)

    def alias(self, model: str) -> ModelAlias | None:
        return self.fixed


def make_gate(config: PlatformConfig, client: redis.asyncio.Redis, prefix: str, clock: Clock,
              name: str, alias: ModelAlias) -> SharedLifecycle:
    pools = make_pools(config, {v.key: 100_000 for v in config.versions}, 256,
                       {"interactive": 60.0, "standard": 20.0, "batch": 120.0})
    buckets = AsyncRedisBucketStore(client, prefix=prefix)
    store = AsyncFallbackBucketStore(buckets, ERRORS, clock)
    pins = AsyncFallbackPinStore(AsyncRedisPinStore(client, prefix, 30, pipeline=buckets.pipeline),
                                 MemoryPinStore(), ERRORS)
    router = AliasRouter(config, NoSyncPins(), list(pools), rng=random.Random(1), async_pins=pins)
    router.fixed = alias
    core = GatewayCore(config, store.fallback, pools,
                       RetryBudget(random.Random(1), RetryBudgetConfig(jitter=0.0)),
                       UsageMeter("local"), choose_team_version=router.choose_version)
    ids: Iterator[str] = iter(f"{name}{i}" for i in range(1000))
    return SharedLifecycle(core, make_metrics(CollectorRegistry()), clock, store,
                      choose_version=router.choose_version_async, new_id=lambda: next(ids))


def chat(key: str, cid: str, max_tokens: int = 100) -> tuple[dict[str, str], bytes]:
    body = {"model": "chat-7b", "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": "Hi!"}]}
    return {"authorization": f"Bearer {key}", CONVERSATION_HEADER: cid}, json.dumps(body).encode()


async def test_two_shared_lifecycles_agree_on_a_conversations_version_through_redis(
        platform_config: PlatformConfig, aclient: redis.asyncio.Redis, redis_url: str,
        redis_client: redis.Redis, redis_prefix: str, dev_keys: dict[str, str]) -> None:
    teams = [t.model_copy(update={"limits": tuple(
        lim.model_copy(update={"tokens_per_minute": 1000}) for lim in t.limits)})
        for t in platform_config.teams]
    config = platform_config.model_copy(update={"teams": tuple(teams)})
    other_process = redis.asyncio.Redis.from_url(redis_url)  # the second gateway's own client
    clock, key = Clock(), dev_keys["search"]
    half = ModelAlias("chat-7b", live="v13", canary="v14", canary_percent=50.0)
    a = make_gate(config, aclient, redis_prefix, clock, "a", half)
    b = make_gate(config, other_process, redis_prefix, clock, "b", ModelAlias(
        "chat-7b", live="v13", canary="v14", canary_percent=0.0))  # b would split it to v13
    try:
        cid = next(c for c in (f"conv-{i}" for i in range(100))
                   if split_point(conversation_key("search", "chat-7b", c)) < 0.5)
        first = await a.check(*chat(key, cid))
        assert isinstance(first, Admitted) and first.version == "v14"
        again = await b.check(*chat(key, cid))
        assert isinstance(again, Admitted) and again.version == "v14"  # the pin a wrote
        assert redis_client.get(pin_key(redis_prefix, "search", "chat-7b", cid)) == b"v14"
        # requests the bucket refuses write no pin: too large (400), then over the limit (429)
        too_large = await a.check(*chat(key, "big", max_tokens=2000))
        assert isinstance(too_large, Refused) and too_large.error.code == "exceeds_token_limit"
        denied = await b.check(*chat(key, "late", max_tokens=900))
        assert isinstance(denied, Refused) and denied.error.status == 429
        for refused in ("big", "late"):
            assert redis_client.get(pin_key(redis_prefix, "search", "chat-7b", refused)) is None
    finally:
        await other_process.aclose()


async def test_the_service_awaits_pins_in_redis(
        tmp_path: Path, platform_config: PlatformConfig, dev_keys: dict[str, str],
        redis_url: str, redis_prefix: str, redis_client: redis.Redis) -> None:
    settings = Settings.from_env({}, usage_db_url=f"sqlite:///{tmp_path / 'usage.db'}",
                                 spool=tmp_path / "spool.jsonl", seed=1, redis_url=redis_url,
                                 redis_prefix=redis_prefix)
    runtime = build_runtime(settings, platform_config)
    assert isinstance(runtime.router.async_pins, AsyncFallbackPinStore)
    runtime.router.pins = NoSyncPins()
    app = create_app(runtime)
    headers, body = chat(dev_keys["search"], "svc-conv")
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
        for _ in range(3):
            r = await client.post("/authz/v1/chat/completions", content=body,
                                  headers={**headers, "content-type": "application/json"})
            assert r.status_code == 200
    pinned = redis_client.get(pin_key(redis_prefix, "search", "chat-7b", "svc-conv"))
    assert pinned in (b"v13", b"v14")

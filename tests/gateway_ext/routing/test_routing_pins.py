"""Version resolution with pins: a conversation keeps the version it started on through canary
changes (1% -> 10% -> 50%, and back), new conversations follow the split, requests without a
conversation are split per request, a rollback or a promotion moves pins, Redis shares them, and
a conversation is (team, model, id): two teams reusing an id never share a pin."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from gateway_ext.routing.pins import FallbackPinStore, MemoryPinStore, RedisPinStore
from gateway_ext.routing.router import Router
from gateway_ext.routing.versions import (
    VersionReason,
    choose,
    conversation_key,
    pin_targets,
    settle_pin,
    split,
    split_point,
)
from modelfleet.config import PlatformConfig
from modelfleet.contract.headers import CONVERSATION_HEADER
from modelfleet.contract.router_state_types import ModelAlias

ALIAS = ModelAlias("chat-7b", live="v13", canary="v14", canary_percent=1.0)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def resolve(store: MemoryPinStore | RedisPinStore, alias: ModelAlias, cid: str,
            team: str = "search") -> str:
    candidate = choose(alias, None, conversation_key(team, "chat-7b", cid), 0.0).version
    return store.resolve(team, "chat-7b", cid, candidate, pin_targets(alias))[0]


def test_the_split_is_monotone_in_the_percent() -> None:
    points = [split_point(f"c{i}") for i in range(5000)]
    for low, high in ((1, 10), (10, 50), (50, 100)):
        a, b = replace(ALIAS, canary_percent=low), replace(ALIAS, canary_percent=high)
        moved = [p for p in points if split(a, p) != split(b, p)]
        assert all(split(a, p) == "v13" and split(b, p) == "v14" for p in moved)
        assert abs(sum(split(b, p) == "v14" for p in points) / 5000 - high / 100) < 0.03


def test_pinned_conversations_never_change_version_while_the_canary_grows() -> None:
    store, ids = MemoryPinStore(), [f"conv-{i}" for i in range(3000)]
    started: dict[str, str] = {}
    for percent in (1, 10, 50, 10, 100, 0):
        alias = replace(ALIAS, canary_percent=percent)
        for cid in ids:
            version = resolve(store, alias, cid)
            assert started.setdefault(cid, version) == version, (cid, percent)
        new = [resolve(store, alias, f"new-{percent}-{i}") for i in range(2000)]
        assert abs(new.count("v14") / 2000 - percent / 100) < 0.03, percent
    # without pins, a plain hash split would have moved these at 50%
    assert sum(split_point(c) < 0.5 for c in ids if started[c] == "v13") > 1000


def test_a_pin_holds_only_on_the_alias_live_or_canary_version() -> None:
    assert settle_pin("v14", "v13", ("v13", "v14")) == ("v14", False)
    assert settle_pin("v14", "v13", ("v13",)) == ("v13", True)  # canary rolled back
    assert settle_pin(None, "v13", ("v13",)) == ("v13", True)
    store = MemoryPinStore()
    on_canary = next(f"c{i}" for i in range(1000)
                     if split_point(conversation_key("search", "chat-7b", f"c{i}")) < 0.01)
    assert resolve(store, ALIAS, on_canary) == "v14"
    rolled_back = replace(ALIAS, canary=None, canary_percent=0.0)
    assert resolve(store, rolled_back, on_canary) == "v13"
    assert resolve(store, ALIAS, on_canary) == "v13"  # re-pinned: the canary's return does not move it
    promoted = ModelAlias("chat-7b", live="v14")
    assert resolve(store, promoted, on_canary) == "v14"


def test_memory_pins_expire_and_are_bounded() -> None:
    clock = Clock()
    store = MemoryPinStore(ttl_s=60.0, max_entries=100, clock=clock)
    assert store.resolve("t", "m", "a", "v14", ("v13", "v14")) == ("v14", True)
    clock.now = 59.0
    assert store.resolve("t", "m", "a", "v13", ("v13", "v14")) == ("v14", False)  # TTL slides
    clock.now = 118.0
    assert store.resolve("t", "m", "a", "v13", ("v13", "v14")) == ("v14", False)
    clock.now = 179.0
    assert store.resolve("t", "m", "a", "v13", ("v13", "v14")) == ("v13", True)  # idle 61 s
    for i in range(500):
        store.resolve("t", "m", f"x{i}", "v13", ("v13",))
    assert len(store) == 100


def test_explicit_versions_and_requests_without_a_conversation_are_not_pinned() -> None:
    assert choose(ALIAS, "v12", "conv-1", 0.0).reason is VersionReason.EXPLICIT
    draws = [choose(replace(ALIAS, canary_percent=10), None, None, d).version
             for d in (0.05, 0.099, 0.1, 0.5)]
    assert draws == ["v14", "v14", "v13", "v13"]


def test_redis_pins_are_shared_by_gateway_processes(redis_url: str, redis_client: redis.Redis,
                                                     redis_prefix: str) -> None:
    one = RedisPinStore(redis_client, redis_prefix, ttl_s=30)
    other_process = redis.Redis.from_url(redis_url)  # another gateway's own client
    two = RedisPinStore(other_process, redis_prefix, ttl_s=30)
    low = replace(ALIAS, canary_percent=1)
    high = replace(ALIAS, canary_percent=100)
    assert resolve(one, low, "shared") == "v13"
    assert resolve(two, high, "shared") == "v13"  # the other process sees the pin
    assert 0 < redis_client.pttl(one.key("search", "chat-7b", "shared")) <= 30_000
    assert resolve(two, ModelAlias("chat-7b", live="v14"), "shared") == "v14"
    assert resolve(one, high, "shared") == "v14"
    other_process.close()


def test_redis_down_pins_in_memory_then_back() -> None:
    clock = Clock()
    broken = RedisPinStore(redis.Redis(port=1, socket_connect_timeout=0.05,
                                       retry=Retry(NoBackoff(), 0)), "x")
    fallen: list[int] = []
    store = FallbackPinStore(broken, MemoryPinStore(clock=clock), (redis.RedisError, OSError),
                             retry_s=1.0, clock=clock, on_fallback=lambda: fallen.append(1))
    assert store.resolve("t", "m", "c", "v14", ("v13", "v14")) == ("v14", True)
    assert store.degraded and fallen == [1]
    assert store.resolve("t", "m", "c", "v13", ("v13", "v14")) == ("v14", False)  # memory
    assert fallen == [1]


def test_the_router_pins_through_its_store(platform_config: PlatformConfig) -> None:
    from gateway_ext.request import ChatRequest, parse_chat_request

    router = Router(platform_config, MemoryPinStore(), ["chat-7b@v13", "chat-7b@v14"],
                    rng=random.Random(1))
    body = b'{"model": "chat-7b", "messages": [{"role": "user", "content": "hi"}]}'
    with_id = parse_chat_request(body, {CONVERSATION_HEADER: "conv-9"}, platform_config)
    without = parse_chat_request(body, {}, platform_config)
    assert isinstance(with_id, ChatRequest) and isinstance(without, ChatRequest)
    first = router.choose_version(with_id)
    assert all(router.choose_version(with_id) == first for _ in range(20))
    picks = [router.choose_version(without) for _ in range(2000)]
    assert 0.07 < picks.count("v14") / 2000 < 0.13  # config: 10%, drawn per request
    by_team = [(router.choose_version(with_id, "search"), router.choose_version(with_id, "ads"))
               for with_id in (parse_chat_request(body, {CONVERSATION_HEADER: f"c-{i}"},
                                                  platform_config) for i in range(300))
               if isinstance(with_id, ChatRequest)]
    assert sum(a != b for a, b in by_team) > 20  # 10% each: two teams' pins are their own
    only_live = Router(platform_config, MemoryPinStore(), ["chat-7b@v13"])  # no v14 pool here
    assert all(only_live.choose_version(without) == "v13" for _ in range(200))


@pytest.mark.parametrize("percent", [0.0, 100.0])
def test_the_extremes_send_everything_one_way(percent: float) -> None:
    alias = replace(ALIAS, canary_percent=percent)
    versions = {choose(alias, None, f"c{i}", 0.0).version for i in range(500)}
    assert versions == ({"v13"} if percent == 0 else {"v14"})


@pytest.mark.parametrize("store_kind", ["memory", "redis"])
def test_two_teams_reusing_a_conversation_id_never_share_a_pin(
        store_kind: str, request: pytest.FixtureRequest) -> None:
    store: MemoryPinStore | RedisPinStore
    if store_kind == "memory":
        store = MemoryPinStore()
    else:
        store = RedisPinStore(request.getfixturevalue("redis_client"),
                              request.getfixturevalue("redis_prefix"), ttl_s=30)
    half = replace(ALIAS, canary_percent=50)
    # the split point is per team: over many shared ids the two teams disagree about half the time
    ids = [f"shared-{i}" for i in range(400)]
    first = {cid: resolve(store, half, cid, "search") for cid in ids}
    second = {cid: resolve(store, half, cid, "ads") for cid in ids}
    differ = sum(first[c] != second[c] for c in ids)
    assert 120 < differ < 280, differ
    # each team keeps its own pin whatever the percent does
    assert all(resolve(store, replace(ALIAS, canary_percent=p), c, t) == want[c]
               for p in (1, 99) for t, want in (("search", first), ("ads", second))
               for c in ids[:60])


def test_pins_written_before_they_were_per_team_are_still_honoured(
        redis_client: redis.Redis, redis_prefix: str) -> None:
    store = RedisPinStore(redis_client, redis_prefix, ttl_s=30)
    redis_client.set(store.legacy_key("chat-7b", "old-conv"), "v14", px=30_000)  # old layout
    at_zero = replace(ALIAS, canary_percent=0)  # a new split would send it to v13
    assert resolve(store, at_zero, "old-conv") == "v14"
    assert redis_client.get(store.key("search", "chat-7b", "old-conv")) == b"v14"  # adopted
    no_legacy = RedisPinStore(redis_client, redis_prefix, ttl_s=30, read_legacy=False)
    redis_client.set(no_legacy.legacy_key("chat-7b", "other"), "v14", px=30_000)
    assert resolve(no_legacy, at_zero, "other") == "v13"

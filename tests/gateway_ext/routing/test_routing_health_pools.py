"""Health first and versions the gateway's config does not know.

* A replica whose last beat was stale when the router state was published (more than 1.5 beat
  intervals old: it missed a beat, it may be dead) is still in the state until three beats are
  missed, but the gateway's pick leaves it out, so Envoy's first attempt goes to a healthy one;
  if every replica is stale the pick goes on as before. A replica turning stale is a routing
  change: the control plane publishes it at once.
* A version registered through the admin API after the gateway started (in the router state,
  not in the gateway's config) gets an admission pool with the state's capacity, shares its
  model's team concurrency, and takes its canary share without a gateway restart.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
from envoy_control.state.publish import RouterPublisher

from gateway_ext.decision import Admitted
from gateway_ext.limits.admission_types import AdmissionDecision, AdmissionReason, Outcome
from gateway_ext.request import ChatRequest
from gateway_ext.routing.picking import build_ring, first_choices, ring_order
from gateway_ext.routing.pins import MemoryPinStore
from gateway_ext.routing.router import Picking, Router, RoutingPolicy
from gateway_ext.runtime import build_runtime
from gateway_ext.settings import Settings
from modelfleet.config import PlatformConfig
from modelfleet.contract.headers import (
    CONVERSATION_HEADER,
    DESTINATION_HEADER,
    ROUTE_VERSION_HEADER,
)
from modelfleet.contract.router_state import parse_router_state
from modelfleet.contract.router_state_types import (
    ModelAlias,
    PoolRoute,
    RoutableReplica,
    RouterState,
)

IDS = [f"chat-7b@v13-{i}" for i in range(4)]
CAPACITY = 112_000


def replica(rid: str, age: float | None = 0.3, load: int = 0, model_version: str = "") -> RoutableReplica:
    n = int(rid.rsplit("-", 1)[1])
    return RoutableReplica(rid, f"10.0.{len(model_version)}.{n + 1}", 8000, "local", load, 0, 0,
                           0.0, age is not None, age)


def state(ages: dict[str, float | None] | None = None, loads: dict[str, int] | None = None,
          version: int = 1) -> RouterState:
    ages, loads = ages or {}, loads or {}
    pool = PoolRoute("chat-7b", "v13", CAPACITY, tuple(
        replica(r, ages.get(r, 0.3), loads.get(r, 0)) for r in IDS))
    return RouterState(version, "cp-1", "1", 0.0, 1.0, (pool,))


def admitted(conversation: str | None, rid: str = "r1") -> Admitted:
    req = ChatRequest("chat-7b", None, (), 990, True, 1, True, "standard", conversation, 10)
    return Admitted(req, "search", 1_000_000, "chat-7b@v13", "v13", rid,
                    Outcome(rid, AdmissionDecision.ADMIT, AdmissionReason.FITS), {})


def routed(r: Router, conversation: str | None) -> list[str]:
    return r.route(admitted(conversation), 0.0).headers[DESTINATION_HEADER].split(",")


def by_id(s: RouterState) -> dict[str, str]:
    pool = s.pool("chat-7b@v13")
    assert pool is not None
    return {r.replica_id: r.address for r in pool.replicas}


def test_first_choices_leave_out_suspects_unless_none_is_left() -> None:
    assert first_choices(["a", "b", "c"], {"b"}) == ("a", "c")
    assert first_choices(["a", "b"], {"a", "b"}) == ("a", "b")
    assert first_choices([], set()) == ()


def test_a_stale_beat_is_above_two_intervals() -> None:
    s = state({IDS[0]: 2.0, IDS[1]: 2.01, IDS[2]: None})
    pool = s.pool("chat-7b@v13")
    assert pool is not None
    assert [s.stale(r) for r in pool.replicas] == [False, True, False, False]


def test_the_pick_skips_a_replica_whose_beat_is_stale(platform_config: PlatformConfig) -> None:
    home = ring_order(build_ring(IDS), "conv-1")
    r = Router(platform_config, MemoryPinStore(), ["chat-7b@v13"])
    fresh = state()
    r.apply_state(fresh, 0.0)
    addresses = by_id(fresh)
    assert routed(r, "conv-1") == [addresses[x] for x in home[:3]]
    r.apply_state(state({home[0]: 2.2}, version=2), 0.0)  # its home replica missed a beat
    got = routed(r, "conv-1")
    assert got == [addresses[x] for x in home[1:4]]  # not even a fallback: Envoy's ring is behind
    assert r.view()["pools"]["chat-7b@v13"]["replicas"][IDS.index(home[0])]["stale"] is True
    # it beats again: it is a first choice again
    r.apply_state(state(version=3), 0.0)
    assert routed(r, "conv-1")[0] == addresses[home[0]]
    # least tokens in flight: an idle but stale replica is not the choice either
    least = Router(platform_config, MemoryPinStore(), ["chat-7b@v13"])
    least.apply_state(state({IDS[0]: 2.1}, {IDS[1]: 10, IDS[2]: 20, IDS[3]: 30}), 0.0)
    assert routed(least, None) == [addresses[i] for i in IDS[1:]]


def test_when_every_replica_is_stale_the_pick_goes_on(platform_config: PlatformConfig) -> None:
    for picking in Picking:
        r = Router(platform_config, MemoryPinStore(), ["chat-7b@v13"], RoutingPolicy(picking))
        r.apply_state(state(dict.fromkeys(IDS, 2.5)), 0.0)
        assert len(routed(r, "conv-1")) == 3


def test_a_replica_turning_stale_is_published_at_once_and_parsed_back() -> None:
    now = [0.0]
    publisher = RouterPublisher(load_interval_s=1.0, clock=lambda: now[0],
                                wall_clock=lambda: 1e9 + now[0])
    assert publisher.offer(state())
    now[0] = 0.25
    assert not publisher.offer(state({IDS[0]: 1.2}))  # older but fresh: a load change, throttled
    assert publisher.offer(state({IDS[0]: 2.1}))  # stale: a routing change, at once
    current = publisher.current
    assert current is not None
    back = parse_router_state(json.loads(json.dumps(current.as_dict())))
    assert back == current
    pool = back.pool("chat-7b@v13")
    assert pool is not None and back.stale(pool.replicas[0])
    old = current.as_dict()
    for r in old["pools"]["chat-7b@v13"]["replicas"]:
        del r["beat_age_s"]  # a state file of an older control plane
    assert not any(back.stale(r) for p in parse_router_state(old).pools for r in p.replicas)


# A version only the control plane knows ----------------------------------------------------

CHAT = {"model": "chat-7b", "max_tokens": 50, "messages": [{"role": "user", "content": "Hi!"}]}


def registered_state(v15_replicas: int, version: int) -> RouterState:
    """chat-7b@v13 (declared) with 2 replicas, chat-7b@v15 (registered later through the admin
    API, 90,000 tokens per replica) as a 100% canary, and a model nobody declared."""
    v13 = PoolRoute("chat-7b", "v13", CAPACITY, tuple(replica(f"chat-7b@v13-{i}")
                                                     for i in range(2)))
    v15 = PoolRoute("chat-7b", "v15", 90_000, tuple(replica(f"chat-7b@v15-{i}", model_version="v15")
                                                   for i in range(v15_replicas)))
    stranger = PoolRoute("mystery", "v1", 1000, (replica("mystery@v1-0"),))
    return RouterState(version, "cp-1", "1", 0.0, 1.0, (v13, v15, stranger),
                       (ModelAlias("chat-7b", "v13", "v15", 100.0),))


async def test_a_version_registered_later_gets_a_pool_and_its_canary_share(
        tmp_path: Path, platform_config: PlatformConfig, dev_keys: dict[str, str]) -> None:
    from gateway_ext.routing.feed import RouterFeed

    settings = Settings.from_env({}, usage_db_url=f"sqlite:///{tmp_path / 'usage.db'}",
                                 spool=tmp_path / "spool", seed=1, router_state_file=None)
    runtime = build_runtime(settings, platform_config)
    states: list[RouterState] = []

    async def fetch(after: int | None, wait_s: float) -> Any:
        await asyncio.sleep(0)
        if not states:
            raise httpx.ConnectError("down")
        return states[-1].as_dict()

    feed = RouterFeed(runtime.router, runtime.lifecycle, fetch, wait_s=0.01)
    headers = {"authorization": f"Bearer {dev_keys['search']}", CONVERSATION_HEADER: "c-1"}
    body = json.dumps(CHAT).encode()
    pools = runtime.lifecycle.core.pools
    assert "chat-7b@v15" not in pools
    states.append(registered_state(0, 1))  # registered, no replica yet: no pool, canary ignored
    assert await feed.poller.poll_once()  # type: ignore[union-attr]
    assert "chat-7b@v15" not in runtime.lifecycle.core.pools
    first: Any = await runtime.lifecycle.check(headers, body)
    assert first.headers[ROUTE_VERSION_HEADER] == "chat-7b@v13"
    states.append(registered_state(2, 2))  # its replicas are up
    assert await feed.poller.poll_once()  # type: ignore[union-attr]
    pools = runtime.lifecycle.core.pools
    assert pools["chat-7b@v15"].capacity_tokens == 2 * 90_000
    assert pools["chat-7b@v15"].concurrency is pools["chat-7b@v13"].concurrency
    assert "mystery@v1" not in pools  # a model this gateway cannot authorize anyone for
    new_conversation = {**headers, CONVERSATION_HEADER: "c-2"}
    result: Any = await runtime.lifecycle.check(new_conversation, body)
    assert result.headers[ROUTE_VERSION_HEADER] == "chat-7b@v15"
    assert all(h.startswith("10.0.3.") for h in result.headers[DESTINATION_HEADER].split(","))
    again: Any = await runtime.lifecycle.check(headers, body)  # c-1 stays pinned where it started
    assert again.headers[ROUTE_VERSION_HEADER] == "chat-7b@v13"
    states.append(registered_state(1, 3))
    assert await feed.poller.poll_once()  # type: ignore[union-attr]
    assert runtime.lifecycle.core.pools["chat-7b@v15"].capacity_tokens == 90_000

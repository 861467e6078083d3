"""The gateway's pick on router state (plain data): the ring over routable replicas, loads = last
report + what this gateway sent since, the 125% bound (above a floor), least tokens without a
conversation, the header Envoy's override_host reads, capacities for admission."""

from __future__ import annotations

import json
from dataclasses import replace

from gateway_ext.decision import Admitted
from gateway_ext.limits.admission_types import AdmissionDecision, AdmissionReason, Outcome
from gateway_ext.request import ChatRequest
from gateway_ext.routing.picking import PickReason, build_ring, ring_order
from gateway_ext.routing.pins import MemoryPinStore
from gateway_ext.routing.replica_load import SentLedger
from gateway_ext.routing.router import Picking, Router, RoutingPolicy
from modelfleet.config import PlatformConfig
from modelfleet.contract.headers import DESTINATION_HEADER
from modelfleet.contract.router_state_types import PoolRoute, RoutableReplica, RouterState

IDS = [f"chat-7b@v13-{i}" for i in range(4)]
CAPACITY = 112_000
FLOOR = CAPACITY // 10


def replica(rid: str, load: int = 0, port: int | None = None) -> RoutableReplica:
    n = int(rid.rsplit("-", 1)[1])
    return RoutableReplica(rid, f"10.0.0.{n + 1}", port or 8000, "local", load, 0, 0, 0.0, True)


def state(loads: dict[str, int] | None = None, version: int = 1, instance: str = "cp-1",
          ports: dict[str, int] | None = None) -> RouterState:
    loads, ports = loads or {}, ports or {}
    pool = PoolRoute("chat-7b", "v13", CAPACITY,
                     tuple(replica(r, loads.get(r, 0), ports.get(r)) for r in IDS))
    canary = PoolRoute("chat-7b", "v14", CAPACITY, (replica("chat-7b@v14-0"),))
    return RouterState(version, instance, "1", 0.0, 1.0, (pool, canary))


def admitted(conversation: str | None, tokens: int = 1000, rid: str = "r1") -> Admitted:
    req = ChatRequest("chat-7b", None, (), tokens - 10, True, 1, True, "standard", conversation, 10)
    return Admitted(req, "search", 1_000_000, "chat-7b@v13", "v13", rid,
                    Outcome(rid, AdmissionDecision.ADMIT, AdmissionReason.FITS), {"x-route-version": "chat-7b@v13"})


def router(config: PlatformConfig, picking: Picking = Picking.AFFINITY) -> Router:
    return Router(config, MemoryPinStore(), ["chat-7b@v13", "chat-7b@v14", "reason-70b@v1"],
                  RoutingPolicy(picking))


def destination(a: Admitted) -> list[str]:
    return a.headers[DESTINATION_HEADER].split(",")


HOME = ring_order(build_ring(IDS), "conv-1")


def address(rid: str) -> str:
    return f"10.0.0.{int(rid.rsplit('-', 1)[1]) + 1}:8000"


def test_no_state_no_header_envoys_ring_hash_picks(platform_config: PlatformConfig) -> None:
    r = router(platform_config)
    a = admitted("conv-1")
    assert r.route(a, 0.0) is a


def test_the_conversations_replica_then_fallbacks_in_ring_order(
        platform_config: PlatformConfig) -> None:
    r = router(platform_config)
    r.apply_state(state(), 0.0)
    assert destination(r.route(admitted("conv-1"), 0.0)) == [address(x) for x in HOME[:3]]


def test_above_the_bound_and_the_floor_the_next_on_the_ring(platform_config: PlatformConfig) -> None:
    r = router(platform_config)
    r.apply_state(state({HOME[0]: 60_000, HOME[1]: 10_000, HOME[2]: 10_000, HOME[3]: 10_000}), 0.0)
    assert destination(r.route(admitted("conv-1"), 0.0))[0] == address(HOME[1])
    r.apply_state(state({HOME[0]: 9_000}), 5.0)  # far above the average, below the floor
    assert destination(r.route(admitted("conv-1", rid="r2"), 5.0))[0] == address(HOME[0])


def test_what_this_gateway_sent_since_the_report_counts(platform_config: PlatformConfig) -> None:
    r = router(platform_config)
    r.apply_state(state(), 0.0)
    picks = [destination(r.route(admitted("conv-1", 5000, f"r{i}"), 0.1))[0] for i in range(5)]
    # 2 x 5,000 sent: 10,000 pending, below the floor; the 3rd would be over it and the average
    assert picks[:3] == [address(HOME[0])] * 3 and address(HOME[0]) not in picks[3:]
    assert r.ledger.pending(HOME[0]) == 15_000
    for i in range(3):
        r.release(f"r{i}")  # settled
    assert r.ledger.pending(HOME[0]) == 0
    r.apply_state(state({HOME[1]: 12_000}, version=2), 10.0)  # a later report covers the rest
    assert len(r.ledger) == 0


def test_without_a_conversation_the_least_tokens_in_flight(platform_config: PlatformConfig) -> None:
    r = router(platform_config)
    r.apply_state(state({IDS[0]: 5, IDS[1]: 3, IDS[2]: 0, IDS[3]: 9}), 0.0)
    assert destination(r.route(admitted(None), 0.0)) == [address(IDS[i]) for i in (2, 1, 0)]


def test_a_replica_restarted_on_a_new_address_keeps_its_conversations(
        platform_config: PlatformConfig) -> None:
    r = router(platform_config)
    r.apply_state(state(ports={HOME[0]: 9999}), 0.0)
    assert destination(r.route(admitted("conv-1"), 0.0))[0] == address(HOME[0]).replace(
        ":8000", ":9999")


def test_baseline_policies(platform_config: PlatformConfig) -> None:
    rr = router(platform_config, Picking.ROUND_ROBIN)
    rr.apply_state(state(), 0.0)
    firsts = [destination(rr.route(admitted("conv-1", rid=f"r{i}"), 0.0))[0] for i in range(8)]
    assert firsts == [address(IDS[i % 4]) for i in range(8)]
    least = router(platform_config, Picking.LEAST_TOKENS)
    least.apply_state(state({IDS[0]: 1, IDS[1]: 1, IDS[2]: 0, IDS[3]: 1}), 0.0)
    assert destination(least.route(admitted("conv-1"), 0.0))[0] == address(IDS[2])


def test_capacity_is_routable_replicas_times_the_versions_capacity(
        platform_config: PlatformConfig) -> None:
    r = router(platform_config)
    caps = r.apply_state(state(), 0.0)
    assert caps == {"chat-7b@v13": 4 * CAPACITY, "chat-7b@v14": CAPACITY, "reason-70b@v1": 0}
    fewer = replace(state(), pools=(replace(state().pools[0], replicas=state().pools[0].replicas[:3]),))
    assert r.apply_state(fewer, 1.0)["chat-7b@v13"] == 3 * CAPACITY


def test_the_view_names_loads_and_the_bound(platform_config: PlatformConfig) -> None:
    r = router(platform_config)
    r.apply_state(state({HOME[0]: 60_000, HOME[1]: 1_000}), 0.0)
    view = r.view()
    pool = {x["replica_id"]: x for x in view["pools"]["chat-7b@v13"]["replicas"]}
    assert pool[HOME[0]]["over_bound"] and not pool[HOME[1]]["over_bound"]
    assert view["pools"]["chat-7b@v13"]["floor_tokens"] == FLOOR
    json.dumps(view)  # served as JSON by /v1/debug/routing


def test_the_ledger_forgets_what_a_report_covers() -> None:
    ledger = SentLedger(lag_s=2.0, ttl_s=60.0)
    ledger.add("a", "x", 100, now=0.0)
    ledger.add("b", "x", 50, now=1.5)
    assert ledger.loads({"x": 10, "y": 0}) == {"x": 160, "y": 0}
    ledger.reported(now=3.0)  # covers what was sent before 1.0
    assert ledger.pending("x") == 50
    ledger.expire(now=100.0)
    assert len(ledger) == 0 and ledger.pending("x") == 0


def test_pick_reason_for_a_spill() -> None:
    from gateway_ext.routing.picking import pick

    ring = build_ring(IDS)
    loads = {HOME[0]: 60_000, HOME[1]: 10_000, HOME[2]: 10_000, HOME[3]: 10_000}
    assert pick(ring, "conv-1", loads, floor_tokens=FLOOR).reason is PickReason.SPILLED
    assert pick(ring, "conv-1", loads, floor_tokens=70_000).reason is PickReason.AFFINITY

"""Admission policy of one pool: concurrency cap, guaranteed shares and bursting, the fixed
overload order, the bounded queue (timeouts, client gone, shedding the lowest tier) and the
release/dequeue path. Pure: time is a number passed in."""

from __future__ import annotations

import pytest

from gateway_ext.limits.admission import PoolAdmission, pool_capacity_tokens
from gateway_ext.limits.admission_types import (
    AdmissionConfig,
    AdmissionDecision,
    AdmissionReason,
    AdmissionRequest,
    Outcome,
)
from gateway_ext.limits.concurrency import TeamConcurrency
from modelfleet.config.schema import Tier

A, Q, R429, S503 = AdmissionDecision.ADMIT, AdmissionDecision.QUEUE, AdmissionDecision.REJECT_429, AdmissionDecision.SHED_503


def rq(rid: str, team: str = "a", tier: Tier = "standard", tokens: int = 100,
       max_concurrency: int = 100, share: float = 0.5) -> AdmissionRequest:
    return AdmissionRequest(rid, team, tier, tokens, max_concurrency, share)


def pool(capacity: int = 1000, max_queue: int = 3) -> PoolAdmission:
    return PoolAdmission(capacity, AdmissionConfig(max_queue=max_queue))


def decided(outcomes: list[Outcome]) -> list[tuple[str, AdmissionDecision, AdmissionReason]]:
    return [(o.request_id, o.decision, o.reason) for o in outcomes]


def test_capacity_is_tokens_in_flight_per_replica_times_replicas() -> None:
    assert pool_capacity_tokens(112_000, 12) == 1_344_000


def test_admits_while_it_fits_and_releases_free_capacity() -> None:
    p = pool()
    for i in range(5):
        assert p.offer(rq(f"r{i}", tokens=200, share=1.0), 0).decision is A
    assert p.view().in_flight_tokens == 1000
    assert p.offer(rq("r5", "b", tokens=1), 0).decision is Q
    assert decided(p.release("r0", 1)) == [("r5", A, AdmissionReason.FITS)]
    assert p.view().in_flight_tokens == 801
    assert p.release("r0", 2) == []  # releasing twice is harmless
    assert p.view().in_flight_tokens == 801


def test_concurrency_cap_counts_admitted_and_queued() -> None:
    p = pool(capacity=300)
    assert p.offer(rq("x", "x", tokens=300, share=1.0), 0).decision is A
    assert p.offer(rq("r1", tokens=100, max_concurrency=2), 0).decision is Q
    assert p.offer(rq("r2", tokens=50, max_concurrency=2), 0).decision is Q
    out = p.offer(rq("r3", max_concurrency=2), 0)
    assert (out.decision, out.reason, out.retry_after_s) == (R429, AdmissionReason.MAX_CONCURRENCY, 1.0)
    assert p.concurrency.in_use("a") == 2
    p.release("r2", 1)  # the client went away while queued
    assert p.offer(rq("r4", tokens=50, max_concurrency=2), 1).decision is Q


def test_concurrency_is_shared_by_the_pools_of_a_model() -> None:
    shared = TeamConcurrency()
    live, canary = PoolAdmission(1000, concurrency=shared), PoolAdmission(1000, concurrency=shared)
    assert live.offer(rq("r1", max_concurrency=2), 0).decision is A
    assert canary.offer(rq("r2", max_concurrency=2), 0).decision is A
    assert live.offer(rq("r3", max_concurrency=2), 0).reason is AdmissionReason.MAX_CONCURRENCY
    canary.release("r2", 1)
    assert live.offer(rq("r4", max_concurrency=2), 1).decision is A


def test_a_team_bursts_into_idle_capacity_then_gets_429_above_its_share() -> None:
    p = pool()
    first = p.offer(rq("a1", "a", tokens=150, share=0.2), 0)
    assert (first.decision, first.reason) == (A, AdmissionReason.FITS)
    burst = p.offer(rq("a2", "a", tokens=750, share=0.2), 0)
    assert (burst.decision, burst.reason) == (A, AdmissionReason.BURST)
    over = p.offer(rq("a3", "a", tokens=200, share=0.2), 0)
    assert (over.decision, over.reason, over.retry_after_s) == (R429, AdmissionReason.ABOVE_SHARE, 2.0)
    inside = p.offer(rq("b1", "b", tokens=200, share=0.5), 0)  # b holds nothing: inside its share
    assert (inside.decision, inside.reason) == (Q, AdmissionReason.POOL_FULL)
    assert decided(p.release("a2", 1)) == [("b1", A, AdmissionReason.FITS)]


def test_overload_order_batch_pauses_first() -> None:
    p = pool()
    assert p.offer(rq("s1", tokens=850, share=0.2), 0).decision is A  # a bursts to 85%
    paused = p.offer(rq("b1", "b", "batch", tokens=100), 0)  # 95% > batch ceiling 90%
    assert (paused.decision, paused.reason) == (Q, AdmissionReason.BATCH_PAUSED)
    # between the batch ceiling and 100%, other tiers still run, bursting teams too
    assert p.offer(rq("s2", tokens=100, share=0.2), 0).reason is AdmissionReason.BURST
    # at 100%: the team above its share gets 429; standard inside its share queues
    assert p.offer(rq("s3", tokens=100, share=0.2), 0).decision is R429
    assert p.offer(rq("c1", "c", tokens=100), 0).reason is AdmissionReason.POOL_FULL
    assert p.view().queued == {"interactive": 0, "standard": 1, "batch": 1}


def test_standard_queues_behind_interactive_and_batch_runs_last() -> None:
    p = pool(max_queue=10)
    assert p.offer(rq("full", "x", tokens=1000, share=1.0), 0).decision is A
    arrivals: list[tuple[str, Tier]] = [("b1", "batch"), ("s1", "standard"), ("i1", "interactive"),
                                        ("s2", "standard"), ("i2", "interactive")]
    for rid, tier in arrivals:
        assert p.offer(rq(rid, rid, tier, tokens=250), 0).decision is Q
    admitted = p.release("full", 1)
    assert [o.request_id for o in admitted] == ["i1", "i2", "s1", "s2"]
    assert all(o.waited_s == 1 for o in admitted)
    p.release("s2", 2)  # 750 in flight: batch would reach 100% > 90% ceiling
    assert p.view().queued["batch"] == 1
    assert decided(p.release("s1", 3)) == [("b1", A, AdmissionReason.FITS)]


def test_a_new_request_does_not_jump_the_queue_of_its_tier() -> None:
    p = pool()
    assert p.offer(rq("big", "x", tokens=950, share=1.0), 0).decision is A
    assert p.offer(rq("i1", "b", "interactive", tokens=100), 0).decision is Q
    # 10 tokens would fit, but an interactive request is waiting
    assert p.offer(rq("s1", "c", tokens=10), 0).decision is Q
    assert p.offer(rq("i2", "d", "interactive", tokens=10), 0).decision is Q
    assert [o.request_id for o in p.release("big", 1)] == ["i1", "i2", "s1"]


def test_head_of_line_is_strict_within_and_across_tiers() -> None:
    p = pool()
    assert p.offer(rq("r0", "x", tokens=600, share=1.0), 0).decision is A
    assert p.offer(rq("i1", "a", "interactive", tokens=500), 0).decision is Q
    assert p.offer(rq("s1", "b", tokens=100), 0).decision is Q
    assert p.release("nothing", 1) == []
    assert decided(p.release("r0", 2)) == [("i1", A, AdmissionReason.FITS), ("s1", A, AdmissionReason.FITS)]


def test_past_the_queue_limit_the_lowest_tier_present_is_shed() -> None:
    p = pool(max_queue=3)
    assert p.offer(rq("full", "x", tokens=1000, share=1.0), 0).decision is A
    arrivals: list[tuple[str, Tier]] = [("s1", "standard"), ("b1", "batch"), ("b2", "batch")]
    for rid, tier in arrivals:
        assert p.offer(rq(rid, rid, tier), 0).decision is Q
    out = p.offer(rq("s2", "s2"), 1)  # evicts the newest batch entry
    assert (out.decision, out.reason) == (Q, AdmissionReason.POOL_FULL)
    assert decided(list(out.shed)) == [("b2", S503, AdmissionReason.QUEUE_FULL)]
    assert out.shed[0].retry_after_s == 5.0 and out.shed[0].waited_s == 1
    lowest = p.offer(rq("b3", "b3", "batch"), 1)  # the arrival is the lowest tier: shed itself
    assert (lowest.decision, lowest.reason, lowest.shed) == (S503, AdmissionReason.QUEUE_FULL, ())
    out = p.offer(rq("s3", "s3"), 1)
    assert [o.request_id for o in out.shed] == ["b1"]
    tie = p.offer(rq("s4", "s4"), 1)  # only standard left: the newest (the arrival) goes
    assert tie.decision is S503
    assert p.view().queued == {"interactive": 0, "standard": 3, "batch": 0}
    assert p.concurrency.in_use("b1") == 0 and p.concurrency.in_use("b2") == 0


def test_interactive_inside_its_guarantee_is_never_shed() -> None:
    p = pool(max_queue=2)
    assert p.offer(rq("full", "x", tokens=1000, share=0.1), 0).decision is A
    assert p.offer(rq("s1", "s1"), 0).decision is Q
    assert p.offer(rq("s2", "s2"), 0).decision is Q
    out = p.offer(rq("i1", "i1", "interactive"), 0)
    assert out.decision is Q and [o.request_id for o in out.shed] == ["s2"]
    out = p.offer(rq("i2", "i2", "interactive"), 0)
    assert out.decision is Q and [o.request_id for o in out.shed] == ["s1"]
    out = p.offer(rq("i3", "i3", "interactive"), 0)  # nothing sheddable: the bound gives way
    assert (out.decision, out.shed) == (Q, ())
    assert p.offer(rq("s3", "s3"), 0).decision is S503
    assert p.expire(800) == []  # interactive has no queue timeout by default
    assert p.view().queued["interactive"] == 3


def test_interactive_above_its_share_is_not_protected() -> None:
    p = pool()
    assert p.offer(rq("a1", "a", "interactive", tokens=1000, share=0.3), 0).decision is A
    out = p.offer(rq("a2", "a", "interactive", tokens=10, share=0.3), 0)
    assert (out.decision, out.reason) == (R429, AdmissionReason.ABOVE_SHARE)


def test_queued_tokens_count_towards_the_share() -> None:
    p = pool()
    assert p.offer(rq("x", "x", tokens=1000, share=1.0), 0).decision is A
    assert p.offer(rq("a1", "a", tokens=200, share=0.3), 0).decision is Q
    assert p.offer(rq("a2", "a", tokens=100, share=0.3), 0).decision is Q
    assert p.offer(rq("a3", "a", tokens=1, share=0.3), 0).decision is R429


def test_queue_timeouts_per_tier() -> None:
    p = PoolAdmission(1000, AdmissionConfig(queue_timeout_s={
        "interactive": 5.0, "standard": 20.0, "batch": 300.0}))
    assert p.offer(rq("full", "x", tokens=1000, share=1.0), 0).decision is A
    arrivals: list[tuple[str, Tier]] = [("i1", "interactive"), ("s1", "standard"), ("b1", "batch")]
    for rid, tier in arrivals:
        assert p.offer(rq(rid, rid, tier), 10).decision is Q
    assert p.next_deadline() == 15
    assert p.expire(14.999) == []
    assert decided(p.expire(15)) == [("i1", S503, AdmissionReason.QUEUE_TIMEOUT)]
    out = p.expire(30)
    assert decided(out) == [("s1", S503, AdmissionReason.QUEUE_TIMEOUT)] and out[0].waited_s == 20
    assert p.next_deadline() == 310
    assert decided(p.expire(310)) == [("b1", S503, AdmissionReason.QUEUE_TIMEOUT)]
    assert p.next_deadline() is None and p.concurrency.in_use("s1") == 0


def test_a_client_gone_while_queued_is_removed_and_unblocks_the_line() -> None:
    p = pool()
    assert p.offer(rq("r0", "x", tokens=900, share=1.0), 0).decision is A
    assert p.offer(rq("big", "a", tokens=500), 0).decision is Q
    assert p.offer(rq("small", "b", tokens=100), 0).decision is Q
    assert decided(p.release("big", 1)) == [("small", A, AdmissionReason.FITS)]
    assert p.view().queued["standard"] == 0 and p.view().in_flight_tokens == 1000


def test_admitted_requests_never_released_expire() -> None:
    p = PoolAdmission(1000, AdmissionConfig(in_flight_ttl_s=900.0,
                                            queue_timeout_s={"standard": None}))
    assert p.offer(rq("lost", "x", tokens=1000, share=1.0), 0).decision is A
    assert p.offer(rq("s1", "b", tokens=100), 10).decision is Q
    assert p.expire(899) == []
    assert decided(p.expire(900)) == [("s1", A, AdmissionReason.FITS)]
    assert p.view().in_flight_tokens == 100 and p.concurrency.in_use("x") == 0


def test_capacity_changes_admit_queued_requests() -> None:
    p = pool(capacity=0)
    assert p.offer(rq("s1"), 0).reason is AdmissionReason.POOL_FULL  # no replica yet: queue, not 429
    assert p.offer(rq("i1", tier="interactive"), 0).decision is Q
    assert p.offer(rq("b1", tier="batch"), 0).decision is Q
    assert [o.request_id for o in p.set_capacity(pool_capacity_tokens(1000, 1), 5)] == [
        "i1", "s1", "b1"]


def test_an_idle_pool_runs_a_request_larger_than_itself() -> None:
    p = pool(capacity=1000)
    assert p.offer(rq("huge", tokens=5000, share=1.0), 0).decision is A
    assert p.offer(rq("next", "b", tokens=1), 0).decision is Q


def test_offering_the_same_request_twice_is_a_bug() -> None:
    p = pool()
    p.offer(rq("r1"), 0)
    with pytest.raises(ValueError):
        p.offer(rq("r1"), 0)

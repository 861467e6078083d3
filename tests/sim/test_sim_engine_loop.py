"""The simulator's event loop: the same seed gives the same run, every admitted request finishes
and settles, the replicas' tokens in flight match their engines, the gateway's refusals are
the production policy's, and the desired-replica rule adds replicas after a cold start."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from modelfleet.config import PlatformConfig, load_config
from sim.drills.common import pool_under_test, with_capacity
from sim.fleet.gateway import Routing
from sim.fleet.measures import Result, counts
from sim.fleet.region import Fleet, simulate
from sim.fleet.scaling import ColdStart, scale_down_order, scaler_setup
from sim.fleet.types import FleetSpec
from sim.traces.arrivals import Arrival, TeamMix, TeamShare
from sim.traces.synthetic import CHAT, chat_arrivals

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def config() -> PlatformConfig:
    return load_config(REPO / "config").config


def small(config: PlatformConfig, **over: object) -> FleetSpec:
    put = pool_under_test(config)
    spec = FleetSpec(put.params, replicas=2, warmup_s=10.0, duration_s=30.0, tail_s=60.0,
                     capacity_tokens_per_replica=put.capacity_tokens_per_replica)
    return dataclasses.replace(spec, **over)  # type: ignore[arg-type]


def load(rate: float, seconds: float, seed: int = 1) -> list[Arrival]:
    return list(chat_arrivals(dataclasses.replace(CHAT, rate_rps=rate), seconds, seed))


def test_same_seed_same_run_and_other_seed_other_run(config: PlatformConfig) -> None:
    spec = small(config, duration_s=15.0, tail_s=5.0)
    a = simulate(spec, config, load(10, 30))
    b = simulate(spec, config, load(10, 30))
    c = simulate(spec, config, load(10, 30, seed=2))
    assert a.rows == b.rows and a.samples == b.samples and a.output_tokens == b.output_tokens
    assert a.rows != c.rows


def test_every_admitted_request_finishes_and_settles(config: PlatformConfig) -> None:
    fleet = Fleet(small(config), config, None)
    m = fleet.run(load(10, 40))
    assert counts(m.rows, lambda r: "all") == {"all": {"ok": len(m.rows)}}
    assert all(r.ttft_s < 5 and r.stream_tokens_per_s > 30 for r in m.rows)
    assert not fleet.reqs and fleet.gw.pool.view().in_flight_tokens == 0
    for rep in fleet.replicas.values():
        assert not rep.held and rep.tokens_in_flight == 0 == rep.engine.stats().tokens_in_flight


def test_tokens_in_flight_match_the_engines_mid_run(config: PlatformConfig) -> None:
    fleet = Fleet(small(config, tail_s=0.0, duration_s=15.0), config, None)
    fleet.run(load(20, 60))
    assert any(rep.held for rep in fleet.replicas.values())
    for rep in fleet.replicas.values():
        if rep.busy:  # the step in progress has taken its tokens already
            continue
        assert rep.tokens_in_flight == rep.engine.stats().tokens_in_flight


def test_a_request_longer_than_the_context_is_refused_by_the_replica(config: PlatformConfig) -> None:
    arrivals = [Arrival(11.0, 9000, 10, "c1", "search", "interactive"),
                Arrival(11.5, 100, 10, "c2", "search", "interactive")]
    m = simulate(small(config), config, arrivals)
    assert [r.result for r in m.rows] == [Result.INVALID_400, Result.OK]


def test_the_gateway_refuses_with_the_production_policy(config: PlatformConfig) -> None:
    # research's bucket holds 1,000,000 tokens: of 200 requests of 6,100 tokens in a second 163
    # fit (37 get 429), and its max_concurrency of 100 turns 63 more away (429); research may
    # not send interactive requests (403, counted with the 400s)
    team, tier = TeamMix((TeamShare("research", "standard", 1.0),)).assign("x", 1)
    burst = [Arrival(10.0 + i / 200, 6000, 100, f"c{i}", team, tier) for i in range(200)]
    # 12 replicas hold 1,344,000 tokens in flight: admission bursts them all in
    m = simulate(small(config, replicas=12, duration_s=2.0, tail_s=0.0), config, burst)
    results = counts(m.rows, lambda r: r.team)["research"]
    assert results["429"] == 37 + 63 and results["unfinished"] == 100
    forbidden = [Arrival(10.0, 100, 10, "c1", "research", "interactive")]
    assert simulate(small(config), config, forbidden).rows[0].result is Result.INVALID_400


def test_direct_mode_skips_buckets_and_admission(config: PlatformConfig) -> None:
    burst = [Arrival(10.0 + i / 200, 6000, 20, f"c{i}", "research", "standard") for i in range(200)]
    m = simulate(small(config, gateway=False, replicas=1, tail_s=200.0), config, burst)
    assert all(r.result is Result.OK for r in m.rows)


def test_the_rule_adds_replicas_after_the_cold_start(config: PlatformConfig) -> None:
    put = pool_under_test(config)
    assert put.pool is not None
    pool = put.pool.model_copy(update={"min_replicas": 1, "max_replicas": 4})
    setup = scaler_setup(pool, put.version, cold_start=ColdStart(node_start_s=30.0, load_s=10.0))
    spec = small(config, replicas=1, scaler=setup, warmup_s=0.0, duration_s=120.0, tail_s=0.0,
                 routing=Routing.LEAST_LOADED)
    m = simulate(spec, config, load(20, 120))
    requested = [(t, rid) for t, rid, e in m.scale_events if e == "requested"]
    serving = {rid: t for t, rid, e in m.scale_events if e == "serving"}
    assert requested, "the overloaded pool asked for replicas"
    t0, rid = requested[0]
    assert serving[rid] == pytest.approx(t0 + 40.0)
    assert max(s.serving for s in m.samples) > 1


def test_scale_down_cancels_cold_starts_before_draining_and_newest_first() -> None:
    pool = [("a", False, 0.0), ("b", True, 300.0), ("c", False, 50.0), ("d", True, 400.0)]
    assert scale_down_order(pool) == ["d", "b", "c", "a"]


def test_measured_capacity_replaces_the_configured_one(config: PlatformConfig) -> None:
    put = with_capacity(pool_under_test(config), 55_000)
    assert put.capacity_tokens_per_replica == put.version.capacity.tokens_in_flight == 55_000
    assert put.pool is not None
    assert scaler_setup(put.pool, put.version).tokens_target == 0.7 * 55_000
    with pytest.raises(ValueError):
        with_capacity(put, 0)

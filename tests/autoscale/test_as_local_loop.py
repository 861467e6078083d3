"""The local loop's pure policy (autoscale.local_loop) on a fake model clock: which replicas to
start and stop, a ramp up and the slow way down, the readings, and the reasons status shows.

Pool used: chat-7b@v13 bounds 1..4 (declared in us-east-1), the seed's policy: tokens target
78,400 per replica, queue target 8, up max(100%, 4 pods)/15 s, down 1 pod/600 s after 600 s.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from autoscale.local_loop import (
    Changes,
    LocalPool,
    Member,
    PoolLoad,
    cold_start_wall_s,
    drain_wall_s,
    local_pool,
    model_time_s,
    pool_for,
    replica_changes,
    sync_period_wall_s,
    sync_pool,
)
from autoscale.rule import ScaleReason, ScalerState
from modelfleet.config.schema import PlatformConfig, Pool

AT = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)  # no peak declared: cron plays no part


@pytest.fixture
def config(example_config: PlatformConfig) -> PlatformConfig:
    small = Pool(model="chat-7b", version="v13", region="eu-west-1", min_replicas=1, max_replicas=4)
    others = tuple(p for p in example_config.pools if not (p.key == "chat-7b@v13" and p.region == "eu-west-1"))
    return example_config.model_copy(update={"pools": (small, *others)})


@pytest.fixture
def pool(config: PlatformConfig) -> LocalPool:
    found = local_pool(config, "chat-7b@v13", "eu-west-1")
    assert found is not None
    return found


def serving(n: int, since: float = 0.0) -> list[Member]:
    return [Member(f"r{i}", "serving", since + i) for i in range(n)]


def test_bounds_come_from_the_local_region_then_the_first_declared_pool(config: PlatformConfig) -> None:
    local = pool_for(config, "chat-7b@v13", "eu-west-1")
    assert local is not None and (local.min_replicas, local.max_replicas) == (1, 4)
    first = pool_for(config, "chat-7b@v13", "local")  # no pool in "local": the first declared
    assert first is not None and first.region == "eu-west-1"
    assert pool_for(config, "chat-7b@v99", "local") is None
    assert local_pool(config, "chat-7b@v99", "local") is None


def test_time_scale_divides_every_duration(pool: LocalPool) -> None:
    assert model_time_s(110.0, 100.0, 20.0) == 200.0
    assert pool.cold_start_s == 312.0                    # 240 + 28 + 14 + 30
    assert cold_start_wall_s(pool, 100.0) == pytest.approx(3.12)
    assert sync_period_wall_s(pool, 10.0) == 1.5         # 15 s / 10
    assert sync_period_wall_s(pool, 100.0) == 0.5        # 0.15 s, floored
    # preStop 12 s -> 0.12 s, floored to 1.5 s of wall time; stream bound 137 s -> 1.37 s
    grace, kill_after = drain_wall_s(pool, 100.0)
    assert grace == 1.5 and kill_after == pytest.approx(1.5 + 1.37 + 2.0)
    assert drain_wall_s(pool, 1.0) == (12.0, 12.0 + 137.0 + 2.0)


def test_changes_start_the_difference_and_stop_cold_starts_first_then_the_newest() -> None:
    members = [Member("a", "serving", 0), Member("b", "serving", 50), Member("c", "starting", 90),
               Member("d", "starting", 80), Member("e", "draining", 95)]
    assert replica_changes(6, members) == Changes(start=2)      # draining "e" does not count
    assert replica_changes(4, members) == Changes()
    assert replica_changes(3, members) == Changes(stop=("c",))
    assert replica_changes(1, members) == Changes(stop=("c", "d", "b"))


def test_queue_depth_adds_the_gateway_queue_and_only_the_engines_can_fail() -> None:
    assert PoolLoad(10.0, 3.0, 5.0).queue_depth == 8.0
    assert PoolLoad(10.0, 3.0, None).queue_depth == 3.0          # gateway unread: counts 0
    assert PoolLoad(None, None, 5.0).queue_depth is None         # engines unread: a failed read


def test_a_ramp_scales_up_at_once_and_down_one_replica_per_600_s(pool: LocalPool) -> None:
    state, members, t = ScalerState(), serving(1), 0.0
    # 1 replica at 70,000 tokens: r = 0.89, inside the 10% band -> stays 1.
    step = sync_pool(pool, state, members, PoolLoad(70_000, 0, 0), t, AT)
    assert (step.decision.replicas, step.changes) == (1, Changes())
    # The gateway holds 20 requests for the pool: queue 20 / 8 -> 3, tokens 150,000 -> 2.
    t += 15
    step = sync_pool(pool, step.decision.state, members, PoolLoad(150_000, 0, 20), t, AT)
    assert (step.decision.replicas, step.changes) == (3, Changes(start=2))
    assert step.report["why"] == "queue-depth 20 vs target 8/replica x 1 -> 3"
    assert (step.report["current"], step.report["desired"]) == (1, 3)
    # Two replicas start (cold start): they count as asked for, so nothing more is started.
    members = [*members, Member("r1", "starting", t), Member("r2", "starting", t)]
    t += 15
    step = sync_pool(pool, step.decision.state, members, PoolLoad(150_000, 0, 20), t, AT)
    assert step.changes == Changes() and step.report["starting"] == 2
    # They serve; the load goes. Held by the 600 s window, then one replica per 600 s.
    members = serving(3, since=t)
    removed: list[tuple[float, str]] = []
    state = step.decision.state
    for _ in range(int(2400 / 15)):
        t += 15
        step = sync_pool(pool, state, members, PoolLoad(0, 0, 0), t, AT)
        state = step.decision.state
        for rid in step.changes.stop:
            removed.append((t, rid))
            members = [m for m in members if m.replica_id != rid]
        if t == 45 + 300:
            assert "held at 3: scale-down stabilisation window (600 s)" in step.report["why"]
    # The last recommendation of 3 (t = 30) leaves the window (times after t - 600) at t = 630;
    # each later step waits a whole 600 s period.
    assert [rid for _, rid in removed] == ["r2", "r1"]
    assert removed[0][0] == 630 and removed[1][0] - removed[0][0] == 600
    assert len(members) == 1 and step.report["why"].endswith("warm minimum 1")


def test_scale_down_between_steps_names_the_rate_policy(pool: LocalPool) -> None:
    state, members = ScalerState(), serving(4)
    step = sync_pool(pool, state, members, PoolLoad(300_000, 0, 0), 0.0, AT)  # 300,000 / 78,400 -> 4
    step = sync_pool(pool, step.decision.state, members, PoolLoad(0, 0, 0), 615.0, AT)
    assert step.decision.replicas == 3
    members = members[:3]
    step = sync_pool(pool, step.decision.state, members, PoolLoad(0, 0, 0), 630.0, AT)
    assert step.decision.replicas == 3
    assert "scale-down rate (1 pod(s) per 600 s)" in step.report["why"]


def test_a_failed_read_holds_the_pool_and_says_so(pool: LocalPool) -> None:
    step = sync_pool(pool, ScalerState(), serving(3), PoolLoad(None, None, 4), 0.0, AT)
    assert (step.decision.replicas, step.decision.reason) == (3, ScaleReason.METRICS_MISSING)
    assert step.report["why"].startswith("read failed: tokens-in-flight, queue-depth; holding 3")
    rows = {r["trigger"]: r for r in step.report["triggers"]}
    assert rows["tokens-in-flight"]["value"] is None and rows["tokens-in-flight"]["failures"] == 1


def test_a_lost_metric_falls_back_to_the_pool_maximum(pool: LocalPool) -> None:
    state, t = ScalerState(), 0.0
    for _ in range(4):   # more than 3 failed reads in a row: KEDA's fallback (the pool's max)
        step = sync_pool(pool, state, serving(2), PoolLoad(None, None), t, AT)
        state, t = step.decision.state, t + 15
    assert step.decision.replicas == 4
    assert "fallback" in step.report["why"]


def test_a_pool_below_its_minimum_is_raised_at_once(pool: LocalPool) -> None:
    step = sync_pool(pool, ScalerState(), [], PoolLoad(0, 0, 0), 0.0, AT)
    assert (step.decision.replicas, step.changes.start) == (1, 1)
    assert step.report["reason"] == "below-min"

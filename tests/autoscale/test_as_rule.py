"""The desired-replica rule against cases worked out by hand from the HPA documentation.

Notation in the comments: ``r`` is the usage ratio, ``tol`` 0.1. AverageValue: r = sum /
(target x current); outside the band (|1 - r| > tol) the proposal is ceil(sum / target).
Value: r = value / target; proposal ceil(r x current). Windows hold times strictly after
``now - window``; ``period start`` = current - added + removed within the policy period.

The chat pool: min 6, max 16, tokens target 78,400 (0.7 x 112,000) and queue target 8 per
replica; scale up max(100%, 4 pods) per 15 s; scale down 1 pod per 600 s after a 600 s window;
fallback 16 replicas after more than 3 failed reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from autoscale.hpa import Behavior, ScalingPolicy, ScalingRules
from autoscale.policy import behavior
from autoscale.rule import Reading, ScaleReason, ScalerSpec, ScalerState, desired_replicas
from modelfleet.config.autoscaling import AutoscalePolicy

UP = ScalingRules(0, (ScalingPolicy("Percent", 100, 15), ScalingPolicy("Pods", 4, 15)), "Max")
DOWN = ScalingRules(600, (ScalingPolicy("Pods", 1, 600),), "Min")
CHAT = ScalerSpec(6, 16, Behavior(UP, DOWN), tolerance=0.1, fallback_replicas=16, failure_threshold=3)
HPA_DEFAULT = ScalerSpec(6, 16)  # Kubernetes' default behaviour, no fallback
KEDA_ZERO = ScalerSpec(0, 4, Behavior(UP, DOWN), cooldown_s=300)


def tok(value: float | None) -> Reading:
    return Reading("tokens-in-flight", 78_400, value)


def que(value: float | None) -> Reading:
    return Reading("queue-depth", 8, value)


def cron(desired: int, active: bool) -> Reading:
    return Reading("peak-morning", 1, desired if active else 1, active=active)


@dataclass(frozen=True)
class Case:
    id: str
    readings: tuple[Reading, ...]
    current: int
    expected: int
    reason: ScaleReason
    now: float = 1000.0
    state: ScalerState = field(default_factory=ScalerState)
    spec: ScalerSpec = CHAT


CASES = [
    # tokens r = 600,000 / (78,400 x 6 = 470,400) = 1.276 -> ceil(7.65) = 8; queue 0 -> 0.
    # max 8; up limit max(6 x 2 = 12, 6 + 4 = 10) = 12 -> 8.
    Case("scale-up-on-tokens", (tok(600_000), que(0)), 6, 8, ScaleReason.SCALED),
    # tokens r = 500,000 / 470,400 = 1.063, |1 - r| = 0.063 <= 0.1 -> 6; queue -> 0; max 6.
    Case("tolerance-above-target", (tok(500_000), que(0)), 6, 6, ScaleReason.UNCHANGED),
    # r = 720,000 / 784,000 = 0.918, 0.082 <= 0.1 -> 10.
    Case("tolerance-below-target", (tok(720_000), que(0)), 10, 10, ScaleReason.UNCHANGED),
    # r = 700,000 / 784,000 = 0.893, 0.107 > 0.1 -> ceil(8.93) = 9; no history to hold it;
    # down limit 10 - 1 = 9 -> 9.
    Case("just-outside-tolerance", (tok(700_000), que(0)), 10, 9, ScaleReason.SCALED),
    # tokens r = 400,000 / 470,400 = 0.85 -> ceil(5.10) = 6; queue r = 80 / 48 = 1.67 ->
    # ceil(80 / 8) = 10; the highest trigger wins: 10 <= up limit 12.
    Case("queue-is-the-fast-trigger", (tok(400_000), que(80)), 6, 10, ScaleReason.SCALED),
    # r = 300,000 / 784,000 = 0.383 -> 4; the 600 s window (-300, 300] holds the 10 recorded at
    # t = 0: stabilised = min(max(10, 4), max(4, 10)) = 10.
    Case("window-holds-scale-down", (tok(300_000), que(0)), 10, 10, ScaleReason.UNCHANGED,
         now=300, state=ScalerState(recommendations=((0.0, 10),))),
    # At t = 600 the window (0, 600] excludes t = 0: stabilised 4; down limit 10 - 1 = 9.
    Case("window-passed-one-replica", (tok(300_000), que(0)), 10, 9, ScaleReason.SCALED,
         now=600, state=ScalerState(recommendations=((0.0, 10),))),
    # r = 300,000 / 705,600 -> 4; window (300, 900] holds only 4 -> 4; but one pod left at
    # t = 600: period start 9 + 1 = 10, limit 10 - 1 = 9 = current -> no change.
    Case("one-per-600s-holds", (tok(300_000), que(0)), 9, 9, ScaleReason.UNCHANGED, now=900,
         state=ScalerState(recommendations=((600.0, 4),), scale_downs=((600.0, 1),))),
    # At t = 1200 the removal at t = 600 is out of (600, 1200]: period start 9, limit 8.
    Case("next-period-one-more", (tok(300_000), que(0)), 9, 8, ScaleReason.SCALED, now=1200,
         state=ScalerState(recommendations=((600.0, 4),), scale_downs=((600.0, 1),))),
    # r = 2,000,000 / 470,400 = 4.25 -> ceil(25.5) = 26; up limit max(12, 10) = 12.
    Case("scale-up-policy-limit", (tok(2_000_000), que(0)), 6, 12, ScaleReason.SCALED),
    # 6 added at t = 0, inside (-5, 10]: period start 12 - 6 = 6, limit max(12, 10) = 12 = current.
    Case("scale-up-waits-for-period", (tok(2_000_000), que(0)), 12, 12, ScaleReason.UNCHANGED,
         now=10, state=ScalerState(scale_ups=((0.0, 6),))),
    # At t = 15 the event is out of (0, 15]: limit max(24, 16) = 24; max clamp 16.
    Case("max-clamp", (tok(2_000_000), que(0)), 12, 16, ScaleReason.SCALED,
         now=15, state=ScalerState(scale_ups=((0.0, 6),))),
    # Current 18 > max 16: the HPA sets max at once, whatever the metrics say.
    Case("above-max", (tok(0), que(0)), 18, 16, ScaleReason.ABOVE_MAX),
    # Current 4 < min 6: set to the warm minimum at once.
    Case("below-min", (tok(5_000_000), que(0)), 4, 6, ScaleReason.BELOW_MIN),
    # Default behaviour (100% per 15 s down, 300 s window, no history): proposals 0, 0 ->
    # down limit int(10 x 0) = 0 -> the min clamp, 6.
    Case("min-clamp", (tok(0), que(0)), 10, 6, ScaleReason.SCALED, spec=HPA_DEFAULT),
    # Tokens read failed once (1 <= 3, no fallback yet); queue 0 -> 0 < 10: the HPA does not
    # scale down on partial metrics.
    Case("missing-metric-holds", (tok(None), que(0)), 10, 10, ScaleReason.METRICS_MISSING),
    # Tokens failed, but queue r = 80 / 48 -> 10 > 6: scaling up on the metrics that work.
    Case("missing-metric-scale-up", (tok(None), que(80)), 6, 10, ScaleReason.SCALED),
    # 4th failure in a row > threshold 3: tokens read as 78,400 x 16; r = 16 / 10 = 1.6 ->
    # 16; up limit max(20, 14) = 20 -> 16.
    Case("fallback-after-threshold", (tok(None), que(0)), 10, 16, ScaleReason.SCALED,
         state=ScalerState(failures=(("tokens-in-flight", 3),))),
    # 3rd failure: not more than 3 yet -> still a failed metric, and the queue says 0: hold.
    Case("fallback-not-yet", (tok(None), que(0)), 10, 10, ScaleReason.METRICS_MISSING,
         state=ScalerState(failures=(("tokens-in-flight", 2),))),
    # Tokens r = 200,000 / 470,400 -> ceil(2.55) = 3; cron active: r = 12 / 6 = 2 -> 12;
    # max 12 = up limit 12.
    Case("cron-raises-floor", (tok(200_000), que(0), cron(12, True)), 6, 12, ScaleReason.SCALED),
    # Cron r = 12 / 11 = 1.09, inside the tolerance -> 11; tokens -> 3: max 11. The HPA's band
    # applies to a cron floor too: plan peaks at least 10% above the expected count.
    Case("cron-inside-tolerance", (tok(200_000), que(0), cron(12, True)), 11, 11, ScaleReason.UNCHANGED),
    # Outside the window the cron trigger reads 1 -> proposal 1; tokens 3: max 3;
    # down limit 5, min 6 -> 6, the warm minimum.
    Case("cron-outside-window", (tok(200_000), que(0), cron(12, False)), 6, 6, ScaleReason.UNCHANGED),
    # Value metric: r = 150 / 100 = 1.5 -> ceil(1.5 x 4) = 6 <= up limit max(8, 8).
    Case("value-metric", (Reading("latency", 100, 150, "Value"),), 4, 6, ScaleReason.SCALED,
         spec=ScalerSpec(1, 10)),
    # r = 105 / 100 = 1.05 -> inside the band: 4.
    Case("value-metric-tolerance", (Reading("latency", 100, 105, "Value"),), 4, 4,
         ScaleReason.UNCHANGED, spec=ScalerSpec(1, 10)),
    # selectPolicy Min: r = 2,000,000 / 784,000 -> 26; limits 20 (100%) and 14 (4 pods): min 14.
    Case("select-policy-min", (tok(2_000_000),), 10, 14, ScaleReason.SCALED,
         spec=ScalerSpec(1, 40, Behavior(ScalingRules(0, UP.policies, "Min"), DOWN))),
    # Percent down: int(7 x (1 - 0.5)) = int(3.5) = 3 -> proposal 0 held at 3.
    Case("percent-scale-down-rounds-down", (tok(0),), 7, 3, ScaleReason.SCALED,
         spec=ScalerSpec(1, 16, Behavior(UP, ScalingRules(0, (ScalingPolicy("Percent", 50, 60),))))),
    # Up window 60 s: r = 940,800 / 470,400 = 2 -> 12; window (-15, 45] holds 10 and 8:
    # floor min(12, 10, 8) = 8, ceiling max(12, 10, 8) = 12 -> 8.
    Case("scale-up-window", (tok(940_800),), 6, 8, ScaleReason.SCALED, now=45,
         state=ScalerState(recommendations=((0.0, 10), (30.0, 8))),
         spec=ScalerSpec(1, 16, Behavior(ScalingRules(60, UP.policies), DOWN))),
    # KEDA, warm minimum 0: queue 3 > activation 0 -> 0 -> 1.
    Case("keda-activation", (tok(0), que(3)), 0, 1, ScaleReason.ACTIVATED, spec=KEDA_ZERO),
    Case("keda-idle", (tok(0), que(0)), 0, 0, ScaleReason.IDLE, spec=KEDA_ZERO),
    # Last active at t = 0; 301 - 0 > cooldown 300 -> 0.
    Case("keda-cooldown-to-zero", (tok(0), que(0)), 2, 0, ScaleReason.DEACTIVATED, now=301,
         state=ScalerState(last_active_s=0.0), spec=KEDA_ZERO),
    # 300 - 0 is not > 300: the HPA runs with min max(0, 1) = 1; proposals 0; down limit 1.
    Case("keda-inside-cooldown", (tok(0), que(0)), 2, 1, ScaleReason.SCALED, now=300,
         state=ScalerState(last_active_s=0.0), spec=KEDA_ZERO),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hand_worked_case(case: Case) -> None:
    decision = desired_replicas(case.spec, case.state, case.readings, case.current, case.now)
    assert (decision.replicas, decision.reason) == (case.expected, case.reason)


def test_the_table_uses_the_policy_defaults() -> None:
    assert behavior(AutoscalePolicy()) == Behavior(UP, DOWN)


def test_a_step_records_its_recommendation_and_scale_event() -> None:
    d = desired_replicas(CHAT, ScalerState(), (tok(600_000), que(0)), 6, 100.0)
    assert d.state.recommendations == ((100.0, 8),)
    assert d.state.scale_ups == ((100.0, 2),)
    assert dict(d.proposals) == {"tokens-in-flight": 8, "queue-depth": 0}


def test_failures_count_in_a_row_and_reset() -> None:
    state = ScalerState()
    for n in (1, 2):
        state = desired_replicas(CHAT, state, (tok(None), que(0)), 10, 15.0 * n).state
        assert dict(state.failures)["tokens-in-flight"] == n
    state = desired_replicas(CHAT, state, (tok(784_000), que(0)), 10, 45.0).state
    assert dict(state.failures)["tokens-in-flight"] == 0


def test_low_load_removes_one_replica_per_ten_minutes() -> None:
    # At 12 replicas the load needs 6 (400,000 tokens -> ceil(5.1) = 6). The 12 recorded at t = 0
    # holds the count until the window passes at t = 600, then one replica per 600 s.
    state, current, removals = ScalerState(recommendations=((0.0, 12),)), 12, []
    for i in range(1, 300):
        now = 15.0 * i
        d = desired_replicas(CHAT, state, (tok(400_000), que(0)), current, now)
        if d.replicas < current:
            removals.append(now)
        state, current = d.state, d.replicas
    assert removals == [600, 1200, 1800, 2400, 3000, 3600]
    assert current == 6


def test_history_stays_bounded() -> None:
    state, current = ScalerState(), 6
    for i in range(1, 1000):
        d = desired_replicas(CHAT, state, (tok(500_000), que(0)), current, 15.0 * i)
        state, current = d.state, d.replicas
    assert len(state.recommendations) <= 600 // 15


def test_trigger_names_must_be_unique() -> None:
    with pytest.raises(ValueError, match="unique"):
        desired_replicas(CHAT, ScalerState(), (tok(1), tok(2)), 6, 0.0)


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError):
        ScalerSpec(5, 4)

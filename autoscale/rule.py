"""The desired-replica rule: KEDA in front of the HPA, as one pure step over plain data.

:func:`desired_replicas` takes the pool's scaler spec, the state left by the previous step, this
step's trigger readings, the current replica count and the time, and returns the replica count
to set and the state for the next step. It does what KEDA and the HPA controller do together on
one sync, in order:

1. KEDA fallback: a reading without a value is a failed read; after more than
   ``failure_threshold`` consecutive failures an ``AverageValue`` trigger reads as
   ``target x fallback_replicas``, so it asks for exactly ``fallback_replicas``;
2. KEDA activation, only when the warm minimum is 0: a pool at 0 goes to 1 when any trigger is
   active; a pool at 1 or more goes to 0 once no trigger was active for ``cooldown_s`` seconds;
3. the HPA: outside [min, max] the count is brought inside at once; otherwise each trigger
   proposes replicas (:func:`autoscale.hpa.metric_replicas`, with the tolerance), the highest
   wins; if a trigger failed and the others ask for fewer replicas than now, nothing changes
   (the HPA never scales down on partial metrics); then the stabilisation window and the rate
   policies (:mod:`autoscale.hpa`), and the clamp to [max(min, 1), max].

The step is pure: the same inputs give the same output, time is passed in (seconds, on any
one clock), and the history is the returned :class:`ScalerState`. The local stack and the
simulator call it every ``sync_period_s`` (the HPA's is 15 s).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from autoscale.hpa import Behavior, MetricType, TimedValue, metric_replicas, rate_limit, stabilize

SYNC_PERIOD_S = 15.0
"""The HPA controller's default sync period, seconds."""


class ScaleReason(StrEnum):
    """Why a step chose its replica count."""

    SCALED = "scaled"                  # the metrics moved the count
    UNCHANGED = "unchanged"            # metrics, window or policies kept the count
    METRICS_MISSING = "metrics-missing"  # a failed read, and the rest would not scale up
    ABOVE_MAX = "above-max"
    BELOW_MIN = "below-min"
    ACTIVATED = "activated"            # KEDA: 0 -> 1
    DEACTIVATED = "deactivated"        # KEDA: -> 0 after the cooldown
    IDLE = "idle"                      # KEDA: stays at 0


@dataclass(frozen=True)
class Reading:
    """One trigger's metric at this step. ``value`` is None when the read failed or returned
    no sample. ``AverageValue``: ``value`` is the pool total and ``target`` the amount per
    replica (tokens, requests, or replicas for cron); ``Value``: both are pool-wide.
    ``active`` overrides KEDA's activity test ``value > activation`` (cron sets it)."""

    trigger: str
    target: float
    value: float | None
    metric_type: MetricType = "AverageValue"
    activation: float = 0.0
    active: bool | None = None


@dataclass(frozen=True)
class ScalerSpec:
    """What a ScaledObject says for one pool: replicas bounds, HPA behaviour and tolerance,
    fallback (``fallback_replicas`` None = no fallback section), cooldown to 0 (seconds)."""

    min_replicas: int
    max_replicas: int
    behavior: Behavior = field(default_factory=Behavior)
    tolerance: float = 0.1
    fallback_replicas: int | None = None
    failure_threshold: int = 3
    cooldown_s: float = 300.0

    def __post_init__(self) -> None:
        if not 0 <= self.min_replicas <= self.max_replicas or self.max_replicas < 1:
            raise ValueError(f"need 0 <= min <= max and max >= 1, got {self.min_replicas}..{self.max_replicas}")


@dataclass(frozen=True)
class ScalerState:
    """History one step hands to the next: unstabilised recommendations, scale events (sizes,
    replicas), consecutive failed reads per trigger, and the last time a trigger was active."""

    recommendations: tuple[TimedValue, ...] = ()
    scale_ups: tuple[TimedValue, ...] = ()
    scale_downs: tuple[TimedValue, ...] = ()
    failures: tuple[tuple[str, int], ...] = ()
    last_active_s: float | None = None


@dataclass(frozen=True)
class ScaleDecision:
    """A step's result: the replica count to set, why, each trigger's proposal (None when
    its read failed without fallback) and the state for the next step."""

    replicas: int
    reason: ScaleReason
    state: ScalerState
    proposals: tuple[tuple[str, int | None], ...] = field(default=())


def _failures(previous: Sequence[tuple[str, int]], readings: Sequence[Reading]) -> dict[str, int]:
    before = dict(previous)
    return {r.trigger: (before.get(r.trigger, 0) + 1 if r.value is None else 0) for r in readings}


def _effective(r: Reading, failures: int, spec: ScalerSpec) -> float | None:
    """The value the HPA sees: the reading, KEDA's fallback value, or None (a failed metric)."""
    if r.value is not None:
        return r.value
    fallback = spec.fallback_replicas
    if fallback is not None and r.metric_type == "AverageValue" and failures > spec.failure_threshold:
        return r.target * fallback
    return None


def _is_active(r: Reading, value: float | None) -> bool:
    if r.active is not None:
        return r.active
    # A trigger in fallback counts as active: a blind pool is never scaled to zero.
    return value is not None and (r.value is None or value > r.activation)


def _prune(history: Sequence[TimedValue], keep_s: float, now_s: float) -> tuple[TimedValue, ...]:
    return tuple((t, v) for t, v in history if t > now_s - keep_s)


def _moved(state: ScalerState, spec: ScalerSpec, current: int, target: int, now_s: float,
           recommendations: tuple[TimedValue, ...]) -> ScalerState:
    """The state after the HPA sets ``target`` replicas (recording the scale event)."""
    ups = _prune(state.scale_ups, spec.behavior.scale_up.longest_period_s, now_s)
    downs = _prune(state.scale_downs, spec.behavior.scale_down.longest_period_s, now_s)
    if target > current:
        ups += ((now_s, target - current),)
    elif target < current:
        downs += ((now_s, current - target),)
    return ScalerState(recommendations, ups, downs, state.failures, state.last_active_s)


def desired_replicas(spec: ScalerSpec, state: ScalerState, readings: Sequence[Reading],
                     current: int, now_s: float) -> ScaleDecision:
    """One KEDA + HPA sync for one pool: the replica count to set now, and the next state.

    ``current`` is the pool's current replica count (the Deployment's ``spec.replicas``);
    ``now_s`` the time in seconds; ``readings`` one per trigger (names unique)."""
    if len({r.trigger for r in readings}) != len(readings):
        raise ValueError("trigger names must be unique")
    failures = _failures(state.failures, readings)
    values = {r.trigger: _effective(r, failures[r.trigger], spec) for r in readings}
    active = any(_is_active(r, values[r.trigger]) for r in readings)
    last_active = now_s if active else state.last_active_s
    base = ScalerState(state.recommendations, state.scale_ups, state.scale_downs,
                       tuple(failures.items()), last_active)

    if spec.min_replicas == 0:
        if current == 0:
            return ScaleDecision(1 if active else 0, ScaleReason.ACTIVATED if active else ScaleReason.IDLE, base)
        if not active and (last_active is None or now_s - last_active > spec.cooldown_s):
            return ScaleDecision(0, ScaleReason.DEACTIVATED, base)
    low = max(spec.min_replicas, 1)
    if current > spec.max_replicas or current < low:
        target = min(max(current, low), spec.max_replicas)
        reason = ScaleReason.ABOVE_MAX if current > spec.max_replicas else ScaleReason.BELOW_MIN
        return ScaleDecision(target, reason, _moved(base, spec, current, target, now_s, base.recommendations))

    proposals: list[tuple[str, int | None]] = []
    for r in readings:
        value = values[r.trigger]
        proposals.append((r.trigger, None if value is None else
                          metric_replicas(r.metric_type, value, r.target, current, spec.tolerance)))
    valid = [p for _, p in proposals if p is not None]
    if not valid or (len(valid) < len(proposals) and max(valid) < current):
        return ScaleDecision(current, ScaleReason.METRICS_MISSING, base, tuple(proposals))

    proposal = max(valid)
    b = spec.behavior
    stabilized = stabilize(base.recommendations, proposal, current, b, now_s)
    target = rate_limit(stabilized, current, low, spec.max_replicas, base.scale_ups, base.scale_downs, b, now_s)
    keep_s = max(b.scale_up.stabilization_window_s, b.scale_down.stabilization_window_s)
    recommendations = (*_prune(base.recommendations, keep_s, now_s), (now_s, proposal))
    reason = ScaleReason.SCALED if target != current else ScaleReason.UNCHANGED
    return ScaleDecision(target, reason, _moved(base, spec, current, target, now_s, recommendations),
                    tuple(proposals))

"""The Kubernetes HPA's arithmetic (autoscaling/v2), as pure functions over plain data.

Follows the HPA controller (``pkg/controller/podautoscaler``) and its documentation
("Algorithm details", "Configurable scaling behavior", "Stabilization window"):

- one metric proposes replicas: ``AverageValue`` ``ceil(sum / target)``, ``Value``
  ``ceil(current * value / target)``; no change while the usage ratio is within the tolerance of 1;
- the stabilisation window keeps the *lowest* recommendation of the scale-up window and the
  *highest* of the scale-down window, and the result lies between them, as close to the current
  count as possible;
- rate policies (``Pods`` or ``Percent`` per ``periodSeconds``) cap the change relative to the
  replica count at the start of the period (current - added + removed within it); ``selectPolicy``
  ``Max`` takes the policy allowing the largest change, ``Min`` the smallest, ``Disabled`` none.

Times are seconds on any one clock (the caller's); an event or recommendation counts inside a
window of ``w`` seconds when its time is strictly after ``now - w``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

PolicyType = Literal["Pods", "Percent"]
SelectPolicy = Literal["Max", "Min", "Disabled"]
MetricType = Literal["AverageValue", "Value"]
TimedValue = tuple[float, int]
"""(time in seconds, replicas): a recommendation, or the size of one scale event."""


@dataclass(frozen=True)
class ScalingPolicy:
    """At most ``value`` pods (``Pods``) or percent of the period's starting count
    (``Percent``) of change per ``period_s`` seconds."""

    type: PolicyType
    value: int
    period_s: int


@dataclass(frozen=True)
class ScalingRules:
    """One direction's behaviour: stabilisation window (seconds), policies, selectPolicy."""

    stabilization_window_s: int
    policies: tuple[ScalingPolicy, ...]
    select_policy: SelectPolicy = "Max"

    @property
    def longest_period_s(self) -> int:
        """The longest policy period, seconds: events older than this no longer matter."""
        return max((p.period_s for p in self.policies), default=0)


HPA_DEFAULT_SCALE_UP = ScalingRules(0, (ScalingPolicy("Percent", 100, 15), ScalingPolicy("Pods", 4, 15)))
"""Kubernetes' default scale-up: no window; double or add 4 pods per 15 s, whichever is more."""
HPA_DEFAULT_SCALE_DOWN = ScalingRules(300, (ScalingPolicy("Percent", 100, 15),))
"""Kubernetes' default scale-down: 300 s window, then down to the recommendation at once."""


@dataclass(frozen=True)
class Behavior:
    """The HPA ``behavior`` block: scale-up and scale-down rules."""

    scale_up: ScalingRules = HPA_DEFAULT_SCALE_UP
    scale_down: ScalingRules = HPA_DEFAULT_SCALE_DOWN

    def to_k8s(self) -> dict[str, Any]:
        """The ``behavior`` object as the Kubernetes API (and KEDA's ``advanced``) spells it."""
        def rules(r: ScalingRules) -> dict[str, Any]:
            return {
                "stabilizationWindowSeconds": r.stabilization_window_s,
                "selectPolicy": r.select_policy,
                "policies": [{"type": p.type, "value": p.value, "periodSeconds": p.period_s}
                             for p in r.policies],
            }
        return {"scaleUp": rules(self.scale_up), "scaleDown": rules(self.scale_down)}


def _ceil(x: float) -> int:
    # Quotients of integer-valued quantities: float noise (2.0000000000000004) must not add a replica.
    return math.ceil(round(x, 9))


def metric_replicas(metric_type: MetricType, value: float, target: float, current: int,
                    tolerance: float) -> int:
    """Replicas one metric asks for. ``AverageValue``: ``value`` is the pool's total and
    ``target`` the amount per replica; ``Value``: both are pool-wide. ``current`` replicas;
    ``tolerance`` is the dead band around a usage ratio of 1 (0.1 = 10%)."""
    if target <= 0:
        raise ValueError("a metric target must be positive")
    if current <= 0:  # the HPA never runs at 0 (KEDA activates); asked anyway, no dead band
        return _ceil(value / target)
    if metric_type == "AverageValue":
        ratio = value / (target * current)
        return current if abs(1.0 - ratio) <= tolerance else _ceil(value / target)
    ratio = value / target
    return current if abs(1.0 - ratio) <= tolerance else _ceil(ratio * current)


def within(history: Sequence[TimedValue], window_s: float, now_s: float) -> list[int]:
    """The values of ``history`` recorded strictly after ``now_s - window_s``."""
    return [v for t, v in history if t > now_s - window_s]


def stabilize(recommendations: Sequence[TimedValue], proposal: int, current: int,
              behavior: Behavior, now_s: float) -> int:
    """The stabilised recommendation (replicas): at least the lowest recommendation of the
    scale-up window and at most the highest of the scale-down window, both including
    ``proposal``, starting from ``current``."""
    up_floor = min([proposal, *within(recommendations, behavior.scale_up.stabilization_window_s, now_s)])
    down_ceiling = max([proposal, *within(recommendations, behavior.scale_down.stabilization_window_s, now_s)])
    return min(max(current, up_floor), down_ceiling)


def _period_start(current: int, period_s: int, ups: Sequence[TimedValue],
                  downs: Sequence[TimedValue], now_s: float) -> int:
    return current - sum(within(ups, period_s, now_s)) + sum(within(downs, period_s, now_s))


def scale_up_limit(current: int, ups: Sequence[TimedValue], downs: Sequence[TimedValue],
                   rules: ScalingRules, now_s: float) -> int:
    """The most replicas the scale-up policies allow now (never below ``current``)."""
    if rules.select_policy == "Disabled" or not rules.policies:
        return current
    proposals = []
    for p in rules.policies:
        start = _period_start(current, p.period_s, ups, downs, now_s)
        proposals.append(start + p.value if p.type == "Pods" else math.ceil(start * (1 + p.value / 100)))
    limit = max(proposals) if rules.select_policy == "Max" else min(proposals)
    return max(limit, current)


def scale_down_limit(current: int, ups: Sequence[TimedValue], downs: Sequence[TimedValue],
                     rules: ScalingRules, now_s: float) -> int:
    """The fewest replicas the scale-down policies allow now (never above ``current``)."""
    if rules.select_policy == "Disabled" or not rules.policies:
        return current
    proposals = []
    for p in rules.policies:
        start = _period_start(current, p.period_s, ups, downs, now_s)
        proposals.append(start - p.value if p.type == "Pods" else int(start * (1 - p.value / 100)))
    limit = min(proposals) if rules.select_policy == "Max" else max(proposals)
    return min(limit, current)


def rate_limit(desired: int, current: int, min_replicas: int, max_replicas: int,
               ups: Sequence[TimedValue], downs: Sequence[TimedValue], behavior: Behavior,
               now_s: float) -> int:
    """``desired`` cut to what the policies allow this period and to [min, max] (replicas)."""
    if desired > current:
        return min(desired, max_replicas, scale_up_limit(current, ups, downs, behavior.scale_up, now_s))
    if desired < current:
        return max(desired, min_replicas, scale_down_limit(current, ups, downs, behavior.scale_down, now_s))
    return desired

"""The autoscaling policy (the seed's numbers as defaults) and what it derives for one pool.

The policy is plain data (:mod:`modelfleet.config.autoscaling`: the config's ``autoscaling:`` section, read
into ``PlatformConfig.autoscaling``; :func:`policy_from_data` builds it from a mapping), unknown
keys are errors, and the result is frozen. Every threshold is derived from the version's
load-tested capacity, never typed in:

- tokens in flight per replica: ``target_utilization x capacity.tokens_in_flight``
  (0.70 x 112,000 = 78,400 tokens for chat-7b);
- requests waiting per replica: ``queue_per_stream x capacity.streams``, at least 1
  (0.10 x 83 = 8 for chat-7b: at the seed's 10.5 s answer a full replica frees
  83 / 10.5 = 8 places a second, so 8 waiting is about one second added to TTFT, the whole budget).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from autoscale.hpa import Behavior, ScalingPolicy, ScalingRules
from autoscale.rule import ScalerSpec
from modelfleet.config.autoscaling import (
    AutoscalePolicy,
    ColdStart,
    CronPeak,
    DrainPolicy,
    Fallback,
    ScaleDown,
    ScaleUp,
)
from modelfleet.config.schema import Pool, Version

__all__ = [
    "AutoscalePolicy",
    "ColdStart",
    "CronPeak",
    "DrainPolicy",
    "Fallback",
    "ScaleDown",
    "ScaleUp",
    "fallback_replicas",
    "peaks_for",
    "policy_from_data",
    "queue_threshold",
    "scaler_spec",
    "tokens_threshold",
]


def policy_from_data(data: Mapping[str, Any] | None = None) -> AutoscalePolicy:
    """Build the policy from plain data (e.g. a parsed ``autoscaling:`` YAML section);
    missing keys take the seed's defaults. Raises ``pydantic.ValidationError`` on bad data."""
    return AutoscalePolicy.model_validate(dict(data or {}))


def tokens_threshold(version: Version, policy: AutoscalePolicy) -> int:
    """Tokens in flight per replica at which the pool grows: the target share of the
    version's load-tested tokens in flight, whole tokens."""
    return max(1, round(policy.target_utilization * version.capacity.tokens_in_flight))


def queue_threshold(version: Version, policy: AutoscalePolicy) -> int:
    """Requests waiting per replica at which the pool grows (at least 1 request)."""
    return max(1, math.floor(policy.queue_per_stream * version.capacity.streams + 1e-9))


def fallback_replicas(pool: Pool, policy: AutoscalePolicy) -> int:
    """Replicas to hold while a metric is lost: a share of the pool's maximum, at least its
    warm minimum and at least 1."""
    share = math.ceil(policy.fallback.share_of_max * pool.max_replicas - 1e-9)
    return min(pool.max_replicas, max(pool.min_replicas, share, 1))


def behavior(policy: AutoscalePolicy) -> Behavior:
    """The HPA behaviour of ``policy``: scale up fast, scale down one step per period after the
    stabilisation window (seconds)."""
    up, down = policy.scale_up, policy.scale_down
    return Behavior(
        scale_up=ScalingRules(up.stabilization_s, (
            ScalingPolicy("Percent", up.percent, up.period_s),
            ScalingPolicy("Pods", up.pods, up.period_s)), "Max"),
        scale_down=ScalingRules(down.stabilization_s, (
            ScalingPolicy("Pods", down.pods, down.period_s),), "Min"),
    )


def peaks_for(pool: Pool, policy: AutoscalePolicy) -> tuple[CronPeak, ...]:
    """The peaks that apply to ``pool``, each asking for at most the pool's maximum (a peak
    named by model alone also reaches that model's small canary pools)."""
    return tuple(p if p.desired_replicas <= pool.max_replicas
                 else p.model_copy(update={"desired_replicas": pool.max_replicas})
                 for p in policy.peaks if p.applies_to(pool.model, pool.version, pool.region))


def scaler_spec(pool: Pool, policy: AutoscalePolicy) -> ScalerSpec:
    """What the pool's ScaledObject tells KEDA and the HPA, for :func:`autoscale.rule.desired_replicas`."""
    return ScalerSpec(
        min_replicas=pool.min_replicas,
        max_replicas=pool.max_replicas,
        behavior=behavior(policy),
        tolerance=policy.tolerance,
        fallback_replicas=fallback_replicas(pool, policy),
        failure_threshold=policy.fallback.failure_threshold,
        cooldown_s=float(policy.cooldown_s),
    )

"""The autoscaling policy (the seed's numbers as defaults) and what it derives for one pool.

The policy is plain data: :func:`policy_from_data` builds it from a mapping (the proposed
``autoscaling:`` config section), unknown keys are errors, and the result is frozen. Every
threshold is derived from the version's load-tested capacity, never typed in:

- tokens in flight per replica: ``target_utilization x capacity.tokens_in_flight``
  (0.70 x 112,000 = 78,400 tokens for chat-7b);
- requests waiting per replica: ``queue_per_stream x capacity.streams``, at least 1
  (0.10 x 83 = 8 for chat-7b: at the seed's 10.5 s answer a full replica frees
  83 / 10.5 = 8 places a second, so 8 waiting is about one second added to TTFT, the whole budget).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Annotated, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

from autoscale.cron import parse_cron
from autoscale.drain import DrainPolicy
from autoscale.hpa import Behavior, ScalingPolicy, ScalingRules
from autoscale.rule import ScalerSpec
from modelfleet.config.schema import Pool, Version

PeakName = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9-]{0,40}$")]


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CronPeak(_Frozen):
    """A known peak: between ``start`` and ``end`` (five-field cron, read in ``timezone``)
    the pool holds at least ``desired_replicas``. Start it one cold start early (6 minutes,
    see docs/autoscaling.md). ``model``, ``version`` and ``region`` narrow the pools it
    applies to; a pool whose maximum is lower gets its maximum."""

    name: PeakName
    timezone: str
    start: str
    end: str
    desired_replicas: int = Field(ge=1)
    model: str | None = None
    version: str | None = None
    region: str | None = None

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"unknown IANA timezone {value!r}") from exc
        return value

    @field_validator("start", "end")
    @classmethod
    def _cron(cls, value: str) -> str:
        parse_cron(value)
        return " ".join(value.split())

    @model_validator(mode="after")
    def _distinct(self) -> CronPeak:
        if self.start == self.end:
            raise ValueError("a peak's start and end must differ (KEDA rejects equal ones)")
        return self

    def applies_to(self, pool: Pool) -> bool:
        """Whether this peak raises ``pool``'s floor."""
        return (self.model in (None, pool.model) and self.version in (None, pool.version)
                and self.region in (None, pool.region))


class ScaleUp(_Frozen):
    """Scale up fast: the larger of ``percent`` % and ``pods`` pods per ``period_s`` seconds."""

    stabilization_s: int = Field(default=0, ge=0, le=3600)
    percent: int = Field(default=100, ge=1)
    pods: int = Field(default=4, ge=1)
    period_s: int = Field(default=15, ge=1, le=1800)


class ScaleDown(_Frozen):
    """Scale down slowly: ``pods`` per ``period_s`` seconds, after ``stabilization_s`` of the
    highest recommendation (the seed: one replica per 10 minutes)."""

    stabilization_s: int = Field(default=600, ge=0, le=3600)
    pods: int = Field(default=1, ge=1)
    period_s: int = Field(default=600, ge=1, le=1800)


class Fallback(_Frozen):
    """When a metric fails more than ``failure_threshold`` reads in a row, hold
    ``ceil(share_of_max x max_replicas)`` replicas (at least the warm minimum)."""

    failure_threshold: int = Field(default=3, ge=0)
    share_of_max: float = Field(default=1.0, ge=0, le=1)


class AutoscalePolicy(_Frozen):
    """Autoscaling settings shared by every pool; defaults are the seed's."""

    target_utilization: float = Field(default=0.70, gt=0, le=1)
    """Share of the load-tested tokens in flight per replica at which to add replicas."""
    queue_per_stream: float = Field(default=0.10, gt=0)
    """Requests waiting per replica, as a share of its load-tested streams (fast trigger)."""
    tolerance: float = Field(default=0.1, ge=0, lt=1)
    """The HPA's dead band; must match kube-controller-manager's (default 0.1)."""
    polling_interval_s: int = Field(default=15, ge=1)
    """KEDA's polling interval, seconds (activation and fallback counting)."""
    cooldown_s: int = Field(default=300, ge=0)
    """KEDA's cooldown before scaling to 0, seconds; only pools with a warm minimum of 0."""
    scale_up: ScaleUp = ScaleUp()
    scale_down: ScaleDown = ScaleDown()
    fallback: Fallback = Fallback()
    peaks: tuple[CronPeak, ...] = ()
    drain: DrainPolicy = DrainPolicy()

    @model_validator(mode="after")
    def _unique_peaks(self) -> AutoscalePolicy:
        names = [p.name for p in self.peaks]
        if len(names) != len(set(names)):
            raise ValueError("peak names must be unique")
        return self

    def behavior(self) -> Behavior:
        """The HPA behaviour: scale up fast, scale down one step per period after the window."""
        up, down = self.scale_up, self.scale_down
        return Behavior(
            scale_up=ScalingRules(up.stabilization_s, (
                ScalingPolicy("Percent", up.percent, up.period_s),
                ScalingPolicy("Pods", up.pods, up.period_s)), "Max"),
            scale_down=ScalingRules(down.stabilization_s, (
                ScalingPolicy("Pods", down.pods, down.period_s),), "Min"),
        )


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


def peaks_for(pool: Pool, policy: AutoscalePolicy) -> tuple[CronPeak, ...]:
    """The peaks that apply to ``pool``, each asking for at most the pool's maximum (a peak
    named by model alone also reaches that model's small canary pools)."""
    return tuple(p if p.desired_replicas <= pool.max_replicas
                 else p.model_copy(update={"desired_replicas": pool.max_replicas})
                 for p in policy.peaks if p.applies_to(pool))


def scaler_spec(pool: Pool, policy: AutoscalePolicy) -> ScalerSpec:
    """What the pool's ScaledObject tells KEDA and the HPA, for :func:`autoscale.rule.desired_replicas`."""
    return ScalerSpec(
        min_replicas=pool.min_replicas,
        max_replicas=pool.max_replicas,
        behavior=policy.behavior(),
        tolerance=policy.tolerance,
        fallback_replicas=fallback_replicas(pool, policy),
        failure_threshold=policy.fallback.failure_threshold,
        cooldown_s=float(policy.cooldown_s),
    )

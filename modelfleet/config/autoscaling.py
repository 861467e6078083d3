"""The ``autoscaling:`` config section as plain data: the seed's numbers are the defaults.

These records import nothing from ``modelfleet.config`` so that the config schema can hold an
``autoscaling`` field of type :class:`AutoscalePolicy` (``modelfleet.config.schema`` imports this
module; :mod:`autoscale.policy` and :mod:`autoscale.drain` derive per-pool values from it and
re-export these names). Durations are seconds of model time: the local stack runs them
``local.time_scale`` times faster (docs/autoscaling.md).
"""

from __future__ import annotations

from typing import Annotated
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

from modelfleet.config.cron import parse_cron

PeakName = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9-]{0,40}$")]


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DrainPolicy(_Frozen):
    """Drain settings (seconds). The propagation steps add up to the time between a pod's
    deletion and the last Envoy and gateway_ext pod no longer sending it requests."""

    ttft_budget_s: float = Field(default=1.0, ge=0)
    """Time to first token allowed a waiting request (the seed's p95 TTFT target), seconds."""
    stream_cap_s: float = Field(default=600.0, gt=0)
    """No stream bound above this: one scale-down period (one replica per 10 minutes)."""
    endpoint_update_s: float = Field(default=2.0, ge=0)
    """Pod deletion -> EndpointSlice update seen by the control plane's watch."""
    snapshot_s: float = Field(default=1.0, ge=0)
    """Control plane: debounce, build and consistency-check the new xDS snapshot."""
    xds_push_s: float = Field(default=1.0, ge=0)
    """ADS push of the snapshot to every Envoy, and its ack."""
    router_refresh_s: float = Field(default=1.0, ge=0)
    """gateway_ext's router state (ring, load) is refreshed every second."""
    in_flight_pick_s: float = Field(default=1.0, ge=0)
    """A request picked just before the update: ext_authz answer, then Envoy's connect."""
    safety_factor: float = Field(default=2.0, ge=1)
    """Margin on the propagation sum: watches and pushes are not instant under load."""
    exit_margin_s: float = Field(default=10.0, ge=0)
    """After the last stream: engine shutdown, GPU memory release, process exit."""


class ColdStart(_Frozen):
    """Seconds from a replica being asked for until it serves (the seed's 312 s, planned as
    6 minutes): a new GPU node, the weights pulled to its NVMe (14 GB at 0.5 GB/s), loaded into
    GPU memory, and the engine warmed up (CUDA graphs, first requests)."""

    node_start_s: float = Field(default=240.0, ge=0)
    weights_pull_s: float = Field(default=28.0, ge=0)
    load_s: float = Field(default=14.0, ge=0)
    warm_up_s: float = Field(default=30.0, ge=0)

    @property
    def total_s(self) -> float:
        """The whole cold start, seconds."""
        return self.node_start_s + self.weights_pull_s + self.load_s + self.warm_up_s


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

    def applies_to(self, model: str, version: str, region: str) -> bool:
        """Whether this peak raises the floor of ``model@version``'s pool in ``region``."""
        return (self.model in (None, model) and self.version in (None, version)
                and self.region in (None, region))


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
    cold_start: ColdStart = ColdStart()
    """What the local stack waits before a new simulated replica starts (scaled by its time scale)."""

    @model_validator(mode="after")
    def _unique_peaks(self) -> AutoscalePolicy:
        names = [p.name for p in self.peaks]
        if len(names) != len(set(names)):
            raise ValueError("peak names must be unique")
        return self

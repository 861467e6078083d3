"""The plain data of admission (:mod:`gateway_ext.limits.admission`): decisions, reasons, settings,
the request offered to a pool, the outcome, and a pool's view for metrics. Units: tokens, seconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from modelfleet.config.schema import Tier


class AdmissionDecision(StrEnum):
    """What happens to a request."""

    ADMIT = "admit"
    QUEUE = "queue"
    REJECT_429 = "reject_429"
    SHED_503 = "shed_503"


class AdmissionReason(StrEnum):
    """Why."""

    FITS = "fits"
    BURST = "burst"
    BATCH_PAUSED = "batch_paused"
    POOL_FULL = "pool_full"
    MAX_CONCURRENCY = "max_concurrency"
    ABOVE_SHARE = "above_guaranteed_share"
    QUEUE_FULL = "queue_full"
    QUEUE_TIMEOUT = "queue_timeout"


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    """Queue bound (entries), per-tier queue timeouts (seconds; None: none), the share of capacity
    batch may fill (0..1), seconds an admitted request is held before it is taken as finished, and
    the base Retry-After per reason (seconds, before jitter)."""

    max_queue: int = 256
    queue_timeout_s: Mapping[Tier, float | None] = field(default_factory=lambda: {
        "interactive": None, "standard": 20.0, "batch": 300.0})
    batch_ceiling: float = 0.9
    in_flight_ttl_s: float = 900.0
    retry_after_s: Mapping[AdmissionReason, float] = field(default_factory=lambda: {
        AdmissionReason.MAX_CONCURRENCY: 1.0, AdmissionReason.ABOVE_SHARE: 2.0,
        AdmissionReason.QUEUE_FULL: 5.0, AdmissionReason.QUEUE_TIMEOUT: 5.0})


@dataclass(frozen=True, slots=True)
class AdmissionRequest:
    """A request offered to a pool: its ``tokens`` in flight (tokens) and its team's limits on the
    model (``max_concurrency`` requests, ``guaranteed_share`` 0..1)."""

    request_id: str
    team: str
    tier: Tier
    tokens: int
    max_concurrency: int
    guaranteed_share: float


@dataclass(frozen=True, slots=True)
class Outcome:
    """A decision on ``request_id``; ``retry_after_s`` (seconds, before jitter) for 429/503;
    ``waited_s`` seconds spent queued; ``shed`` lists queued requests evicted to make room."""

    request_id: str
    decision: AdmissionDecision
    reason: AdmissionReason
    retry_after_s: float = 0.0
    waited_s: float = 0.0
    shed: tuple[Outcome, ...] = ()


@dataclass(frozen=True, slots=True)
class PoolView:
    """Capacity and tokens in flight (tokens), queued entries per tier."""

    capacity_tokens: int
    in_flight_tokens: int
    queued: Mapping[Tier, int]

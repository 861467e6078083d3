"""Prometheus metrics of gateway_ext, registered on a registry passed in (never the global one).

Per team: tokens used (by kind), bucket tokens reserved / refunded / overcharged, 429s (by
reason), requests shed with 503 (by tier), bucket-store fallbacks (Redis unreachable).
Per pool: queue depth by tier, admissions by tier, queue wait (seconds) by tier, tokens in flight
and capacity (tokens). The ``pool`` label is the pool key ``model@version``, the one spelling of
the Prometheus ``pool`` label (:mod:`modelfleet.contract.metrics`), so the autoscaler's queue
trigger selects a pool's gateway and replica series with one matcher. Metric and label names
and the queue-wait buckets come from the contract.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gateway_ext.limits.admission import PoolAdmission
from gateway_ext.limits.admission_types import PoolView
from modelfleet.contract.metrics import (
    EVENT_LABEL,
    GATEWAY_CONVERSATION_PINS,
    GATEWAY_POOL_ADMITTED,
    GATEWAY_POOL_CAPACITY,
    GATEWAY_POOL_QUEUE_DEPTH,
    GATEWAY_POOL_QUEUE_WAIT,
    GATEWAY_POOL_TOKENS_IN_FLIGHT,
    GATEWAY_REPLICA_PICKS,
    GATEWAY_ROUTER_STATE_AGE,
    GATEWAY_STORE_FALLBACKS,
    GATEWAY_TEAM_BUCKET_TOKENS,
    GATEWAY_TEAM_REJECTED,
    GATEWAY_TEAM_SHED,
    GATEWAY_TEAM_TOKENS,
    KIND_LABEL,
    MODEL_LABEL,
    OP_LABEL,
    OUTCOME_LABEL,
    POOL_LABEL,
    QUEUE_WAIT_BUCKETS,
    REASON_LABEL,
    TEAM_LABEL,
    TIER_LABEL,
)


@dataclass(frozen=True, slots=True)
class GatewayMetrics:
    """The metric families; label values are team, model, pool, tier, reason, kind."""

    team_tokens: Counter
    team_bucket_tokens: Counter
    team_rejected: Counter
    team_shed: Counter
    pool_queue_depth: Gauge
    pool_admitted: Counter
    pool_queue_wait: Histogram
    pool_tokens_in_flight: Gauge
    pool_capacity: Gauge
    store_fallbacks: Counter
    picks: Counter
    pins: Counter
    router_state_age: Gauge

    def observe_pool(self, pool: str, view: PoolView) -> None:
        """Set ``pool``'s gauges from an admission view."""
        for tier, depth in view.queued.items():
            self.pool_queue_depth.labels(pool, tier).set(depth)
        self.pool_tokens_in_flight.labels(pool).set(view.in_flight_tokens)
        self.pool_capacity.labels(pool).set(view.capacity_tokens)

    def count_usage(self, team: str, model: str, prompt_tokens: int, cached_tokens: int,
                    output_tokens: int) -> None:
        """Add a finished request's tokens to ``team``'s counters (tokens)."""
        for kind, value in (("prompt", prompt_tokens), ("cached", cached_tokens),
                            ("output", output_tokens)):
            self.team_tokens.labels(team, model, kind).inc(value)


def make_metrics(registry: CollectorRegistry) -> GatewayMetrics:
    """Create and register every gateway metric on ``registry``."""
    team_model = [TEAM_LABEL, MODEL_LABEL]
    pool_tier = [POOL_LABEL, TIER_LABEL]
    return GatewayMetrics(
        team_tokens=Counter(GATEWAY_TEAM_TOKENS, "Tokens used by a team (prompt, cached, output).",
                            [*team_model, KIND_LABEL], registry=registry),
        team_bucket_tokens=Counter(
            GATEWAY_TEAM_BUCKET_TOKENS, "Bucket tokens reserved at admission, refunded (unused or "
            "never run) and overcharged (used above the reservation) at settle.",
            [*team_model, EVENT_LABEL], registry=registry),
        team_rejected=Counter(GATEWAY_TEAM_REJECTED, "Requests refused with 429, by reason.",
                              [*team_model, REASON_LABEL], registry=registry),
        team_shed=Counter(GATEWAY_TEAM_SHED, "Requests shed with 503, by tier.",
                          [*team_model, TIER_LABEL], registry=registry),
        pool_queue_depth=Gauge(GATEWAY_POOL_QUEUE_DEPTH, "Requests queued for a pool, by tier.",
                               pool_tier, registry=registry),
        pool_admitted=Counter(GATEWAY_POOL_ADMITTED, "Requests admitted to a pool, by tier.",
                              pool_tier, registry=registry),
        pool_queue_wait=Histogram(GATEWAY_POOL_QUEUE_WAIT, "Seconds a request waited queued.",
                                  pool_tier, registry=registry, buckets=QUEUE_WAIT_BUCKETS),
        pool_tokens_in_flight=Gauge(GATEWAY_POOL_TOKENS_IN_FLIGHT,
                                    "Tokens in flight admitted to a pool.", [POOL_LABEL],
                                    registry=registry),
        pool_capacity=Gauge(GATEWAY_POOL_CAPACITY, "Pool capacity in tokens in flight.",
                            [POOL_LABEL], registry=registry),
        store_fallbacks=Counter(GATEWAY_STORE_FALLBACKS, "Bucket-store calls that failed and "
                                "fell back to per-process buckets.", [OP_LABEL],
                                registry=registry),
        picks=Counter(GATEWAY_REPLICA_PICKS, "Replicas picked for admitted requests, by pool and "
                      "reason (affinity, spilled, least_loaded, round_robin).",
                      [POOL_LABEL, REASON_LABEL], registry=registry),
        pins=Counter(GATEWAY_CONVERSATION_PINS, "Version resolutions of conversations: a new pin "
                     "or a pin kept.", [OUTCOME_LABEL], registry=registry),
        router_state_age=Gauge(GATEWAY_ROUTER_STATE_AGE, "Seconds since the router state in "
                               "force was received (-1: none yet).", registry=registry),
    )


class MetricsRecorder:
    """The per-request updates of :class:`GatewayMetrics`, with each label combination's child
    remembered (``labels()`` costs more than the update itself). Token counts in tokens."""

    def __init__(self, metrics: GatewayMetrics) -> None:
        self.metrics = metrics
        self._children: dict[tuple[object, ...], Any] = {}

    def _child(self, metric: Any, *values: str) -> Any:
        """``metric``'s child for label ``values``, in the family's label order."""
        key = (id(metric), *values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    def bucket(self, team: str, model: str, event: str, tokens: int) -> None:
        """Bucket tokens ``reserved``, ``refunded`` or ``overcharged``."""
        if tokens:
            self._child(self.metrics.team_bucket_tokens, team, model, event).inc(tokens)

    def usage(self, team: str, model: str, prompt: int, cached: int, output: int) -> None:
        """A settled request's tokens."""
        for kind, tokens in (("prompt", prompt), ("cached", cached), ("output", output)):
            self._child(self.metrics.team_tokens, team, model, kind).inc(tokens)

    def admitted(self, pool: str, tier: str, waited_s: float) -> None:
        """A request admitted to ``pool`` after ``waited_s`` seconds queued."""
        self._child(self.metrics.pool_admitted, pool, tier).inc()
        self._child(self.metrics.pool_queue_wait, pool, tier).observe(waited_s)

    def rejected(self, team: str, model: str, reason: str) -> None:
        """A 429."""
        self._child(self.metrics.team_rejected, team, model, reason).inc()

    def shed(self, team: str, model: str, tier: str) -> None:
        """A 503."""
        self._child(self.metrics.team_shed, team, model, tier).inc()

    def pools(self, pools: Mapping[str, PoolAdmission]) -> None:
        """Every pool's gauges (per scrape and timer tick, not per request)."""
        for key, pool in pools.items():
            self.metrics.observe_pool(key, pool.view())

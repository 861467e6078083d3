"""Prometheus metrics of gateway_ext, registered on a registry passed in (never the global one).

Per team: tokens used (by kind), bucket tokens reserved / refunded / overcharged, 429s (by
reason), requests shed with 503 (by tier), bucket-store fallbacks (Redis unreachable).
Per pool (``model@version``): queue depth by tier, admissions by tier, queue wait (seconds) by tier,
tokens in flight and capacity (tokens).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gateway_ext.limits.admission import PoolAdmission, PoolView

QUEUE_WAIT_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                        300.0)
"""Queue-wait histogram bounds, in seconds."""


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
            self.pool_queue_depth.labels(pool=pool, tier=tier).set(depth)
        self.pool_tokens_in_flight.labels(pool=pool).set(view.in_flight_tokens)
        self.pool_capacity.labels(pool=pool).set(view.capacity_tokens)

    def count_usage(self, team: str, model: str, prompt_tokens: int, cached_tokens: int,
                    output_tokens: int) -> None:
        """Add a finished request's tokens to ``team``'s counters (tokens)."""
        for kind, value in (("prompt", prompt_tokens), ("cached", cached_tokens),
                            ("output", output_tokens)):
            self.team_tokens.labels(team=team, model=model, kind=kind).inc(value)


def make_metrics(registry: CollectorRegistry, namespace: str = "modelfleet_gateway") -> GatewayMetrics:
    """Create and register every gateway metric on ``registry``."""
    return GatewayMetrics(
        team_tokens=Counter("team_tokens", "Tokens used by a team (prompt, cached, output).",
                            ["team", "model", "kind"], namespace=namespace, registry=registry),
        team_bucket_tokens=Counter(
            "team_bucket_tokens", "Bucket tokens reserved at admission, refunded (unused or never "
            "run) and overcharged (used above the reservation) at settle.",
            ["team", "model", "event"], namespace=namespace, registry=registry),
        team_rejected=Counter("team_rejected", "Requests refused with 429, by reason.",
                              ["team", "model", "reason"], namespace=namespace, registry=registry),
        team_shed=Counter("team_shed", "Requests shed with 503, by tier.",
                          ["team", "model", "tier"], namespace=namespace, registry=registry),
        pool_queue_depth=Gauge("pool_queue_depth", "Requests queued for a pool, by tier.",
                               ["pool", "tier"], namespace=namespace, registry=registry),
        pool_admitted=Counter("pool_admitted", "Requests admitted to a pool, by tier.",
                              ["pool", "tier"], namespace=namespace, registry=registry),
        pool_queue_wait=Histogram("pool_queue_wait_seconds", "Seconds a request waited queued.",
                                  ["pool", "tier"], namespace=namespace, registry=registry,
                                  buckets=QUEUE_WAIT_BUCKETS_S),
        pool_tokens_in_flight=Gauge("pool_tokens_in_flight", "Tokens in flight admitted to a pool.",
                                    ["pool"], namespace=namespace, registry=registry),
        pool_capacity=Gauge("pool_capacity_tokens", "Pool capacity in tokens in flight.",
                            ["pool"], namespace=namespace, registry=registry),
        store_fallbacks=Counter("bucket_store_fallbacks", "Bucket-store calls that failed and "
                                "fell back to per-process buckets.", ["op"],
                                namespace=namespace, registry=registry),
        picks=Counter("replica_picks", "Replicas picked for admitted requests, by pool and "
                      "reason (affinity, spilled, least_loaded, round_robin).", ["pool", "reason"],
                      namespace=namespace, registry=registry),
        pins=Counter("conversation_pins", "Version resolutions of conversations: a new pin or "
                     "a pin kept.", ["outcome"], namespace=namespace, registry=registry),
        router_state_age=Gauge("router_state_age_seconds", "Seconds since the router state in "
                               "force was received (-1: none yet).", namespace=namespace,
                               registry=registry),
    )


class MetricsRecorder:
    """The per-request updates of :class:`GatewayMetrics`, with each label combination's child
    remembered (``labels()`` costs more than the update itself). Token counts in tokens."""

    def __init__(self, metrics: GatewayMetrics) -> None:
        self.metrics = metrics
        self._children: dict[tuple[object, ...], Any] = {}

    def _child(self, metric: Any, **labels: str) -> Any:
        key = (id(metric), *labels.values())
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(**labels)
        return child

    def bucket(self, team: str, model: str, event: str, tokens: int) -> None:
        """Bucket tokens ``reserved``, ``refunded`` or ``overcharged``."""
        if tokens:
            self._child(self.metrics.team_bucket_tokens, team=team, model=model,
                        event=event).inc(tokens)

    def usage(self, team: str, model: str, prompt: int, cached: int, output: int) -> None:
        """A settled request's tokens."""
        for kind, tokens in (("prompt", prompt), ("cached", cached), ("output", output)):
            self._child(self.metrics.team_tokens, team=team, model=model, kind=kind).inc(tokens)

    def admitted(self, pool: str, tier: str, waited_s: float) -> None:
        """A request admitted to ``pool`` after ``waited_s`` seconds queued."""
        self._child(self.metrics.pool_admitted, pool=pool, tier=tier).inc()
        self._child(self.metrics.pool_queue_wait, pool=pool, tier=tier).observe(waited_s)

    def rejected(self, team: str, model: str, reason: str) -> None:
        """A 429."""
        self._child(self.metrics.team_rejected, team=team, model=model, reason=reason).inc()

    def shed(self, team: str, model: str, tier: str) -> None:
        """A 503."""
        self._child(self.metrics.team_shed, team=team, model=model, tier=tier).inc()

    def pools(self, pools: Mapping[str, PoolAdmission]) -> None:
        """Every pool's gauges (per scrape and timer tick, not per request)."""
        for key, pool in pools.items():
            self.metrics.observe_pool(key, pool.view())

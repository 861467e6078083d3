"""Prometheus metrics of gateway_ext, registered on a registry passed in (never the global one).

Per team: tokens used (by kind), 429s (by reason), requests shed with 503 (by tier).
Per pool (``model@version``): queue depth by tier, admissions by tier, queue wait (seconds) by tier,
tokens in flight and capacity (tokens).
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gateway_ext.admission import PoolView

QUEUE_WAIT_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                        300.0)
"""Queue-wait histogram bounds, in seconds."""


@dataclass(frozen=True, slots=True)
class GatewayMetrics:
    """The metric families; label values are team, model, pool, tier, reason, kind."""

    team_tokens: Counter
    team_rejected: Counter
    team_shed: Counter
    pool_queue_depth: Gauge
    pool_admitted: Counter
    pool_queue_wait: Histogram
    pool_tokens_in_flight: Gauge
    pool_capacity: Gauge

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
    )

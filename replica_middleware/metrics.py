"""The middleware's own Prometheus metrics, appended to the engine's ``/metrics``.

Labelled by ``model_version`` and ``traffic`` (``served``: requests a client waits for;
``shadow``: copies Envoy mirrored, whose answers are discarded), so a shadow version's latency and
output can be compared with the live version's on the same dashboards:

| name | type |
|---|---|
| ``modelfleet_replica_requests_total{model_version, traffic, outcome}`` | counter (``finished``, ``rejected``, ``error``, ``client_disconnect``, ``retried``, ``draining``) |
| ``modelfleet_replica_ttft_seconds{model_version, traffic}`` | histogram, arrival to first token as the middleware sees it (model seconds: wall x time scale) |
| ``modelfleet_replica_output_tokens{model_version, traffic}`` | histogram of finished answers' completion tokens |
| ``modelfleet_refusals_total{model_version, traffic}`` | counter of finished answers that open with a refusal (:mod:`replica_middleware.refusals`); the series exists, at 0, from the first finished answer |
| ``modelfleet_replica_tokens_in_flight``, ``modelfleet_replica_queue_depth``, ``modelfleet_replica_running`` | gauges: what the heartbeat reports |

Names, label names and buckets come from :mod:`modelfleet.contract.metrics`. The middleware is
the only exporter of tokens in flight (``modelfleet_replica_tokens_in_flight``, what the
autoscaler's tokens trigger sums per pool): it runs inside real vLLM and the simulated engine
alike, and neither engine exports a series of its own for that quantity.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from modelfleet.contract.metrics import (
    MODEL_VERSION_LABEL,
    OUTCOME_LABEL,
    OUTPUT_TOKEN_BUCKETS,
    REFUSALS,
    REPLICA_OUTPUT_TOKENS,
    REPLICA_QUEUE_DEPTH,
    REPLICA_REQUESTS,
    REPLICA_RUNNING,
    REPLICA_TTFT,
    TOKENS_IN_FLIGHT,
    TRAFFIC_LABEL,
    TRAFFIC_SERVED,
    TRAFFIC_SHADOW,
    TTFT_BUCKETS,
)
from replica_middleware.inflight import Load


class _LoadCollector(Collector):
    def __init__(self, load: Callable[[], Load]) -> None:
        self._load = load

    def collect(self) -> Iterator[Metric]:
        load = self._load()
        for name, doc, value in (
            (TOKENS_IN_FLIGHT,
             "Prompt plus remaining output tokens held, as the middleware estimates them.",
             load.tokens_in_flight),
            (REPLICA_QUEUE_DEPTH, "Requests held without a first token.", load.queue_depth),
            (REPLICA_RUNNING, "Requests streaming.", load.running),
        ):
            yield GaugeMetricFamily(name, doc, value=value)


class MiddlewareMetrics:
    """The registry and its three request families; ``load`` feeds the gauges at scrape time."""

    def __init__(self, load: Callable[[], Load]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_LoadCollector(load))
        labels = (MODEL_VERSION_LABEL, TRAFFIC_LABEL)
        self.requests = Counter(REPLICA_REQUESTS, "Chat requests by outcome.",
                                (*labels, OUTCOME_LABEL), registry=self.registry)
        self.ttft = Histogram(REPLICA_TTFT,
                              "Arrival to first token at the middleware (model seconds).",
                              labels, registry=self.registry, buckets=TTFT_BUCKETS)
        self.output = Histogram(REPLICA_OUTPUT_TOKENS,
                                "Completion tokens of finished answers.", labels,
                                registry=self.registry, buckets=OUTPUT_TOKEN_BUCKETS)
        self.refusals = Counter(REFUSALS,
                                "Finished answers whose opening is a refusal (replica_middleware.refusals).",
                                labels, registry=self.registry)

    def record(self, version: str, shadow: bool, outcome: str, ttft_s: float | None,
               completion_tokens: int | None, refused: bool = False) -> None:
        """One request ended: ``ttft_s`` in model seconds, ``completion_tokens`` in tokens,
        ``refused``: a finished answer that opens with a refusal."""
        traffic = TRAFFIC_SHADOW if shadow else TRAFFIC_SERVED
        self.requests.labels(version, traffic, outcome).inc()
        if outcome == "finished":
            self.refusals.labels(version, traffic).inc(1 if refused else 0)
        if ttft_s is not None:
            self.ttft.labels(version, traffic).observe(ttft_s)
        if outcome == "finished" and completion_tokens is not None:
            self.output.labels(version, traffic).observe(completion_tokens)

    def render(self) -> bytes:
        """Prometheus text."""
        return generate_latest(self.registry)

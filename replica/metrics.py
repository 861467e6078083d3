"""``/metrics``: vLLM's metric names and labels, in a registry owned by one replica.

Gauges and counters are read from the engine at scrape time (no double bookkeeping); latency
histograms are observed as steps complete. Every series carries vLLM's labels ``model_name``
(the first served name) and ``engine`` ("0"). Latencies are **model seconds**: what real vLLM on
the modelled GPU would measure, whatever ``--time-scale`` the simulation runs at.

``vllm:request_success_total{finished_reason}`` counts requests that left the engine, as vLLM's
V1 engine does: ``stop`` (end token or stop string), ``length`` (``max_tokens`` or the context
reached), ``abort`` (the client left, or the engine failed, before the last token). The rollout
guard's error rate is the share of ``abort`` (``rules/guard.yml``, ``envoy_control.rollouts.prom``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from modelfleet.contract.metrics import TTFT_BUCKETS
from replica.engine import EngineStats, StepResult

ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
               10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
               120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
LABELS = ("model_name", "engine")
FINISHED_REASONS = ("stop", "length", "abort")
"""vLLM's ``finished_reason`` label values (``vllm.v1.engine.FinishReason``, lower-cased)."""


class _EngineCollector(Collector):
    """Scrape-time gauges and counters from ``EngineStats``."""

    def __init__(self, stats: Callable[[], EngineStats], model_name: str, info: Mapping[str, str]) -> None:
        self._stats = stats
        self._labels = [model_name, "0"]
        self._info = dict(info)

    def collect(self) -> Iterator[Metric]:
        s = self._stats()
        gauges = (
            ("vllm:num_requests_running", "Number of requests in model execution batches.", s.running),
            ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", s.waiting),
            ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", s.kv_usage),
        )
        for name, doc, value in gauges:
            g = GaugeMetricFamily(name, doc, labels=LABELS)
            g.add_metric(self._labels, value)
            yield g
        counters = (
            ("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
             s.prefix_cache_queries),
            ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
             s.prefix_cache_hits),
            ("vllm:prompt_tokens", "Number of prefill tokens processed.", s.prompt_tokens),
            ("vllm:generation_tokens", "Number of generation tokens processed.", s.generation_tokens),
            ("vllm:num_preemptions", "Cumulative number of preemption from the engine.", s.preemptions),
        )
        for name, doc, value in counters:
            c = CounterMetricFamily(name, doc, labels=LABELS)
            c.add_metric(self._labels, value)
            yield c
        tif = GaugeMetricFamily(
            "modelfleet_tokens_in_flight",
            "Prompt plus remaining output tokens of every request the replica holds (running and waiting).",
            labels=LABELS,
        )
        tif.add_metric(self._labels, s.tokens_in_flight)
        yield tif
        if self._info:
            info = GaugeMetricFamily("modelfleet_replica_info", "Identity of this replica (always 1).",
                                     labels=list(self._info))
            info.add_metric(list(self._info.values()), 1)
            yield info


class ReplicaMetrics:
    """The replica's Prometheus registry: engine gauges and counters plus latency histograms."""

    def __init__(self, model_name: str, stats: Callable[[], EngineStats],
                 info: Mapping[str, str] | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_EngineCollector(stats, model_name, info or {}))
        self._ttft = Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                               LABELS, registry=self.registry, buckets=TTFT_BUCKETS).labels(model_name, "0")
        self._itl = Histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                              LABELS, registry=self.registry, buckets=ITL_BUCKETS).labels(model_name, "0")
        self._e2e = Histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                              LABELS, registry=self.registry, buckets=E2E_BUCKETS).labels(model_name, "0")
        success = Counter("vllm:request_success", "Count of successfully processed requests.",
                          (*LABELS, "finished_reason"), registry=self.registry)
        self._success = {r: success.labels(model_name, "0", r) for r in FINISHED_REASONS}

    def finished(self, reason: str) -> None:
        """One request left the engine with ``reason`` (``stop``, ``length`` or ``abort``; any
        other value counts as ``abort``)."""
        self._success.get(reason, self._success["abort"]).inc()

    def observe_step(self, result: StepResult) -> None:
        """Record the latencies of one step's tokens (model seconds)."""
        for out in result.outputs:
            (self._ttft if out.index == 0 else self._itl).observe(out.interval_s)
            if out.e2e_s is not None:
                self._e2e.observe(out.e2e_s)

    def render(self) -> bytes:
        """The Prometheus text exposition."""
        return generate_latest(self.registry)

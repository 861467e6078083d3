"""``/metrics``: vLLM's metric names and labels, in a registry owned by one replica.

Gauges and counters are read from the engine at scrape time (no double bookkeeping); latency
histograms are observed as steps complete. Every series carries vLLM's labels ``model_name``
(the first served name) and ``engine`` ("0"). Latencies are **model seconds**: what real vLLM on
the modelled GPU would measure, whatever ``--time-scale`` the simulation runs at.

``vllm:request_success_total{finished_reason}`` counts requests that left the engine, as vLLM's
V1 engine does: ``stop`` (end token or stop string), ``length`` (``max_tokens`` or the context
reached), ``abort`` (the client left, or the engine failed, before the last token). The rollout
guard's error rate is the share of ``abort`` (``rules/guard.yml``, ``envoy_control.rollouts.prom``).

Names come from :mod:`modelfleet.contract.metrics`. Like real vLLM, the engine exports no load
figure of modelfleet's own: tokens in flight (``modelfleet_replica_tokens_in_flight``) comes from
the middleware wrapped around it (``replica_middleware.metrics``), as on a real replica, so a
simulated replica's ``/metrics`` carries one series for it. The only ``modelfleet_*`` name here is
``modelfleet_replica_info``, the simulated replica's identity.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from modelfleet.contract.metrics import (
    E2E_BUCKETS,
    ENGINE_LABEL,
    FINISHED_ABORT,
    FINISHED_REASON_LABEL,
    FINISHED_REASONS,
    ITL_BUCKETS,
    MODEL_NAME_LABEL,
    REPLICA_INFO,
    TTFT_BUCKETS,
    VLLM_E2E,
    VLLM_GENERATION_TOKENS,
    VLLM_ITL,
    VLLM_KV_CACHE_USAGE,
    VLLM_PREEMPTIONS,
    VLLM_PREFIX_CACHE_HITS,
    VLLM_PREFIX_CACHE_QUERIES,
    VLLM_PROMPT_TOKENS,
    VLLM_REQUEST_SUCCESS,
    VLLM_RUNNING,
    VLLM_TTFT,
    VLLM_WAITING,
)
from replica.engine_types import EngineStats, StepResult

LABELS = (MODEL_NAME_LABEL, ENGINE_LABEL)
"""vLLM's labels on every series of the engine."""


class _EngineCollector(Collector):
    """Scrape-time gauges and counters from ``EngineStats``."""

    def __init__(self, stats: Callable[[], EngineStats], model_name: str, info: Mapping[str, str]) -> None:
        self._stats = stats
        self._labels = [model_name, "0"]
        self._info = dict(info)

    def collect(self) -> Iterator[Metric]:
        s = self._stats()
        gauges = (
            (VLLM_RUNNING, "Number of requests in model execution batches.", s.running),
            (VLLM_WAITING, "Number of requests waiting to be processed.", s.waiting),
            (VLLM_KV_CACHE_USAGE, "KV-cache usage. 1 means 100 percent usage.", s.kv_usage),
        )
        for name, doc, value in gauges:
            g = GaugeMetricFamily(name, doc, labels=LABELS)
            g.add_metric(self._labels, value)
            yield g
        counters = (
            (VLLM_PREFIX_CACHE_QUERIES, "Prefix cache queries, in terms of number of queried tokens.",
             s.prefix_cache_queries),
            (VLLM_PREFIX_CACHE_HITS, "Prefix cache hits, in terms of number of cached tokens.",
             s.prefix_cache_hits),
            (VLLM_PROMPT_TOKENS, "Number of prefill tokens processed.", s.prompt_tokens),
            (VLLM_GENERATION_TOKENS, "Number of generation tokens processed.", s.generation_tokens),
            (VLLM_PREEMPTIONS, "Cumulative number of preemption from the engine.", s.preemptions),
        )
        for name, doc, value in counters:
            c = CounterMetricFamily(name, doc, labels=LABELS)
            c.add_metric(self._labels, value)
            yield c
        if self._info:
            info = GaugeMetricFamily(REPLICA_INFO, "Identity of this replica (always 1).",
                                     labels=list(self._info))
            info.add_metric(list(self._info.values()), 1)
            yield info


class ReplicaMetrics:
    """The replica's Prometheus registry: engine gauges and counters plus latency histograms."""

    def __init__(self, model_name: str, stats: Callable[[], EngineStats],
                 info: Mapping[str, str] | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_EngineCollector(stats, model_name, info or {}))
        self._ttft = Histogram(VLLM_TTFT, "Histogram of time to first token in seconds.",
                               LABELS, registry=self.registry, buckets=TTFT_BUCKETS).labels(model_name, "0")
        self._itl = Histogram(VLLM_ITL, "Histogram of inter-token latency in seconds.",
                              LABELS, registry=self.registry, buckets=ITL_BUCKETS).labels(model_name, "0")
        self._e2e = Histogram(VLLM_E2E, "Histogram of e2e request latency in seconds.",
                              LABELS, registry=self.registry, buckets=E2E_BUCKETS).labels(model_name, "0")
        success = Counter(VLLM_REQUEST_SUCCESS, "Count of successfully processed requests.",
                          (*LABELS, FINISHED_REASON_LABEL), registry=self.registry)
        self._success = {r: success.labels(model_name, "0", r) for r in FINISHED_REASONS}

    def finished(self, reason: str) -> None:
        """One request left the engine with ``reason`` (``stop``, ``length`` or ``abort``; any
        other value counts as ``abort``)."""
        self._success.get(reason, self._success[FINISHED_ABORT]).inc()

    def observe_step(self, result: StepResult) -> None:
        """Record the latencies of one step's tokens (model seconds)."""
        for out in result.outputs:
            (self._ttft if out.index == 0 else self._itl).observe(out.interval_s)
            if out.e2e_s is not None:
                self._e2e.observe(out.e2e_s)

    def render(self) -> bytes:
        """The Prometheus text exposition."""
        return generate_latest(self.registry)

"""Prometheus metrics of the batch service, on a registry passed in (nothing global).

* ``modelfleet_batch_lines_total{team,model,outcome}``: lines ended (completed, failed,
  expired, cancelled) by this worker;
* ``modelfleet_batch_requests_total{team,model,tier}``: requests sent (every attempt);
* ``modelfleet_batch_throttled_total{team,model,status}``: 429/503 answers, or ``unreachable``
  (no connection to the API): the batch paused;
* ``modelfleet_batch_batches_total{team,status}``: batches that reached a final status;
* ``modelfleet_batch_at_risk_batches{team}``: running batches forecast to miss their deadline;
* ``modelfleet_batch_paused_batches{team}``: running batches waiting out a Retry-After.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge


@dataclass(frozen=True)
class BatchMetrics:
    """The batch service's metric families."""

    lines: Counter
    requests: Counter
    throttled: Counter
    batches: Counter
    at_risk: Gauge
    paused: Gauge


def make_batch_metrics(registry: CollectorRegistry) -> BatchMetrics:
    """The metric families, registered on ``registry``."""
    return BatchMetrics(
        lines=Counter("modelfleet_batch_lines_total", "Batch lines ended, by outcome.",
                      ["team", "model", "outcome"], registry=registry),
        requests=Counter("modelfleet_batch_requests_total",
                         "Batch requests sent through the gateway, by tier.",
                         ["team", "model", "tier"], registry=registry),
        throttled=Counter("modelfleet_batch_throttled_total",
                          "429/503 answers to batch requests (the batch paused).",
                          ["team", "model", "status"], registry=registry),
        batches=Counter("modelfleet_batch_batches_total", "Batches that reached a final status.",
                        ["team", "status"], registry=registry),
        at_risk=Gauge("modelfleet_batch_at_risk_batches",
                      "Running batches forecast to miss their deadline.", ["team"],
                      registry=registry),
        paused=Gauge("modelfleet_batch_paused_batches",
                     "Running batches waiting out a Retry-After.", ["team"], registry=registry),
    )

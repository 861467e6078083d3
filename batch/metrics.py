"""Prometheus metrics of the batch service, on a registry passed in (nothing global).

* ``modelfleet_batch_lines_total{team,model,outcome}``: lines ended (completed, failed,
  expired, cancelled) by this worker;
* ``modelfleet_batch_requests_total{team,model,tier}``: requests sent (every attempt);
* ``modelfleet_batch_throttled_total{team,model,status}``: 429/503 answers, or ``unreachable``
  (no connection to the API): the batch paused;
* ``modelfleet_batch_batches_total{team,status}``: batches that reached a final status;
* ``modelfleet_batch_at_risk_batches{team}``: running batches forecast to miss their deadline;
* ``modelfleet_batch_paused_batches{team}``: running batches waiting out a Retry-After.

Names and label names come from :mod:`modelfleet.contract.metrics`.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge

from modelfleet.contract.metrics import (
    BATCH_AT_RISK,
    BATCH_BATCHES,
    BATCH_LINES,
    BATCH_PAUSED,
    BATCH_REQUESTS,
    BATCH_THROTTLED,
    MODEL_LABEL,
    OUTCOME_LABEL,
    STATUS_LABEL,
    TEAM_LABEL,
    TIER_LABEL,
)


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
    team_model = [TEAM_LABEL, MODEL_LABEL]
    return BatchMetrics(
        lines=Counter(BATCH_LINES, "Batch lines ended, by outcome.",
                      [*team_model, OUTCOME_LABEL], registry=registry),
        requests=Counter(BATCH_REQUESTS, "Batch requests sent through the gateway, by tier.",
                         [*team_model, TIER_LABEL], registry=registry),
        throttled=Counter(BATCH_THROTTLED,
                          "429/503 answers to batch requests (the batch paused).",
                          [*team_model, STATUS_LABEL], registry=registry),
        batches=Counter(BATCH_BATCHES, "Batches that reached a final status.",
                        [TEAM_LABEL, STATUS_LABEL], registry=registry),
        at_risk=Gauge(BATCH_AT_RISK, "Running batches forecast to miss their deadline.",
                      [TEAM_LABEL], registry=registry),
        paused=Gauge(BATCH_PAUSED, "Running batches waiting out a Retry-After.", [TEAM_LABEL],
                     registry=registry),
    )

"""A pool's triggers, shared by its ScaledObject and by the local and simulated scalers.

Every trigger is an ``AverageValue`` metric with a target per replica, so the HPA asks for
``ceil(total / target)`` replicas and KEDA's fallback can stand in for a lost one:

- ``tokens-in-flight``: PromQL sum of ``modelfleet_replica_tokens_in_flight`` (the replica
  middleware's gauge, the figure its heartbeats report and the load test measures) over the
  pool, target the version's load-tested tokens in flight per replica x 0.70;
- ``queue-depth``: PromQL sum of ``vllm:num_requests_waiting`` over the pool plus the gateways'
  ``modelfleet_gateway_pool_queue_depth`` for it, target a tenth of the version's load-tested
  streams per replica: the fast trigger;
- ``peak-<name>``: one cron window per known peak, reading ``desired_replicas`` inside the
  window and 1 outside it, against a target of 1.

Metric and label names come from :mod:`modelfleet.contract.metrics` (through
:mod:`autoscale.naming`'s queries), so the local and simulated scalers, KEDA and the rules read
the same series.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from autoscale.cron import window_active
from autoscale.naming import queue_depth_query, tokens_in_flight_query
from autoscale.policy import peaks_for, queue_threshold, tokens_threshold
from autoscale.rule import Reading
from modelfleet.config.autoscaling import AutoscalePolicy, CronPeak
from modelfleet.config.schema import Pool, Version

TOKENS_TRIGGER = "tokens-in-flight"
QUEUE_TRIGGER = "queue-depth"


@dataclass(frozen=True)
class PoolTrigger:
    """One trigger of a pool: ``target`` per replica (tokens, requests, or replicas for cron),
    the PromQL ``query`` of a prometheus trigger, the ``peak`` of a cron one."""

    name: str
    kind: Literal["prometheus", "cron"]
    target: float
    query: str = ""
    peak: CronPeak | None = None


def pool_triggers(pool: Pool, version: Version, policy: AutoscalePolicy,
                  namespace: str) -> tuple[PoolTrigger, ...]:
    """The pool's triggers, in ScaledObject order; ``version`` must be the pool's version."""
    if (pool.model, pool.version) != (version.model, version.version):
        raise ValueError(f"pool {pool.key} is not served by version {version.key}")
    prometheus = (
        PoolTrigger(TOKENS_TRIGGER, "prometheus", tokens_threshold(version, policy),
                    tokens_in_flight_query(namespace, pool.model, pool.version)),
        PoolTrigger(QUEUE_TRIGGER, "prometheus", queue_threshold(version, policy),
                    queue_depth_query(namespace, pool.model, pool.version)),
    )
    cron = tuple(PoolTrigger(f"peak-{p.name}", "cron", 1.0, peak=p) for p in peaks_for(pool, policy))
    return prometheus + cron


def cron_reading(trigger: PoolTrigger, at: datetime) -> Reading:
    """What KEDA's cron scaler reports at ``at`` (aware): ``desired_replicas`` inside the
    window, 1 outside, against a target of 1."""
    if trigger.peak is None:
        raise ValueError(f"trigger {trigger.name!r} is not a cron trigger")
    p = trigger.peak
    active = window_active(p.start, p.end, p.timezone, at)
    return Reading(trigger.name, 1.0, float(p.desired_replicas if active else 1), active=active)


def readings(triggers: Sequence[PoolTrigger], values: Mapping[str, float | None],
             at: datetime) -> list[Reading]:
    """Readings for :func:`autoscale.rule.desired_replicas`: each prometheus trigger's value
    from ``values`` (by trigger name; missing or None = a failed read), each cron trigger
    evaluated at ``at``."""
    out = []
    for t in triggers:
        if t.kind == "cron":
            out.append(cron_reading(t, at))
        else:
            out.append(Reading(t.name, t.target, values.get(t.name)))
    return out

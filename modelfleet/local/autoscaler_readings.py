"""What the local autoscaling loop reads, as plain data (pure): a pool's load from the control
plane's pool state (``GET /admin/pools/{model}/state``) and the gateway's admission queue per pool
from its ``/metrics`` text.

The pool state's ``tokens_in_flight`` is the sum of the replicas' heartbeats, which carry their
middleware's count: the same figure the middleware exports as
``modelfleet_replica_tokens_in_flight``, which KEDA's tokens trigger sums in a cluster.
"""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from autoscale.local_loop import Member, PoolLoad
from modelfleet.contract.metrics import GATEWAY_POOL_QUEUE_DEPTH, POOL_LABEL


def gateway_queue_depths(metrics_text: str) -> dict[str, float]:
    """Requests held in the gateway's admission queue per pool, all tiers, keyed by the ``pool``
    label's value: the pool key ``model@version`` (:mod:`modelfleet.contract.metrics`)."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == GATEWAY_POOL_QUEUE_DEPTH and POOL_LABEL in sample.labels:
                pool = sample.labels[POOL_LABEL]
                out[pool] = out.get(pool, 0.0) + sample.value
    return out


def pool_load(state: dict[str, Any] | None, key: str, members: list[Member],
          gateway_queue: dict[str, float] | None) -> PoolLoad:
    """The pool's readings: sums over its serving members' fresh beats, and the gateway's queue."""
    gq = None if gateway_queue is None else gateway_queue.get(key, 0.0)
    if state is None:
        return PoolLoad(None, None, gq)
    serving = {m.replica_id for m in members if m.phase == "serving"}
    rows = [r for r in state.get("replicas", [])
            if r["replica_id"] in serving and r.get("fresh") and r.get("state") != "draining"]
    return PoolLoad(float(sum(r["tokens_in_flight"] for r in rows)),
                    float(sum(r["queue_depth"] for r in rows)), gq)

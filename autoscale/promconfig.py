"""A plain Prometheus configuration that scrapes replicas with the labels the pool queries use.

In a cluster the PodMonitor of :func:`autoscale.naming.pod_monitor` sets ``namespace``,
``pool`` (``<model>@<version>``), ``model`` and ``version`` on every replica's series. Outside
one (``modelfleet up``, the tests) the same labels, with the same values, are set statically per
target, so the ScaledObjects' and the rollout guard's PromQL run unchanged against this config
(names from :mod:`modelfleet.contract.metrics`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from modelfleet.contract.metrics import (
    MODEL_LABEL,
    NAMESPACE_LABEL,
    POOL_LABEL,
    REPLICA_LABEL,
    VERSION_LABEL,
    pool_label_value,
)


def _duration(seconds: float) -> str:
    """A Prometheus duration: whole seconds as ``5s``, otherwise milliseconds."""
    return f"{int(seconds)}s" if float(seconds).is_integer() else f"{round(seconds * 1000)}ms"


@dataclass(frozen=True)
class ReplicaTarget:
    """One replica's metrics endpoint (``host:port``), the pool it belongs to, and its
    namespace when it differs from the config's."""

    address: str
    model: str
    version: str
    replica_id: str = ""
    namespace: str = ""


def prometheus_config(targets: Sequence[ReplicaTarget], *, namespace: str,
                      scrape_interval_s: float = 1.0,
                      gateways: Sequence[str] = ()) -> dict[str, Any]:
    """Prometheus' YAML config as a dict: one static target per replica, labelled
    ``namespace``, ``pool``, ``model``, ``version`` (and ``replica`` when known), and one per
    gateway_ext address in ``gateways`` (``host:port``, labelled ``namespace`` only: its series
    keep their own ``pool`` label, spelled the same), scraped every ``scrape_interval_s``
    seconds."""
    if scrape_interval_s <= 0:
        raise ValueError("the scrape interval must be positive")
    interval = _duration(scrape_interval_s)
    static = []
    for t in targets:
        labels = {NAMESPACE_LABEL: t.namespace or namespace,
                  POOL_LABEL: pool_label_value(t.model, t.version),
                  MODEL_LABEL: t.model, VERSION_LABEL: t.version}
        if t.replica_id:
            labels[REPLICA_LABEL] = t.replica_id
        static.append({"targets": [t.address], "labels": labels})
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "scrape_configs": [{
            "job_name": "vllm-replicas",
            "metrics_path": "/metrics",
            "scrape_interval": interval,
            "scrape_timeout": interval,
            "static_configs": static,
        }] + ([{
            "job_name": "gateway-ext",
            "metrics_path": "/metrics",
            "scrape_interval": interval,
            "scrape_timeout": interval,
            "static_configs": [{"targets": list(gateways), "labels": {NAMESPACE_LABEL: namespace}}],
        }] if gateways else []),
    }

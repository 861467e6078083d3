"""KEDA ``ScaledObject`` manifests (``keda.sh/v1alpha1``, KEDA >= 2.10), one per pool, as dicts.

Field names follow KEDA's ScaledObject specification and its prometheus and cron scalers.
Per pool (one version in one region; names from :mod:`autoscale.naming`):

- ``scaleTargetRef``: the pool's Deployment ``vllm-<model>-<version>``;
- ``minReplicaCount`` the pool's warm minimum, ``maxReplicaCount`` its maximum;
- triggers (:mod:`autoscale.triggers`), all ``metricType: AverageValue``: tokens in flight at 70%
  of the load-tested figure, queue depth (engines plus gateway queues) as the fast trigger, a
  cron window per known peak;
  prometheus triggers carry ``ignoreNullValues: "false"`` so an empty answer (no replica
  scraped, Prometheus lost its targets) is an error, not a zero that scales the pool down;
- ``fallback``: after ``failureThreshold`` failed reads in a row a prometheus trigger asks for
  ``replicas`` (the pool's maximum by default): blind, the pool holds capacity for the peak;
- ``advanced.horizontalPodAutoscalerConfig.behavior``: up by 100% or 4 pods per 15 s (the larger),
  down by one pod per 600 s after a 600 s stabilisation window.
"""

from __future__ import annotations

from typing import Any

from autoscale.naming import (
    POD_MODEL_LABEL,
    POD_POOL_LABEL,
    POD_VERSION_LABEL,
    deployment_name,
    pool_name,
)
from autoscale.policy import behavior, fallback_replicas
from autoscale.triggers import PoolTrigger, pool_triggers
from modelfleet.config.autoscaling import AutoscalePolicy
from modelfleet.config.schema import PlatformConfig, Pool, Version

DEFAULT_NAMESPACE = "modelfleet"
"""The namespace of the replica pools (and their ScaledObjects)."""
DEFAULT_PROMETHEUS_URL = "http://prometheus-operated.monitoring.svc:9090"
"""The region's Prometheus as KEDA's operator reaches it (the Prometheus Operator's service)."""


def _number(x: float) -> str:
    """A KEDA metadata number: metadata values are strings."""
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def trigger_manifest(trigger: PoolTrigger, prometheus_url: str) -> dict[str, Any]:
    """One entry of ``spec.triggers``."""
    if trigger.kind == "cron":
        if trigger.peak is None:
            raise ValueError(f"cron trigger {trigger.name!r} has no peak")
        p = trigger.peak
        metadata = {"timezone": p.timezone, "start": p.start, "end": p.end,
                    "desiredReplicas": str(p.desired_replicas)}
    else:
        metadata = {
            "serverAddress": prometheus_url,
            "query": trigger.query,
            "threshold": _number(trigger.target),
            "activationThreshold": "0",
            "ignoreNullValues": "false",
        }
    return {"type": trigger.kind, "name": trigger.name, "metricType": "AverageValue",
            "metadata": metadata}


def scaled_object(pool: Pool, version: Version, policy: AutoscalePolicy, *,
                  namespace: str = DEFAULT_NAMESPACE,
                  prometheus_url: str = DEFAULT_PROMETHEUS_URL) -> dict[str, Any]:
    """The ScaledObject of ``pool`` (served by ``version``) as a plain dict."""
    name = deployment_name(pool.model, pool.version)
    triggers = pool_triggers(pool, version, policy, namespace)
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                "app.kubernetes.io/part-of": "modelfleet",
                POD_POOL_LABEL: pool_name(pool.model, pool.version),
                POD_MODEL_LABEL: pool.model,
                POD_VERSION_LABEL: pool.version,
                "modelfleet.io/region": pool.region,
            },
            "annotations": {
                "modelfleet.io/capacity-tokens-in-flight": str(version.capacity.tokens_in_flight),
                "modelfleet.io/capacity-streams": str(version.capacity.streams),
                "modelfleet.io/target-utilization": _number(policy.target_utilization),
            },
        },
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "pollingInterval": policy.polling_interval_s,
            "cooldownPeriod": policy.cooldown_s,
            "minReplicaCount": pool.min_replicas,
            "maxReplicaCount": pool.max_replicas,
            "fallback": {
                "failureThreshold": policy.fallback.failure_threshold,
                "replicas": fallback_replicas(pool, policy),
            },
            "advanced": {
                "restoreToOriginalReplicaCount": False,
                "horizontalPodAutoscalerConfig": {"behavior": behavior(policy).to_k8s()},
            },
            "triggers": [trigger_manifest(t, prometheus_url) for t in triggers],
        },
    }


def scaled_objects(config: PlatformConfig, policy: AutoscalePolicy | None = None, *,
                   region: str | None = None,
                   namespace: str = DEFAULT_NAMESPACE,
                   prometheus_url: str = DEFAULT_PROMETHEUS_URL) -> list[dict[str, Any]]:
    """ScaledObjects for every pool of ``config`` (only ``region``'s when given), with the
    config's ``autoscaling`` section unless ``policy`` is given; raises ``ValueError`` for a
    pool whose version is not declared."""
    policy = policy or config.autoscaling
    out = []
    for pool in config.pools:
        if region is not None and pool.region != region:
            continue
        version = config.version(pool.model, pool.version)
        if version is None:
            raise ValueError(f"pool {pool.key} in {pool.region} names an undeclared version")
        out.append(scaled_object(pool, version, policy, namespace=namespace,
                                 prometheus_url=prometheus_url))
    return out

"""Warm GPU capacity, as plain dicts: placeholder pods that hold running GPU nodes, and a
DaemonSet that keeps every version's weights on every GPU node's NVMe cache.

A replica that scales up preempts a placeholder (negative priority) and starts on a running node
whose disk already holds its weights: 14 s load + 30 s warm-up instead of a 6-minute cold start
(docs/autoscaling.md). The evicted placeholder goes pending and the cluster autoscaler adds a
node for it in the background. The priority is above the autoscaler's
``--expendable-pods-priority-cutoff`` (-10), or the pending placeholder would never ask for one.
"""

from __future__ import annotations

from typing import Any

from components.aws.gpu_types import GPU_RESOURCE, gpu_node_selector, gpu_tolerations
from components.k8s.pool_manifests import WEIGHTS_HOST_PATH, PoolSpec, fetch_weights_script

PLACEHOLDER_PRIORITY = -5
"""Below every real pod (0 and up), above the cluster autoscaler's expendable cutoff (-10)."""


def priority_class_name(gpu_type: str) -> str:
    """The placeholders' PriorityClass of one GPU type, e.g. ``modelfleet-warm-a100-80gb``."""
    return f"modelfleet-warm-{gpu_type}"


def priority_class(gpu_type: str) -> dict[str, Any]:
    """Negative priority; placeholders never preempt anything themselves."""
    return {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": priority_class_name(gpu_type),
                         "labels": {"app.kubernetes.io/part-of": "modelfleet"}},
            "value": PLACEHOLDER_PRIORITY, "globalDefault": False, "preemptionPolicy": "Never",
            "description": f"modelfleet warm {gpu_type} placeholders: evicted first by any replica"}


def placeholders(gpu_type: str, gpus: int, replicas: int, namespace: str, image: str) -> dict[str, Any]:
    """``replicas`` pause pods of ``gpus`` GPUs each: room for that many replicas of that shape."""
    name = f"warm-{gpu_type}-{gpus}gpu"
    labels = {"app.kubernetes.io/name": "warm-gpu", "modelfleet.io/gpu-type": gpu_type,
              "modelfleet.io/warm-gpus": str(gpus)}
    resources = {"cpu": "100m", "memory": "64Mi", GPU_RESOURCE: str(gpus)}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {**labels, "app.kubernetes.io/part-of": "modelfleet"}},
        "spec": {"replicas": replicas, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels},
            "spec": {"priorityClassName": priority_class_name(gpu_type),
                     "terminationGracePeriodSeconds": 0,
                     "nodeSelector": gpu_node_selector(gpu_type), "tolerations": gpu_tolerations(),
                     "containers": [{"name": "pause", "image": image,
                                     "resources": {"requests": resources, "limits": dict(resources)}}]}}},
    }


def prefetch(gpu_type: str, specs: list[PoolSpec], namespace: str, image: str) -> dict[str, Any]:
    """A DaemonSet on every ``gpu_type`` node: one init container per version fills and verifies
    the node's weights cache (the pools' own init containers then find it verified), then a pause
    container keeps the pod, so a new node is warmed as soon as it joins."""
    if not specs:
        raise ValueError(f"no versions to prefetch on {gpu_type} nodes")
    name = f"weights-prefetch-{gpu_type}"
    labels = {"app.kubernetes.io/name": "weights-prefetch", "modelfleet.io/gpu-type": gpu_type}
    inits = [{"name": f"fetch-{i}", "image": s.aws_cli_image,
              "command": ["/bin/bash", "-c", fetch_weights_script(s)],
              "env": [{"name": "AWS_REGION", "value": s.pool.region}],
              "resources": {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "8Gi"}},
              "volumeMounts": [{"name": "weights", "mountPath": "/weights"}]}
             for i, s in enumerate(specs)]
    return {
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {**labels, "app.kubernetes.io/part-of": "modelfleet"},
                     "annotations": {"modelfleet.io/versions": ",".join(s.version.key for s in specs)}},
        "spec": {"selector": {"matchLabels": labels},
                 "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%"}},
                 "template": {"metadata": {"labels": labels}, "spec": {
                     "nodeSelector": gpu_node_selector(gpu_type), "tolerations": gpu_tolerations(),
                     "initContainers": inits,
                     "containers": [{"name": "pause", "image": image,
                                     "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}],
                     "volumes": [{"name": "weights", "hostPath": {"path": WEIGHTS_HOST_PATH,
                                                                  "type": "DirectoryOrCreate"}}]}}},
    }

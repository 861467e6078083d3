"""The platform's own services as plain dicts: the control plane, Envoy and gateway_ext.

They run on the system node group (no GPU), spread over zones, and carry the platform config
from one ConfigMap mounted at :data:`CONFIG_MOUNT` (the control plane reloads it when it
changes; no restart).
"""

from __future__ import annotations

import json
from typing import Any

CONFIG_MAP = "modelfleet-config"
CONFIG_MOUNT = "/etc/modelfleet/config"
DB_SECRET = "modelfleet-db"
CONTROL_PLANE = "control-plane"
XDS_PORT = 18000
"""The control plane's ADS (gRPC) port."""
CONTROL_HTTP_PORT = 8081
"""The control plane's HTTP API: replicas, heartbeats, router state, admin, ``/health``."""
LISTENER_PORT = 8080
"""Envoy's public listener (set by the control plane over LDS), behind the NLB's 443."""
ENVOY_ADMIN_PORT = 9901
GATEWAY_EXT = "gateway-ext"
GATEWAY_EXT_PORT = 8080
SYSTEM_NODES = {"modelfleet.io/node-role": "system"}


def labels(name: str) -> dict[str, str]:
    """Selector labels of one platform service."""
    return {"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": "modelfleet"}


def meta(name: str, namespace: str, **extra: Any) -> dict[str, Any]:
    """``metadata`` of a namespaced platform object."""
    return {"name": name, "namespace": namespace, "labels": labels(name), **extra}


def config_map(namespace: str, files: dict[str, str]) -> dict[str, Any]:
    """The declared platform config (``config/*.yaml``, file name -> text)."""
    if not files:
        raise ValueError("the platform config has no files")
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta(CONFIG_MAP, namespace),
            "data": dict(sorted(files.items()))}


def db_secret(namespace: str, url: Any) -> dict[str, Any]:
    """The registry and usage database URL (SQLAlchemy form) for the services' environment."""
    return {"apiVersion": "v1", "kind": "Secret", "metadata": meta(DB_SECRET, namespace),
            "type": "Opaque", "stringData": {"MODELFLEET_DATABASE_URL": url, "MODELFLEET_USAGE_DB_URL": url,
                                                  "MODELFLEET_GATEWAY_USAGE_DB_URL": url,
                                                  "MODELFLEET_BATCH_DB_URL": url}}


def envoy_bootstrap(namespace: str, bootstrap: dict[str, Any]) -> dict[str, Any]:
    """The bootstrap rendered by ``envoy_control.resources.bootstrap.render_bootstrap`` as a ConfigMap."""
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta("envoy-bootstrap", namespace),
            "data": {"bootstrap.json": json.dumps(bootstrap, indent=2, sort_keys=True)}}


def _probe(path: str, port: str, period_s: int, failures: int) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": port}, "periodSeconds": period_s,
            "failureThreshold": failures, "timeoutSeconds": 3}


def deployment(name: str, namespace: str, *, replicas: int, containers: list[dict[str, Any]],
               volumes: list[dict[str, Any]] | None = None, strategy: str = "RollingUpdate",
               grace_s: int = 30, pod_extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """A platform Deployment on the system nodes, spread over zones."""
    pod: dict[str, Any] = {
        "nodeSelector": SYSTEM_NODES, "terminationGracePeriodSeconds": grace_s,
        "containers": containers, "enableServiceLinks": False,
        "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                                       "whenUnsatisfiable": "ScheduleAnyway",
                                       "labelSelector": {"matchLabels": labels(name)}}],
        **(pod_extra or {}),
    }
    if volumes:
        pod["volumes"] = volumes
    spec: dict[str, Any] = {"replicas": replicas, "selector": {"matchLabels": labels(name)},
                            "strategy": {"type": strategy}, "revisionHistoryLimit": 5,
                            "template": {"metadata": {"labels": labels(name)}, "spec": pod}}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta(name, namespace), "spec": spec}


def container(name: str, image: str, *, command: list[str], args: list[str],
              ports: dict[str, int], health: tuple[str, str], cpu: str, memory: str,
              env: list[dict[str, Any]] | None = None, mounts: list[dict[str, Any]] | None = None,
              extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """A platform container; ``health`` is (path, port name) for readiness and liveness."""
    out: dict[str, Any] = {
        "name": name, "image": image, "command": command, "args": args,
        "ports": [{"name": n, "containerPort": p, "protocol": "TCP"} for n, p in ports.items()],
        "env": env or [],
        "resources": {"requests": {"cpu": cpu, "memory": memory}, "limits": {"memory": memory}},
        "readinessProbe": _probe(*health, 5, 2),
        "livenessProbe": _probe(*health, 10, 3),
        **(extra or {}),
    }
    if mounts:
        out["volumeMounts"] = mounts
    return out


def service(name: str, namespace: str, ports: dict[str, int], *, targets: dict[str, str] | None = None,
            annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    """A Service in front of one platform Deployment: ``ports`` by name, each targeting the
    container port of the same name unless ``targets`` names another."""
    metadata = meta(name, namespace)
    if annotations:
        metadata["annotations"] = annotations
    targets = targets or {}
    return {"apiVersion": "v1", "kind": "Service", "metadata": metadata,
            "spec": {"selector": labels(name), **spec,
                     "ports": [{"name": n, "port": p, "targetPort": targets.get(n, n), "protocol": "TCP"}
                               for n, p in ports.items()]}}


def hpa(name: str, namespace: str, lo: int, hi: int, cpu_percent: int = 60) -> dict[str, Any]:
    """CPU-based HPA (Envoy and gateway_ext are CPU-bound proxies); scale down after 5 minutes."""
    if not 1 <= lo <= hi:
        raise ValueError(f"{name}: replicas {lo}..{hi}")
    return {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": meta(name, namespace),
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
                     "minReplicas": lo, "maxReplicas": hi,
                     "metrics": [{"type": "Resource", "resource": {
                         "name": "cpu", "target": {"type": "Utilization", "averageUtilization": cpu_percent}}}],
                     "behavior": {"scaleDown": {"stabilizationWindowSeconds": 300}}}}


def pdb(name: str, namespace: str) -> dict[str, Any]:
    """At most one pod of the service down for maintenance at a time."""
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": meta(name, namespace),
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": labels(name)}}}

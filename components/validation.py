"""Check rendered Kubernetes objects against real schemas.

- built-in kinds: ``kubernetes-validate``'s OpenAPI schemas for :data:`KUBERNETES_VERSION`,
  strict (unknown fields are errors);
- ``ScaledObject``: the ``cloudcoil-models-keda`` 2.16 model with unknown fields forbidden;
- ``PodMonitor``: no schema package ships the Prometheus Operator's CRDs here, so the fields our
  PodMonitors use are checked by hand against the ``monitoring.coreos.com/v1`` API.
"""

from __future__ import annotations

from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
from cloudcoil.models.keda.v1alpha1 import ScaledObject
from pydantic import ValidationError

KUBERNETES_VERSION = "1.32.0"
"""The EKS version the stacks pin (``modelfleet:clusterVersion``), as kubernetes-validate names it."""
_ENDPOINT_FIELDS = {"port", "path", "interval", "scrapeTimeout", "relabelings", "metricRelabelings",
                    "scheme", "honorLabels"}


def _pod_monitor(obj: dict[str, Any]) -> list[str]:
    spec = obj.get("spec", {})
    out = [] if obj.get("apiVersion") == "monitoring.coreos.com/v1" else ["apiVersion must be monitoring.coreos.com/v1"]
    unknown = set(spec) - {"selector", "podMetricsEndpoints", "namespaceSelector", "jobLabel"}
    if unknown:
        out.append(f"unknown spec fields {sorted(unknown)}")
    if not spec.get("selector", {}).get("matchLabels"):
        out.append("spec.selector.matchLabels is required")
    endpoints = spec.get("podMetricsEndpoints") or []
    if not endpoints:
        out.append("spec.podMetricsEndpoints is empty")
    for i, ep in enumerate(endpoints):
        if set(ep) - _ENDPOINT_FIELDS:
            out.append(f"podMetricsEndpoints[{i}]: unknown fields {sorted(set(ep) - _ENDPOINT_FIELDS)}")
        for r in ep.get("relabelings", []):
            if not r.get("targetLabel") or not r.get("sourceLabels"):
                out.append(f"podMetricsEndpoints[{i}]: relabeling {r} needs sourceLabels and targetLabel")
    return out


def problems(obj: dict[str, Any], version: str = KUBERNETES_VERSION) -> list[str]:
    """What is wrong with one object (empty when valid)."""
    kind = obj.get("kind")
    if kind == "ScaledObject":
        try:
            ScaledObject.model_validate(obj, extra="forbid")
        except ValidationError as exc:
            return [str(exc)]
        return []
    if kind == "PodMonitor":
        return _pod_monitor(obj)
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except (kubernetes_validate.ValidationError, kubernetes_validate.SchemaNotFoundError) as exc:
        return [str(exc).splitlines()[0][:500]]
    return []


def invalid_objects(objects: list[dict[str, Any]], version: str = KUBERNETES_VERSION) -> dict[str, list[str]]:
    """``kind/namespace/name`` -> problems, for every object that has any."""
    out = {}
    for obj in objects:
        found = problems(obj, version)
        if found:
            meta = obj.get("metadata", {})
            out[f"{obj.get('kind')}/{meta.get('namespace', '')}/{meta.get('name')}"] = found
    return out

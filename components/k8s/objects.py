"""Declaring Kubernetes objects built as plain dicts, and the kubeconfig of an EKS cluster.

Manifests are built by pure functions as plain dicts (camelCase, exactly what ``kubectl apply``
takes), so tests and ``modelfleet render`` see the same object the cluster gets. :func:`declare`
turns one into the typed pulumi_kubernetes resource of its kind (a ``CustomResource`` for CRDs
such as ScaledObject and PodMonitor).
"""

from __future__ import annotations

import json
import re
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

_TYPED: dict[tuple[str, str], Any] = {
    ("v1", "Namespace"): k8s.core.v1.Namespace,
    ("v1", "ConfigMap"): k8s.core.v1.ConfigMap,
    ("v1", "Secret"): k8s.core.v1.Secret,
    ("v1", "Service"): k8s.core.v1.Service,
    ("v1", "ServiceAccount"): k8s.core.v1.ServiceAccount,
    ("apps/v1", "Deployment"): k8s.apps.v1.Deployment,
    ("apps/v1", "DaemonSet"): k8s.apps.v1.DaemonSet,
    ("policy/v1", "PodDisruptionBudget"): k8s.policy.v1.PodDisruptionBudget,
    ("rbac.authorization.k8s.io/v1", "Role"): k8s.rbac.v1.Role,
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): k8s.rbac.v1.RoleBinding,
    ("scheduling.k8s.io/v1", "PriorityClass"): k8s.scheduling.v1.PriorityClass,
    ("autoscaling/v2", "HorizontalPodAutoscaler"): k8s.autoscaling.v2.HorizontalPodAutoscaler,
}


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()


def resource_name(obj: dict[str, Any]) -> str:
    """The Pulumi name of a Kubernetes object: ``namespace/name``, or ``name`` when cluster-wide."""
    meta = obj["metadata"]
    return f"{meta['namespace']}/{meta['name']}" if meta.get("namespace") else str(meta["name"])


def declare(obj: dict[str, Any], opts: pulumi.ResourceOptions) -> pulumi.CustomResource:
    """Declare ``obj`` (a manifest dict with ``apiVersion``, ``kind``, ``metadata``) as a resource.

    Built-in kinds get their typed resource; any other kind is a ``CustomResource``, whose CRD
    must be installed first (pass ``depends_on`` in ``opts``).
    """
    api_version, kind = obj["apiVersion"], obj["kind"]
    name = resource_name(obj)
    body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind")}
    typed = _TYPED.get((api_version, kind))
    if typed is None:
        extra = {k: v for k, v in body.items() if k not in ("metadata", "spec")}
        if extra:
            raise ValueError(f"{kind} {name}: custom resources take metadata and spec only")
        return k8s.apiextensions.CustomResource(
            name, api_version=api_version, kind=kind, metadata=body["metadata"],
            spec=body.get("spec"), opts=opts)
    resource: pulumi.CustomResource = typed(name, opts=opts, **{_snake(k): v for k, v in body.items()})
    return resource


def kubeconfig(cluster_name: pulumi.Input[str], endpoint: pulumi.Input[str],
               ca_data: pulumi.Input[str], region: str) -> pulumi.Output[str]:
    """A kubeconfig (JSON) for an EKS cluster that authenticates with ``aws eks get-token``."""

    def render(args: list[Any]) -> str:
        name, server, ca = args
        user = {"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1", "command": "aws",
                         "args": ["eks", "get-token", "--cluster-name", name, "--region", region]}}
        return json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": name,
            "clusters": [{"name": name, "cluster": {"server": server,
                                                    "certificate-authority-data": ca}}],
            "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
            "users": [{"name": name, "user": user}],
        })

    return pulumi.Output.secret(pulumi.Output.all(cluster_name, endpoint, ca_data).apply(render))

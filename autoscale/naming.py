"""Kubernetes names, pod labels and Prometheus labels of one pool, and the PromQL over them.

A pool is one version (``model@version``) in one region, and one region is one cluster, so
inside a cluster the pool is named by model and version alone:

- pool name ``<model>-<version>`` (``chat-7b-v13``): Kubernetes names and label values cannot
  hold ``@``; a ``.`` in the version (``v1.2``) becomes ``-`` and, because that could collide
  with a version spelled with a dash, the name then gets an 8-hex-digit hash of the key. A name
  that would pass 58 characters is cut and hashed the same way, so every derived name stays a
  63-character DNS label;
- Deployment (and ScaledObject) ``vllm-<pool name>`` (``vllm-chat-7b-v13``); KEDA names the HPA
  it creates ``keda-hpa-vllm-chat-7b-v13``;
- pod labels ``modelfleet.io/pool``, ``modelfleet.io/model``, ``modelfleet.io/version`` and
  ``app.kubernetes.io/name: vllm``.

Metrics: each replica exports vLLM's gauges (``vllm:num_requests_waiting``) and the
middleware's ``modelfleet_tokens_in_flight``, labelled ``model_name`` and ``engine`` by the
replica; each gateway_ext pod exports its admission queue per pool
(``modelfleet_gateway_pool_queue_depth{pool="<model>@<version>", tier}``), scraped by
:func:`gateway_pod_monitor`. The PodMonitor (:func:`pod_monitor`) copies the pod label ``modelfleet.io/pool`` to
the Prometheus label ``pool``; the Prometheus Operator adds ``namespace`` and ``pod``. A pool's
series are therefore selected by ``{namespace="<ns>", pool="<pool name>"}``; ``model_name`` is
not used because a canary and the live version serve the same model name.
"""

from __future__ import annotations

import hashlib
from typing import Any

POOL_LABEL = "pool"
"""The Prometheus label that names a pool (copied from the pod label :data:`POD_POOL_LABEL`)."""
NAMESPACE_LABEL = "namespace"
"""The Prometheus label the Prometheus Operator sets to the pod's namespace."""
POD_POOL_LABEL = "modelfleet.io/pool"
POD_MODEL_LABEL = "modelfleet.io/model"
POD_VERSION_LABEL = "modelfleet.io/version"
APP_LABEL = "app.kubernetes.io/name"
APP_NAME = "vllm"

TOKENS_IN_FLIGHT_METRIC = "modelfleet_tokens_in_flight"
"""Gauge, tokens: prompt plus remaining output of every request a replica holds."""
QUEUE_DEPTH_METRIC = "vllm:num_requests_waiting"
"""vLLM's gauge, requests: requests waiting for a place in the running batch."""
GATEWAY_QUEUE_METRIC = "modelfleet_gateway_pool_queue_depth"
"""gateway_ext's gauge, requests: requests held in its admission queue for a pool, labelled
``pool`` = ``model@version`` and ``tier`` (``gateway_ext.metrics``); one series per gateway pod."""

_MAX_POOL_NAME = 58  # "vllm-" + 58 = 63, the DNS-label limit


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def pool_name(model: str, version: str) -> str:
    """The pool's name inside its cluster, e.g. ``chat-7b-v13`` for ``chat-7b@v13``."""
    raw = f"{model}-{version}"
    name = raw.replace(".", "-")
    if name == raw and len(name) <= _MAX_POOL_NAME:
        return name
    suffix = _short_hash(f"{model}@{version}")
    return f"{name[: _MAX_POOL_NAME - 9].rstrip('-')}-{suffix}"


def deployment_name(model: str, version: str) -> str:
    """The Deployment (and ScaledObject) name of the pool, e.g. ``vllm-chat-7b-v13``."""
    return f"{APP_NAME}-{pool_name(model, version)}"


def pod_labels(model: str, version: str) -> dict[str, str]:
    """The labels every replica pod of the pool carries (the Deployment's selector and template)."""
    return {
        APP_LABEL: APP_NAME,
        POD_POOL_LABEL: pool_name(model, version),
        POD_MODEL_LABEL: model,
        POD_VERSION_LABEL: version,
    }


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def pool_selector(namespace: str, model: str, version: str) -> str:
    """The PromQL label matcher of one pool's series: ``{namespace="...",pool="..."}``."""
    return (f"{{{NAMESPACE_LABEL}={_quote(namespace)},"
            f"{POOL_LABEL}={_quote(pool_name(model, version))}}}")


def tokens_in_flight_query(namespace: str, model: str, version: str) -> str:
    """PromQL: the pool's tokens in flight summed over its replicas (tokens). Empty when no
    replica is scraped, which KEDA reads as an error with ``ignoreNullValues: "false"``."""
    return f"sum({TOKENS_IN_FLIGHT_METRIC}{pool_selector(namespace, model, version)})"


def gateway_queue_selector(namespace: str, model: str, version: str) -> str:
    """The PromQL label matcher of a pool's gateway queue series: gateway_ext labels them
    ``pool="<model>@<version>"`` itself (its pods carry no pool label, so nothing renames it)."""
    return f"{{{NAMESPACE_LABEL}={_quote(namespace)},{POOL_LABEL}={_quote(f'{model}@{version}')}}}"


def queue_depth_query(namespace: str, model: str, version: str) -> str:
    """PromQL: requests waiting for the pool (requests): those waiting in its engines, summed
    over its replicas, plus those held in the gateways' admission queues for it (every tier,
    every gateway pod). The engines' part decides emptiness: no replica scraped -> empty (a
    failed read); no gateway series (no gateway scraped yet, or none queued) counts as 0."""
    engines = f"sum({QUEUE_DEPTH_METRIC}{pool_selector(namespace, model, version)})"
    gateways = f"sum({GATEWAY_QUEUE_METRIC}{gateway_queue_selector(namespace, model, version)})"
    return f"{engines} + ({gateways} or vector(0))"


def pod_monitor(namespace: str, *, port: str = "http", interval_s: int = 5) -> dict[str, Any]:
    """The Prometheus Operator ``PodMonitor`` that scrapes every replica pod in ``namespace``
    every ``interval_s`` seconds and sets the ``pool`` label the queries above select on."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": {"name": "vllm-replicas", "namespace": namespace},
        "spec": {
            "selector": {"matchLabels": {APP_LABEL: APP_NAME}},
            "podMetricsEndpoints": [{
                "port": port,
                "path": "/metrics",
                "interval": f"{interval_s}s",
                "relabelings": [
                    {"sourceLabels": [_meta_label(POD_POOL_LABEL)], "targetLabel": POOL_LABEL},
                    {"sourceLabels": [_meta_label(POD_MODEL_LABEL)], "targetLabel": "model"},
                    {"sourceLabels": [_meta_label(POD_VERSION_LABEL)], "targetLabel": "version"},
                ],
            }],
        },
    }


def _meta_label(pod_label: str) -> str:
    """Prometheus' service-discovery name of a pod label (non-alphanumerics become ``_``)."""
    return "__meta_kubernetes_pod_label_" + "".join(c if c.isalnum() else "_" for c in pod_label)


def gateway_pod_monitor(namespace: str, *, port: str = "http", interval_s: int = 5) -> dict[str, Any]:
    """The ``PodMonitor`` that scrapes gateway_ext pods (``app.kubernetes.io/name:
    gateway-ext``) in ``namespace``: their per-pool admission queue is part of the queue
    trigger. No relabelling: the series keep the ``pool`` label gateway_ext sets."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": {"name": "gateway-ext", "namespace": namespace},
        "spec": {
            "selector": {"matchLabels": {APP_LABEL: "gateway-ext"}},
            "podMetricsEndpoints": [{"port": port, "path": "/metrics", "interval": f"{interval_s}s"}],
        },
    }

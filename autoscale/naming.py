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

Metrics (names from :mod:`modelfleet.contract.metrics`): each replica exports vLLM's gauges
(``vllm:num_requests_waiting``) and its middleware's ``modelfleet_replica_tokens_in_flight`` (the
middleware runs in real vLLM and the simulated engine alike, so every replica exports it); each
gateway_ext pod exports its admission queue per pool
(``modelfleet_gateway_pool_queue_depth{pool="<model>@<version>", tier}``), scraped by
:func:`gateway_pod_monitor` without relabelling.

The Prometheus label ``pool`` has one spelling, ``<model>@<version>``
(:func:`modelfleet.contract.metrics.pool_label_value`), on replica and gateway series alike.
Pod label values cannot hold ``@``, so the PodMonitor (:func:`pod_monitor`) does not copy the
pod label ``modelfleet.io/pool`` (the pool *name* above): it joins ``modelfleet.io/model`` and
``modelfleet.io/version`` with ``@`` into ``pool``, and copies them to ``model`` and ``version``;
the Prometheus Operator adds ``namespace`` and ``pod``. A pool's series, from its replicas and
from the gateways, are therefore selected by one matcher (:func:`pool_selector`),
``{namespace="<ns>", pool="<model>@<version>"}``; ``model_name`` is not used because a canary
and the live version serve the same model name.
"""

from __future__ import annotations

import hashlib
from typing import Any

from modelfleet.contract.metrics import (
    GATEWAY_POOL_QUEUE_DEPTH,
    MODEL_LABEL,
    NAMESPACE_LABEL,
    POOL_LABEL,
    POOL_SEPARATOR,
    TOKENS_IN_FLIGHT,
    VERSION_LABEL,
    VLLM_WAITING,
    pool_label_value,
)

POD_POOL_LABEL = "modelfleet.io/pool"
"""The pod label holding the pool *name* (:func:`pool_name`, ``chat-7b-v13``): selectors only,
never copied to a Prometheus label."""
POD_MODEL_LABEL = "modelfleet.io/model"
POD_VERSION_LABEL = "modelfleet.io/version"
APP_LABEL = "app.kubernetes.io/name"
APP_NAME = "vllm"

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
    """The PromQL label matcher of one pool's series, its replicas' and the gateways' alike:
    ``{namespace="modelfleet",pool="chat-7b@v13"}``."""
    return (f"{{{NAMESPACE_LABEL}={_quote(namespace)},"
            f"{POOL_LABEL}={_quote(pool_label_value(model, version))}}}")


def tokens_in_flight_query(namespace: str, model: str, version: str) -> str:
    """PromQL: the pool's tokens in flight summed over its replicas (tokens). Empty when no
    replica is scraped, which KEDA reads as an error with ``ignoreNullValues: "false"``."""
    return f"sum({TOKENS_IN_FLIGHT}{pool_selector(namespace, model, version)})"


def queue_depth_query(namespace: str, model: str, version: str) -> str:
    """PromQL: requests waiting for the pool (requests): those waiting in its engines, summed
    over its replicas, plus those held in the gateways' admission queues for it (every tier,
    every gateway pod). The engines' part decides emptiness: no replica scraped -> empty (a
    failed read); no gateway series (no gateway scraped yet, or none queued) counts as 0."""
    selector = pool_selector(namespace, model, version)
    engines = f"sum({VLLM_WAITING}{selector})"
    gateways = f"sum({GATEWAY_POOL_QUEUE_DEPTH}{selector})"
    return f"{engines} + ({gateways} or vector(0))"


def pod_monitor(namespace: str, *, port: str = "http", interval_s: int = 5) -> dict[str, Any]:
    """The Prometheus Operator ``PodMonitor`` that scrapes every replica pod in ``namespace``
    every ``interval_s`` seconds and sets the ``pool`` label the queries above select on:
    ``<model>@<version>``, joined from the pod labels (a pod label cannot hold ``@``)."""
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
                    {"sourceLabels": [_meta_label(POD_MODEL_LABEL), _meta_label(POD_VERSION_LABEL)],
                     "separator": POOL_SEPARATOR, "targetLabel": POOL_LABEL},
                    {"sourceLabels": [_meta_label(POD_MODEL_LABEL)], "targetLabel": MODEL_LABEL},
                    {"sourceLabels": [_meta_label(POD_VERSION_LABEL)], "targetLabel": VERSION_LABEL},
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
    trigger. No relabelling: the series keep the ``pool`` label gateway_ext sets, already
    spelled ``<model>@<version>`` like the replicas'."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": {"name": "gateway-ext", "namespace": namespace},
        "spec": {
            "selector": {"matchLabels": {APP_LABEL: "gateway-ext"}},
            "podMetricsEndpoints": [{"port": port, "path": "/metrics", "interval": f"{interval_s}s"}],
        },
    }

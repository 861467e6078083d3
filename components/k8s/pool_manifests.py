"""The Kubernetes objects of one pool (one model version in one region), as plain dicts.

The Deployment runs the engine (vLLM, or SGLang where the version says so) on GPU nodes. Its
init container fills the node's NVMe weights cache from the region's bucket and checks the
weights against the version's ``weights_hash`` before the engine may start; a second pod of the
same version on the node finds them verified and skips the download. Probes, drain and names
come from ``autoscale`` so the scaler, the control plane and the pods agree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from autoscale.drain import DrainValues
from autoscale.naming import (
    APP_LABEL,
    APP_NAME,
    POD_POOL_LABEL,
    deployment_name,
    pod_labels,
    pod_monitor,
    pool_name,
)
from components.aws.buckets import MANIFEST, weights_prefix
from components.aws.gpu_types import GPU_RESOURCE, gpu_instance, gpu_node_selector, gpu_tolerations
from components.k8s.engine_args import (
    HTTP_PORT,
    WEIGHTS_MOUNT,
    sglang_command,
    vllm_command,
    weights_path,
)
from components.k8s.service_manifests import GATEWAY_EXT, GATEWAY_EXT_PORT
from modelfleet.config.hardware import GB, weights_bytes
from modelfleet.config.schema import Pool, Version

WEIGHTS_HOST_PATH = "/mnt/nvme/modelfleet/weights"
"""The weights cache on the node's RAID0 instance store (see ``components.aws.node_userdata``)."""
LOAD_GB_PER_S = 1.0
"""Weights loaded into GPU memory, GB per second (the seed's figure)."""
WARMUP_S = 30.0
"""CUDA graphs and first batches after loading, seconds (the seed's figure)."""
STARTUP_MARGIN = 3.0
"""The startup probe allows this many times the expected load + warm-up."""
SHM_GIB_PER_GPU = 8
"""``/dev/shm`` (NCCL between tensor-parallel workers), GiB per GPU, in memory."""


@dataclass(frozen=True)
class PoolSpec:
    """Everything one pool's objects are built from. ``bucket`` is the region's weights bucket;
    ``control_plane_url`` where replicas send heartbeats (HTTP)."""

    pool: Pool
    version: Version
    drain: DrainValues
    namespace: str
    image: str
    aws_cli_image: str
    bucket: str
    control_plane_url: str

    @property
    def settle_url(self) -> str:
        """Where the replicas' middleware reports actual usage: gateway_ext's ``/v1/settle``."""
        return f"http://{GATEWAY_EXT}.{self.namespace}.svc:{GATEWAY_EXT_PORT}/v1/settle"

    @property
    def name(self) -> str:
        """``vllm-<model>-<version>``: the Deployment, Service, PDB, PodMonitor and ScaledObject."""
        return deployment_name(self.pool.model, self.pool.version)

    @property
    def labels(self) -> dict[str, str]:
        return pod_labels(self.pool.model, self.pool.version)


def startup_budget_s(version: Version) -> int:
    """Seconds the startup probe waits for ``/health``: load + warm-up, times the margin, at least
    5 minutes (14 GB of 7B FP16: 14 + 30 s; 70 GB of 70B INT8: 70 + 30 s)."""
    gb = weights_bytes(version.architecture.params_billion, version.precision) / GB
    return max(300, math.ceil(STARTUP_MARGIN * (gb / LOAD_GB_PER_S + WARMUP_S)))


def fetch_weights_script(spec: PoolSpec) -> str:
    """Bash for the init container: download once per node under a lock, verify, mark verified."""
    v = spec.version
    want = v.weights_hash.removeprefix("sha256:")
    dest = f"{WEIGHTS_MOUNT}/{v.model}/{v.version}"
    return "\n".join([
        "set -euo pipefail",
        f'dest="{dest}"; want="{want}"',
        'mkdir -p "$dest"',
        'exec 9>"$dest.lock"; flock 9',
        'if [ -f "$dest/.verified" ] && [ "$(cat "$dest/.verified")" = "$want" ]; then',
        '  echo "weights cached and verified"; exit 0',
        "fi",
        'rm -f "$dest/.verified"',
        f'aws s3 sync --only-show-errors --delete "s3://{spec.bucket}/{weights_prefix(v)}" "$dest/"',
        f'got="$(sha256sum "$dest/{MANIFEST}" | cut -d" " -f1)"',
        'if [ "$got" != "$want" ]; then',
        f'  echo "weights manifest sha256 $got is not the version\'s {want}" >&2; exit 1',
        "fi",
        f'(cd "$dest" && sha256sum --quiet --strict -c {MANIFEST})',
        'echo "$want" > "$dest/.verified"',
    ])


def _probe(period_s: int, failures: int, timeout_s: int) -> dict[str, Any]:
    return {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": period_s,
            "failureThreshold": failures, "timeoutSeconds": timeout_s}


def engine_container(spec: PoolSpec) -> dict[str, Any]:
    """The engine container: command, GPUs, probes on ``/health``, drain, env."""
    v, gpus = spec.version, spec.version.gpus_per_replica
    shape = gpu_instance(v.gpu_type)
    if v.engine == "vllm":
        command, args = vllm_command(v, spec.drain.engine_args())
    else:
        command, args = sglang_command(v)
    resources = {"cpu": str(shape.cpu_per_gpu * gpus), "memory": f"{shape.memory_gib_per_gpu * gpus}Gi",
                 GPU_RESOURCE: str(gpus)}
    field = [("MODELFLEET_REPLICA_ID", "metadata.name"), ("MODELFLEET_REPLICA_IP", "status.podIP"),
             ("MODELFLEET_NODE", "spec.nodeName")]
    plain = {"MODELFLEET_REGION": spec.pool.region, "MODELFLEET_MODEL": v.model,
             "MODELFLEET_VERSION": v.version, "MODELFLEET_POOL": pool_name(v.model, v.version),
             "MODELFLEET_CONTROL_PLANE_URL": spec.control_plane_url,
             "MODELFLEET_SETTLE_URL": spec.settle_url,
             "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    return {
        "name": v.engine,
        "image": spec.image,
        "command": command,
        "args": args,
        "ports": [{"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"}],
        "env": [{"name": k, "valueFrom": {"fieldRef": {"fieldPath": f}}} for k, f in field]
        + [{"name": k, "value": val} for k, val in plain.items()],
        "resources": {"requests": resources, "limits": dict(resources)},
        "volumeMounts": [{"name": "weights", "mountPath": WEIGHTS_MOUNT, "readOnly": True},
                         {"name": "dshm", "mountPath": "/dev/shm"}],
        "startupProbe": _probe(10, math.ceil(startup_budget_s(v) / 10), 5),
        "readinessProbe": _probe(5, 3, 3),
        "livenessProbe": _probe(10, 6, 5),
        **spec.drain.container_fields(),
    }


def deployment(spec: PoolSpec) -> dict[str, Any]:
    """The pool's Deployment. ``replicas`` starts at the warm minimum; KEDA owns it after."""
    v = spec.version
    init = {
        "name": "fetch-weights",
        "image": spec.aws_cli_image,
        "command": ["/bin/bash", "-c", fetch_weights_script(spec)],
        "env": [{"name": "AWS_REGION", "value": spec.pool.region}],
        "resources": {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "8Gi"}},
        "volumeMounts": [{"name": "weights", "mountPath": WEIGHTS_MOUNT}],
    }
    pod = {
        "terminationGracePeriodSeconds": spec.drain.grace_s,
        "nodeSelector": gpu_node_selector(v.gpu_type),
        "tolerations": gpu_tolerations(),
        "enableServiceLinks": False,
        "initContainers": [init],
        "containers": [engine_container(spec)],
        "volumes": [
            {"name": "weights", "hostPath": {"path": WEIGHTS_HOST_PATH, "type": "DirectoryOrCreate"}},
            {"name": "dshm", "emptyDir": {"medium": "Memory",
                                          "sizeLimit": f"{SHM_GIB_PER_GPU * v.gpus_per_replica}Gi"}},
        ],
    }
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": _meta(spec, annotations={"modelfleet.io/weights": weights_path(v)}),
        "spec": {
            "replicas": spec.pool.min_replicas,
            "revisionHistoryLimit": 3,
            "selector": {"matchLabels": spec.labels},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {"metadata": {"labels": spec.labels,
                                      "annotations": {"modelfleet.io/weights-hash": v.weights_hash}},
                         "spec": pod},
        },
    }


def _meta(spec: PoolSpec, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": spec.name, "namespace": spec.namespace,
                            "labels": {**spec.labels, "app.kubernetes.io/part-of": "modelfleet",
                                       "modelfleet.io/region": spec.pool.region}}
    if annotations:
        meta["annotations"] = annotations
    return meta


def service(spec: PoolSpec) -> dict[str, Any]:
    """Headless Service: its EndpointSlices (which carry the Service's labels) are how the control
    plane sees the pool's ready and terminating replicas; Envoy connects to pod IPs directly."""
    return {"apiVersion": "v1", "kind": "Service", "metadata": _meta(spec),
            "spec": {"clusterIP": "None", "selector": spec.labels, "publishNotReadyAddresses": False,
                     "ports": [{"name": "http", "port": HTTP_PORT, "targetPort": "http",
                                "protocol": "TCP", "appProtocol": "http"}]}}


def disruption_budget(spec: PoolSpec) -> dict[str, Any]:
    """At most one replica of the pool drained at a time by node maintenance."""
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": _meta(spec),
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": spec.labels}}}


def monitor(spec: PoolSpec) -> dict[str, Any]:
    """``autoscale.naming.pod_monitor`` narrowed to this pool (same relabelings, own name)."""
    obj = pod_monitor(spec.namespace)
    obj["metadata"] = _meta(spec)
    obj["spec"]["selector"] = {"matchLabels": {APP_LABEL: APP_NAME,
                                               POD_POOL_LABEL: spec.labels[POD_POOL_LABEL]}}
    return obj

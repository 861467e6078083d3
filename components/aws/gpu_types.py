"""GPU node shapes per ``gpu_type`` of the config (pure data).

Every GPU type maps to one 8-GPU EC2 instance type, so a tensor-parallel replica of up to 8 GPUs
always fits on one node and 1-, 2- and 4-GPU replicas pack a node without stranding GPUs. Figures
are AWS's published instance specs: vCPUs, memory in GiB, local NVMe instance store in GB
(decimal, as AWS quotes it) and its number of disks (striped as RAID0 for the weights cache).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GPU_RESOURCE = "nvidia.com/gpu"
"""The extended resource the NVIDIA device plugin advertises, in GPUs."""
GPU_TAINT_KEY = "nvidia.com/gpu"
"""GPU nodes are tainted ``nvidia.com/gpu:NoSchedule``: only pods that tolerate it land there."""
GPU_PRESENT_LABEL = "nvidia.com/gpu.present"
"""Label on every GPU node (``"true"``), the one NVIDIA's own charts select on."""
GPU_TYPE_LABEL = "modelfleet.io/gpu-type"
"""Label on every GPU node naming its config ``gpu_type``: pools select their GPU with it."""
RESERVED_SHARE = 0.15
"""Share of a node's CPU and memory left to the kubelet, the OS and DaemonSets."""


@dataclass(frozen=True)
class GpuInstance:
    """One GPU node shape. ``memory_gib`` in GiB, ``nvme_gb`` in GB (total instance store)."""

    gpu_type: str
    instance_type: str
    gpus: int
    vcpus: int
    memory_gib: int
    nvme_gb: int
    nvme_disks: int

    @property
    def cpu_per_gpu(self) -> int:
        """Whole CPUs a replica may request per GPU, after the node's reserved share."""
        return math.floor(self.vcpus * (1 - RESERVED_SHARE) / self.gpus)

    @property
    def memory_gib_per_gpu(self) -> int:
        """GiB of memory a replica may request per GPU, after the node's reserved share."""
        return math.floor(self.memory_gib * (1 - RESERVED_SHARE) / self.gpus)


GPU_INSTANCES: dict[str, GpuInstance] = {
    g.gpu_type: g
    for g in (
        GpuInstance("a100-80gb", "p4de.24xlarge", 8, 96, 1152, 8000, 8),
        GpuInstance("h100-80gb", "p5.48xlarge", 8, 192, 2048, 30720, 8),
        GpuInstance("h200-141gb", "p5e.48xlarge", 8, 192, 2048, 30720, 8),
        GpuInstance("l40s-48gb", "g6e.48xlarge", 8, 192, 1536, 7600, 4),
        GpuInstance("a10g-24gb", "g5.48xlarge", 8, 192, 768, 7600, 2),
    )
}


def gpu_instance(gpu_type: str) -> GpuInstance:
    """The node shape of ``gpu_type``; ``ValueError`` for a type without one."""
    try:
        return GPU_INSTANCES[gpu_type]
    except KeyError:
        known = ", ".join(sorted(GPU_INSTANCES))
        raise ValueError(f"no GPU node shape for gpu_type {gpu_type!r} (known: {known})") from None


def gpu_tolerations() -> list[dict[str, str]]:
    """The toleration every GPU pod carries (replicas, placeholders, the device plugin)."""
    return [{"key": GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}]


def gpu_node_selector(gpu_type: str) -> dict[str, str]:
    """Node labels a pod of ``gpu_type`` selects on."""
    return {GPU_PRESENT_LABEL: "true", GPU_TYPE_LABEL: gpu_type}

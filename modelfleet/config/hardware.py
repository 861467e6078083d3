"""GPU and precision facts, and the memory arithmetic of one replica (pure functions).

Units: bytes for memory, billions for parameter counts. The figures are the seed's: an 80 GB
GPU, 2 bytes per FP16 weight, 1 per INT8, 0.5 per 4-bit weight; the KV cache is stored at 2
bytes per value whatever the weight precision ("quantized weights do not shrink the KV cache").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Precision = Literal["fp16", "int8", "4bit"]

GB = 1_000_000_000
"""One gigabyte in bytes (decimal, as GPU memory is quoted in the seed)."""

BYTES_PER_WEIGHT: dict[str, float] = {"fp16": 2.0, "int8": 1.0, "4bit": 0.5}
KV_BYTES_PER_VALUE = 2
"""The KV cache stays FP16 whatever the weight precision."""


@dataclass(frozen=True)
class GpuType:
    """One accelerator model: memory in bytes, HBM bandwidth in bytes per second."""

    name: str
    memory_bytes: int
    hbm_bytes_per_s: float


GPU_TYPES: dict[str, GpuType] = {
    g.name: g
    for g in (
        GpuType("a100-80gb", 80 * GB, 2.0e12),
        GpuType("h100-80gb", 80 * GB, 3.35e12),
        GpuType("h200-141gb", 141 * GB, 4.8e12),
        GpuType("l40s-48gb", 48 * GB, 0.864e12),
        GpuType("a10g-24gb", 24 * GB, 0.6e12),
    )
}

MIN_KV_FRACTION = 0.25
"""A replica has a *useful* KV cache when at least this fraction of its GPU memory is left for
it after the weights. 70B FP16 on 2 x 80 GB leaves 20 of 160 GB (12.5%): rejected; INT8 on 2
leaves 90 of 160 (56%); 4-bit on 1 leaves 45 of 80 (56%); 7B FP16 on 1 leaves 66 of 80."""


def weights_bytes(params_billion: float, precision: str) -> int:
    """Bytes of weights for a model of ``params_billion`` parameters at ``precision``."""
    return int(params_billion * GB * BYTES_PER_WEIGHT[precision])


def kv_bytes_per_token(
    layers: int, kv_heads: int, head_dim: int, bytes_per_value: int = KV_BYTES_PER_VALUE
) -> int:
    """Bytes of KV cache per token: keys and values, every layer and KV head.

    The seed's 7B: 2 x 32 layers x 8 heads x 128 x 2 bytes = 131,072 bytes per token.
    """
    return 2 * layers * kv_heads * head_dim * bytes_per_value


def kv_cache_bytes(
    gpu: GpuType, gpus: int, weights: int, gpu_memory_utilization: float = 1.0
) -> int:
    """Bytes left for the KV cache on ``gpus`` GPUs after ``weights`` bytes of weights.

    ``gpu_memory_utilization`` is vLLM's share of GPU memory it may use (0..1). Negative when
    the weights do not fit at all.
    """
    return int(gpu.memory_bytes * gpus * gpu_memory_utilization) - weights

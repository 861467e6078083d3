"""The simulated engine's parameters for a version of the config (pure): weights and KV bytes
from the architecture and precision, memory from the GPU type, capacity from the load test.
The local stack passes them to each simulated replica; the simulator and the release gate's
engine-only load test build engines from them."""

from __future__ import annotations

from typing import Any

from modelfleet.config import Version
from modelfleet.config.hardware import GPU_TYPES, kv_bytes_per_token, weights_bytes


def engine_params(version: Version) -> dict[str, Any]:
    """The simulated engine's parameters (``replica.params.EngineParams`` fields) for ``version``."""
    arch = version.architecture
    ec = version.engine_config
    return {
        "weights_bytes": weights_bytes(arch.params_billion, version.precision),
        "kv_bytes_per_token": kv_bytes_per_token(arch.layers, arch.kv_heads, arch.head_dim),
        "capacity_tokens_per_s": version.capacity.output_tokens_per_s,
        "capacity_streams": version.capacity.streams,
        "gpu_memory_bytes": GPU_TYPES[version.gpu_type].memory_bytes,
        "num_gpus": version.gpus_per_replica,
        "gpu_memory_utilization": ec.gpu_memory_utilization,
        "max_num_seqs": ec.max_num_seqs,
        "max_model_len": ec.max_model_len,
        "enable_prefix_caching": ec.enable_prefix_caching,
    }

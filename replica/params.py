"""Engine parameters of one model version, and the step-time model calibrated from them.

Plain data only: every field is a number a config file or a load test can supply. Units are in
the field names or docstrings: bytes, tokens, seconds, tokens per second.

The step-time model (one engine iteration of a continuously batched replica)::

    step_s = step_overhead_s
           + (weights_bytes + kv_bytes_per_token * context_tokens) / decode_bandwidth
           + uncached_prefill_tokens / prefill_tokens_per_s

Decode is memory-bandwidth bound: every step reads the weights once plus the KV cache of every
sequence in the batch, so the step grows with the batch and with each sequence's length. Prefill
is compute bound and costs time in proportion to the prompt tokens the prefix cache did not hold.

``decode_bandwidth`` is not a datasheet figure: it is solved so that the replica delivers the
load-tested capacity (``capacity_tokens_per_s`` at ``capacity_streams`` concurrent streams) for
the calibration request shape (prompt, output and cached tokens per request). In a closed loop
of N streams each request spends ``output`` steps in the batch, so the output rate is
``N / (step_s(N) + N * uncached / (output * prefill_tokens_per_s))``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

GB = 1_000_000_000
"""One gigabyte in bytes (decimal, as GPU memory is quoted in the seed)."""


@dataclass(frozen=True)
class EngineParams:
    """Everything the simulated engine needs to know about one model version on its GPUs."""

    weights_bytes: int
    """Bytes of weights, read once per decode step."""
    kv_bytes_per_token: int
    """Bytes of KV cache per token (keys and values, every layer and KV head)."""
    capacity_tokens_per_s: float
    """Load-tested output tokens per second of one replica at ``capacity_streams``."""
    capacity_streams: int
    """Concurrent streams at which ``capacity_tokens_per_s`` was measured."""
    gpu_memory_bytes: int = 80 * GB
    """Memory of one GPU in bytes."""
    num_gpus: int = 1
    """GPUs per replica (tensor parallelism)."""
    gpu_memory_utilization: float = 0.9
    """Share (0..1] of GPU memory the engine may use for weights plus KV cache, as in vLLM."""
    prefill_tokens_per_s_per_gpu: float = 10_000.0
    """Prompt tokens per second one GPU prefills (the seed's assumption)."""
    max_num_seqs: int = 256
    """Most sequences in the running batch, as vLLM's ``--max-num-seqs``."""
    max_num_batched_tokens: int = 8192
    """Token budget of one step (decode tokens plus prefill tokens); one prompt may exceed it."""
    block_size: int = 16
    """Tokens per KV-cache block, the unit of allocation and of prefix caching."""
    max_model_len: int = 8192
    """Longest prompt plus output, in tokens."""
    enable_prefix_caching: bool = True
    step_overhead_s: float = 0.002
    """Fixed scheduling and launch overhead of one step, in seconds."""
    calibration_prompt_tokens: int = 1200
    """Prompt tokens per request of the load test that measured the capacity (the seed's 1,200)."""
    calibration_output_tokens: int = 300
    """Output tokens per request of that load test (the seed's 300)."""
    calibration_cached_tokens: int = 640
    """Average prompt tokens per request the prefix cache held in that load test.

    The seed's 800-token cached prefix found 80% of the time: 0.8 x 800 = 640. With no cache,
    prefilling 1,200-token prompts for 2,500 output tokens/s takes 10,000 prompt tokens/s, all
    of one GPU's assumed prefill rate, and the seed's two assumptions could not both hold.
    """

    def __post_init__(self) -> None:
        positive = {
            "weights_bytes": self.weights_bytes,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "capacity_tokens_per_s": self.capacity_tokens_per_s,
            "capacity_streams": self.capacity_streams,
            "gpu_memory_bytes": self.gpu_memory_bytes,
            "num_gpus": self.num_gpus,
            "prefill_tokens_per_s_per_gpu": self.prefill_tokens_per_s_per_gpu,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "block_size": self.block_size,
            "max_model_len": self.max_model_len,
            "calibration_prompt_tokens": self.calibration_prompt_tokens,
            "calibration_output_tokens": self.calibration_output_tokens,
        }
        for name, value in positive.items():
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.step_overhead_s < 0:
            raise ValueError(f"step_overhead_s must be >= 0, got {self.step_overhead_s}")
        if not 0 <= self.calibration_cached_tokens < self.calibration_prompt_tokens:
            raise ValueError("calibration_cached_tokens must be in [0, calibration_prompt_tokens)")
        if self.kv_capacity_tokens < self.max_model_len:
            raise ValueError(
                f"KV cache holds {self.kv_capacity_tokens} tokens, less than max_model_len "
                f"{self.max_model_len}: the weights leave too little GPU memory"
            )
        if self._decode_step_budget_s() <= 0:
            raise ValueError(
                f"{self.capacity_tokens_per_s:g} output tokens/s at {self.capacity_streams} streams "
                "is unreachable: prefill of the calibration prompts and the step overhead alone "
                "take longer than the whole step budget"
            )

    @property
    def kv_capacity_tokens(self) -> int:
        """Tokens the KV cache holds: usable GPU memory after the weights, over bytes per token."""
        usable = self.gpu_memory_bytes * self.num_gpus * self.gpu_memory_utilization
        return max(0, int((usable - self.weights_bytes) // self.kv_bytes_per_token))

    @property
    def num_blocks(self) -> int:
        """KV-cache blocks of ``block_size`` tokens."""
        return self.kv_capacity_tokens // self.block_size

    @property
    def prefill_tokens_per_s(self) -> float:
        """Prompt tokens per second the whole replica prefills."""
        return self.prefill_tokens_per_s_per_gpu * self.num_gpus

    def _decode_step_budget_s(self) -> float:
        """Seconds of one calibration step left for reading weights and KV cache."""
        n = self.capacity_streams
        uncached = self.calibration_prompt_tokens - self.calibration_cached_tokens
        step_s = n / self.capacity_tokens_per_s
        prefill_per_step_s = n * uncached / (self.calibration_output_tokens * self.prefill_tokens_per_s)
        return step_s - prefill_per_step_s - self.step_overhead_s

    @property
    def decode_bandwidth_bytes_per_s(self) -> float:
        """Effective bytes per second a decode step reads, solved from the load-tested capacity.

        At the calibration point every running sequence holds on average its prompt plus half its
        output in the KV cache.
        """
        avg_context = self.calibration_prompt_tokens + self.calibration_output_tokens / 2
        step_bytes = self.weights_bytes + self.kv_bytes_per_token * self.capacity_streams * avg_context
        return step_bytes / self._decode_step_budget_s()

    def step_seconds(self, context_tokens: int, prefill_tokens: int, bandwidth: float | None = None) -> float:
        """Seconds of one engine step.

        ``context_tokens``: KV-cache tokens read by the step, summed over the batch.
        ``prefill_tokens``: prompt tokens computed in the step (not served by the prefix cache).
        ``bandwidth``: the calibrated bytes per second, passed in to avoid recomputing it.
        """
        bw = self.decode_bandwidth_bytes_per_s if bandwidth is None else bandwidth
        read_s = (self.weights_bytes + self.kv_bytes_per_token * context_tokens) / bw
        return self.step_overhead_s + read_s + prefill_tokens / self.prefill_tokens_per_s

    def with_overrides(self, overrides: Mapping[str, Any]) -> EngineParams:
        """A copy with the named fields replaced; unknown names raise ``ValueError``."""
        known = {f.name: f for f in dataclasses.fields(self)}
        unknown = sorted(set(overrides) - set(known))
        if unknown:
            raise ValueError(f"unknown engine parameter(s): {', '.join(unknown)}")
        clean: dict[str, Any] = {}
        for name, value in overrides.items():
            current = getattr(self, name)
            if isinstance(current, bool):
                if not isinstance(value, bool):
                    raise ValueError(f"{name} must be true or false, got {value!r}")
            elif isinstance(current, int) and (isinstance(value, bool) or not isinstance(value, int)):
                if not (isinstance(value, float) and value.is_integer()):
                    raise ValueError(f"{name} must be an integer, got {value!r}")
                value = int(value)
            elif isinstance(current, float) and (isinstance(value, bool) or not isinstance(value, int | float)):
                raise ValueError(f"{name} must be a number, got {value!r}")
            clean[name] = value
        return dataclasses.replace(self, **clean)

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON-ready dict (the inverse of ``with_overrides`` on any preset)."""
        return dataclasses.asdict(self)


CHAT_7B = EngineParams(
    weights_bytes=14 * GB,
    kv_bytes_per_token=131_072,  # 2 x 32 layers x 8 KV heads x 128 x 2 bytes
    capacity_tokens_per_s=2500.0,
    capacity_streams=83,
    gpu_memory_bytes=80 * GB,
    num_gpus=1,
    max_model_len=8192,
)
"""The seed's 7B chat model: FP16 on one 80 GB GPU, 2,500 output tokens/s at 83 streams."""

REASON_70B = EngineParams(
    weights_bytes=70 * GB,
    kv_bytes_per_token=327_680,  # 2 x 80 layers x 8 KV heads x 128 x 2 bytes
    capacity_tokens_per_s=400.0,
    capacity_streams=20,
    gpu_memory_bytes=80 * GB,
    num_gpus=2,
    max_model_len=16384,
)
"""The seed's 70B reasoning model: INT8 on two 80 GB GPUs, 400 output tokens/s at 20 streams."""

PRESETS: dict[str, EngineParams] = {"chat-7b": CHAT_7B, "reason-70b": REASON_70B}


def preset(name: str) -> EngineParams:
    """The preset called ``name`` (``chat-7b`` or ``reason-70b``); unknown names raise ``ValueError``."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r} (known: {', '.join(sorted(PRESETS))})") from None


def params_from_json(text: str, base: EngineParams = CHAT_7B) -> EngineParams:
    """Engine parameters from a JSON object of field overrides on ``base`` (default: chat-7b)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"engine params are not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError("engine params must be a JSON object")
    return base.with_overrides(data)

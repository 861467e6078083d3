"""The inference engine's command line for one model version (pure functions).

Precision -> engine flags. The weights of a version are a checkpoint already in that precision
(quantization is decided, evaluated and stored with the version, never applied on the fly):

| precision | checkpoint | vLLM | SGLang |
|---|---|---|---|
| ``fp16`` | FP16 safetensors | ``--dtype float16``, no ``--quantization`` | same |
| ``int8`` | W8A8-INT8 (weights and activations INT8, made with llm-compressor, saved in the ``compressed-tensors`` format) | ``--quantization compressed-tensors`` | same |
| ``4bit`` | AWQ INT4 (W4A16) | ``--quantization awq_marlin`` | same |

Why W8A8-INT8 for ``int8``: the fleet's a100-80gb has INT8 tensor cores but no FP8 (FP8 W8A8
needs Ada or Hopper), and vLLM runs INT8 W8A8 on compute capability 7.5 and up. ``awq_marlin``
is the fast Marlin kernel for AWQ on Ampere and later (plain ``awq`` is several times slower).
Every precision keeps ``--dtype float16``: activations and the KV cache stay FP16 (quantized
weights do not shrink the KV cache; ``modelfleet.config.hardware`` sizes it that way). Naming
the quantization explicitly makes the engine refuse a checkpoint of another format at start,
instead of serving it under the wrong version.
"""

from __future__ import annotations

from modelfleet.config.schema import Version

HTTP_PORT = 8000
"""The engine's OpenAI API, ``/health`` and ``/metrics`` port (TCP)."""
WEIGHTS_MOUNT = "/weights"
"""Where the node's NVMe weights cache is mounted in replica pods."""
MIDDLEWARE = "replica_middleware.middleware.ModelfleetMiddleware"
"""The ASGI middleware ``vllm serve --middleware`` loads: tokens in flight, heartbeats, usage."""

QUANTIZATION: dict[str, str | None] = {"fp16": None, "int8": "compressed-tensors", "4bit": "awq_marlin"}
"""The ``--quantization`` of each precision (None: not quantized)."""


def weights_path(version: Version) -> str:
    """Where the version's weights sit inside the pod, e.g. ``/weights/chat-7b/v13``."""
    return f"{WEIGHTS_MOUNT}/{version.model}/{version.version}"


def precision_args(version: Version) -> list[str]:
    """``--dtype`` and ``--quantization`` for the version's precision (same flags in both engines)."""
    quant = QUANTIZATION[version.precision]
    return ["--dtype", "float16", *(["--quantization", quant] if quant else [])]


def vllm_command(version: Version, shutdown_args: list[str]) -> tuple[list[str], list[str]]:
    """``(command, args)`` of ``vllm serve`` for ``version``; ``shutdown_args`` from
    ``autoscale.drain`` (``--shutdown-timeout``, seconds)."""
    ec = version.engine_config
    args = [
        weights_path(version),
        "--served-model-name", version.model, version.key,
        "--host", "0.0.0.0", "--port", str(HTTP_PORT),
        "--tensor-parallel-size", str(version.gpus_per_replica),
        "--max-model-len", str(ec.max_model_len),
        "--gpu-memory-utilization", str(ec.gpu_memory_utilization),
        "--max-num-seqs", str(ec.max_num_seqs),
        "--enable-prefix-caching" if ec.enable_prefix_caching else "--no-enable-prefix-caching",
        *precision_args(version),
        "--middleware", MIDDLEWARE,
        "--enable-prompt-tokens-details",  # usage.prompt_tokens_details.cached_tokens: the final event's
        *shutdown_args,
        *ec.extra_args,
    ]
    return ["vllm", "serve"], args


def sglang_command(version: Version) -> tuple[list[str], list[str]]:
    """``(command, args)`` of ``python3 -m sglang.launch_server`` for ``version``.

    SGLang takes one served name (the model name; Envoy has already chosen the version) and
    keeps its radix prefix cache on unless disabled. It has no ``--middleware``: see
    docs/deploy.md for what the SGLang variant lacks.
    """
    ec = version.engine_config
    args = [
        "--model-path", weights_path(version),
        "--served-model-name", version.model,
        "--host", "0.0.0.0", "--port", str(HTTP_PORT),
        "--tp-size", str(version.gpus_per_replica),
        "--context-length", str(ec.max_model_len),
        "--mem-fraction-static", str(ec.gpu_memory_utilization),
        "--max-running-requests", str(ec.max_num_seqs),
        *([] if ec.enable_prefix_caching else ["--disable-radix-cache"]),
        *precision_args(version),
        "--enable-metrics",
        *ec.extra_args,
    ]
    return ["python3", "-m", "sglang.launch_server"], args

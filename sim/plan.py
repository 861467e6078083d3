"""The capacity planner: the seed's arithmetic as one pure function (``modelfleet plan``).

Every input has the seed's value as its default, so ``plan(PlanInputs())`` reproduces the seed's
figures: 12 chat and 3 reasoning replicas per region, 36 GPUs, 64,800 USD per month, 0.28 / 0.56
USD per million tokens, 120,000 -> 56,000 prompt tokens/s, 131,072 KV bytes per token, 38
replicas at 800 tokens/s, load growth 1.34 over a 6-minute cold start.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from modelfleet.config.hardware import GB, kv_bytes_per_token

HOURS_PER_MONTH = 720
"""The seed's month: 30 days x 24 hours."""


@dataclass(frozen=True)
class ModelLoad:
    """One model's peak and one replica's assumed capacity."""

    name: str
    peak_streams: int
    """Answers streaming at once at peak."""
    stream_tokens_per_s: float
    """Output tokens per second each stream must keep."""
    replica_tokens_per_s: float
    """Output tokens per second one replica delivers (load-tested or assumed)."""
    gpus_per_replica: int


@dataclass(frozen=True)
class PlanInputs:
    """The planner's inputs; units in the field names (tokens, seconds, bytes, USD)."""

    chat: ModelLoad = ModelLoad("chat-7b", 1000, 30.0, 2500.0, 1)
    reasoning: ModelLoad = ModelLoad("reason-70b", 60, 20.0, 400.0, 2)
    tokens_per_answer: int = 300
    answer_overhead_s: float = 0.5
    """Time before the first token of an answer, seconds."""
    user_think_s: float = 40.0
    """Seconds between one user's messages (for the 'concurrent' caveat)."""
    prompt_tokens: int = 1200
    cached_prefix_tokens: int = 800
    prefix_hit_rate: float = 0.8
    prefill_tokens_per_s_per_gpu: float = 10_000.0
    regions: int = 2
    gpu_usd_per_hour: float = 2.50
    layers: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    kv_bytes_per_value: int = 2
    stream_context_tokens: int = 1500
    """Tokens one stream holds in the KV cache (prompt plus answer)."""
    weights_gb: float = 14.0
    node_start_s: float = 240.0
    weights_pull_gb_per_s: float = 0.5
    weights_load_gb_per_s: float = 1.0
    warmup_s: float = 30.0
    load_growth_per_min: float = 0.05
    scale_at_utilisation: float = 0.70
    alt_replica_tokens_per_s: tuple[float, ...] = (800.0,)
    """Other per-replica capacities to size the chat pool for (the one-GPU batching figure)."""


@dataclass(frozen=True)
class PlanReport:
    """What the planner prints; units in the field names."""

    answer_s: float
    streaming_share_of_users: float
    output_tokens_per_s: float
    requests_per_s: float
    chat_replicas_per_region: int
    reasoning_replicas_per_region: int
    gpus_per_region: int
    gpus_total: int
    usd_per_month: float
    tokens_per_replica_hour: float
    usd_per_million_tokens_full: float
    usd_per_million_tokens_half: float
    prefill_tokens_per_s_no_cache: float
    prefill_tokens_per_s_with_cache: float
    prefill_gpus_no_cache: float
    prefill_gpus_with_cache: float
    kv_bytes_per_token: int
    kv_bytes_per_stream: int
    kv_gb_per_replica_at_capacity: float
    cold_start_s: float
    cold_start_plan_min: int
    warm_start_s: float
    load_growth_during_cold_start: float
    utilisation_when_capacity_arrives: float
    chat_replicas_at: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """Plain data for ``--json``."""
        return asdict(self)


def replicas_for(load: ModelLoad, replica_tokens_per_s: float | None = None) -> int:
    """Replicas one region needs to carry ``load``'s whole peak alone."""
    per_replica = replica_tokens_per_s or load.replica_tokens_per_s
    return math.ceil(load.peak_streams * load.stream_tokens_per_s / per_replica - 1e-9)


def plan(p: PlanInputs) -> PlanReport:
    """The seed's capacity arithmetic for inputs ``p``."""
    answer_s = p.answer_overhead_s + p.tokens_per_answer / p.chat.stream_tokens_per_s
    out_tps = p.chat.peak_streams * p.chat.stream_tokens_per_s
    rps = out_tps / p.tokens_per_answer
    chat_n = replicas_for(p.chat)
    reason_n = replicas_for(p.reasoning)
    per_region = chat_n * p.chat.gpus_per_replica + reason_n * p.reasoning.gpus_per_replica
    gpus = per_region * p.regions
    tokens_hour = p.chat.replica_tokens_per_s * 3600
    usd_full = p.gpu_usd_per_hour * p.chat.gpus_per_replica / (tokens_hour / 1e6)
    prefill_full = rps * p.prompt_tokens
    prefill_hit = rps * (p.prompt_tokens - p.prefix_hit_rate * p.cached_prefix_tokens)
    kv_tok = kv_bytes_per_token(p.layers, p.kv_heads, p.head_dim, p.kv_bytes_per_value)
    streams_per_replica = p.chat.replica_tokens_per_s / p.chat.stream_tokens_per_s
    warm_s = p.weights_gb / p.weights_load_gb_per_s + p.warmup_s
    cold_s = p.node_start_s + p.weights_gb / p.weights_pull_gb_per_s + warm_s
    plan_min = math.ceil(cold_s / 60)
    growth = (1 + p.load_growth_per_min) ** plan_min
    return PlanReport(
        answer_s=answer_s,
        streaming_share_of_users=answer_s / p.user_think_s,
        output_tokens_per_s=out_tps,
        requests_per_s=rps,
        chat_replicas_per_region=chat_n,
        reasoning_replicas_per_region=reason_n,
        gpus_per_region=per_region,
        gpus_total=gpus,
        usd_per_month=gpus * p.gpu_usd_per_hour * HOURS_PER_MONTH,
        tokens_per_replica_hour=tokens_hour,
        usd_per_million_tokens_full=usd_full,
        usd_per_million_tokens_half=2 * usd_full,
        prefill_tokens_per_s_no_cache=prefill_full,
        prefill_tokens_per_s_with_cache=prefill_hit,
        prefill_gpus_no_cache=prefill_full / p.prefill_tokens_per_s_per_gpu,
        prefill_gpus_with_cache=prefill_hit / p.prefill_tokens_per_s_per_gpu,
        kv_bytes_per_token=kv_tok,
        kv_bytes_per_stream=kv_tok * p.stream_context_tokens,
        kv_gb_per_replica_at_capacity=kv_tok * p.stream_context_tokens * math.floor(streams_per_replica) / GB,
        cold_start_s=cold_s,
        cold_start_plan_min=plan_min,
        warm_start_s=warm_s,
        load_growth_during_cold_start=growth,
        utilisation_when_capacity_arrives=p.scale_at_utilisation * growth,
        chat_replicas_at={f"{t:g}": replicas_for(p.chat, t) for t in p.alt_replica_tokens_per_s},
    )


def render(r: PlanReport, p: PlanInputs) -> str:
    """The planner's table, in the seed's words."""
    rows = [
        ("answer length", f"{r.answer_s:.1f} s ({r.streaming_share_of_users:.0%} of users streaming at once)"),
        ("output tokens/s at peak", f"{r.output_tokens_per_s:,.0f} ({r.requests_per_s:,.0f} requests/s)"),
        (f"{p.chat.name} replicas per region", f"{r.chat_replicas_per_region} at {p.chat.replica_tokens_per_s:,.0f} tokens/s each"),
        *[(f"{p.chat.name} replicas per region", f"{n} at {t} tokens/s each") for t, n in r.chat_replicas_at.items()],
        (f"{p.reasoning.name} replicas per region", f"{r.reasoning_replicas_per_region} x {p.reasoning.gpus_per_replica} GPUs"),
        ("GPUs", f"{r.gpus_per_region} per region, {r.gpus_total} in {p.regions} regions"),
        ("cost", f"{r.usd_per_month:,.0f} USD per month at {p.gpu_usd_per_hour:.2f} USD per GPU-hour"),
        ("USD per million tokens", f"{r.usd_per_million_tokens_full:.2f} full, {r.usd_per_million_tokens_half:.2f} half busy"),
        ("prompt tokens/s (prefill)", f"{r.prefill_tokens_per_s_no_cache:,.0f} -> {r.prefill_tokens_per_s_with_cache:,.0f} with prefix hits"),
        ("prefill GPUs", f"{r.prefill_gpus_no_cache:.1f} -> {r.prefill_gpus_with_cache:.1f}"),
        ("KV cache", f"{r.kv_bytes_per_token:,} bytes per token, {r.kv_bytes_per_stream / 1e6:,.0f} MB per stream, "
                     f"{r.kv_gb_per_replica_at_capacity:.0f} GB per full replica"),
        ("cold start", f"{r.cold_start_s:.0f} s, plan {r.cold_start_plan_min} min (warm node: {r.warm_start_s:.0f} s)"),
        ("load growth during it", f"{r.load_growth_during_cold_start:.2f}x: {r.utilisation_when_capacity_arrives:.2f} of capacity in use when it arrives"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)

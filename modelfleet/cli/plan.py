"""``modelfleet plan``: the capacity planner (pure arithmetic over the seed's inputs)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

from sim.plan import ModelLoad, PlanInputs, plan, render

_D = PlanInputs()

# flag -> (PlanInputs field, type, help); defaults are the seed's
FLAGS: dict[str, tuple[str, type, str]] = {
    "--tokens-per-answer": ("tokens_per_answer", int, "output tokens per answer"),
    "--answer-overhead-s": ("answer_overhead_s", float, "seconds before an answer's first token"),
    "--user-think-s": ("user_think_s", float, "seconds between one user's messages"),
    "--prompt-tokens": ("prompt_tokens", int, "prompt tokens per request"),
    "--cached-prefix": ("cached_prefix_tokens", int, "prompt tokens that are a cacheable prefix"),
    "--hit-rate": ("prefix_hit_rate", float, "share of requests that find their prefix cached (0..1)"),
    "--prefill-per-gpu": ("prefill_tokens_per_s_per_gpu", float, "prompt tokens/s one GPU prefills"),
    "--regions": ("regions", int, "regions, each sized for the whole peak"),
    "--gpu-price": ("gpu_usd_per_hour", float, "USD per GPU-hour"),
    "--layers": ("layers", int, "chat model layers"),
    "--kv-heads": ("kv_heads", int, "chat model KV heads"),
    "--head-dim": ("head_dim", int, "chat model head dimension"),
    "--kv-bytes": ("kv_bytes_per_value", int, "bytes per KV value"),
    "--stream-context": ("stream_context_tokens", int, "tokens one stream holds in the KV cache"),
    "--weights-gb": ("weights_gb", float, "chat weights, GB"),
    "--node-start-s": ("node_start_s", float, "seconds to start a GPU node"),
    "--growth-per-min": ("load_growth_per_min", float, "load growth per minute (0.05 = 5%)"),
    "--scale-at": ("scale_at_utilisation", float, "utilisation at which the autoscaler adds (0..1)"),
}


def register(sub: Any) -> None:
    """Add the ``plan`` sub-command to ``sub``."""
    p: argparse.ArgumentParser = sub.add_parser(
        "plan",
        help="capacity plan: replicas, GPUs, cost, prefill, KV cache, cold start (seed defaults)",
        description="Pure arithmetic over the inputs; every default is the seed's assumption.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--peak-streams", type=int, default=_D.chat.peak_streams, help="chat streams at peak")
    p.add_argument("--stream-rate", type=float, default=_D.chat.stream_tokens_per_s, help="tokens/s per chat stream")
    p.add_argument("--replica-tokens-per-s", type=float, default=_D.chat.replica_tokens_per_s,
                   help="output tokens/s one chat replica delivers")
    p.add_argument("--gpus-per-replica", type=int, default=_D.chat.gpus_per_replica, help="GPUs per chat replica")
    p.add_argument("--reasoning-streams", type=int, default=_D.reasoning.peak_streams, help="70B streams at peak")
    p.add_argument("--reasoning-rate", type=float, default=_D.reasoning.stream_tokens_per_s, help="tokens/s per 70B stream")
    p.add_argument("--reasoning-replica-tokens-per-s", type=float, default=_D.reasoning.replica_tokens_per_s,
                   help="output tokens/s one 70B replica delivers")
    p.add_argument("--reasoning-gpus-per-replica", type=int, default=_D.reasoning.gpus_per_replica,
                   help="GPUs per 70B replica")
    for flag, (name, kind, text) in FLAGS.items():
        p.add_argument(flag, dest=name, type=kind, default=getattr(_D, name), help=text)
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.set_defaults(run=run)


def inputs_from(args: argparse.Namespace) -> PlanInputs:
    """The planner inputs named by the parsed flags."""
    return dataclasses.replace(
        _D,
        chat=ModelLoad(_D.chat.name, args.peak_streams, args.stream_rate, args.replica_tokens_per_s,
                       args.gpus_per_replica),
        reasoning=ModelLoad(_D.reasoning.name, args.reasoning_streams, args.reasoning_rate,
                            args.reasoning_replica_tokens_per_s, args.reasoning_gpus_per_replica),
        **{name: getattr(args, name) for name, _, _ in FLAGS.values()},
    )


def run(args: argparse.Namespace) -> int:
    """Print the plan."""
    inputs = inputs_from(args)
    report = plan(inputs)
    print(json.dumps(report.as_dict(), indent=2) if args.json else render(report, inputs))
    return 0

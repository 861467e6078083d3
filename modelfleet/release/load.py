"""The capacity half of the gate: raise the load step by step and keep the highest output
tokens/s at which p95 TTFT stays under 1 s and streams keep 30 tokens/s, with the tokens in
flight at that point (the figures the autoscaler's thresholds derive from).

:func:`find_capacity` is pure over an injected ``run(streams) -> LoadResult``;
:func:`engine_runner` is the closed loop of the replica engine (``replica.workload``) with the
version's engine parameters, in model time: what ``modelfleet up``'s simulated replica of that
version delivers. Against real vLLM the same search runs with a runner that replays prompts
through the platform (not built yet).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from modelfleet.config import Version
from replica.params import CHAT_7B
from replica.version_params import engine_params
from replica.workload import LoadResult, closed_loop


@dataclass(frozen=True)
class LoadStep:
    """One load level: concurrent streams and what the replica did (tokens/s, seconds,
    tokens)."""

    streams: int
    output_tokens_per_s: float
    ttft_p95_s: float
    stream_tokens_per_s: float
    """Median per-stream rate: 1 / median inter-token latency."""
    tokens_in_flight: int
    """Prompt plus remaining output held: streams x (prompt + half an answer), tokens."""
    passed: bool


@dataclass(frozen=True)
class CapacityFound:
    """Every step run and the best passing one (None if none passed)."""

    steps: tuple[LoadStep, ...]
    capacity: LoadStep | None

    def as_dict(self) -> dict[str, Any]:
        """Plain data (saved with the version)."""
        return asdict(self)


def find_capacity(run: Callable[[int], LoadResult], *, start: int = 8, factor: float = 1.25,
                  max_streams: int = 1024, refine: int = 4, ttft_target_s: float = 1.0,
                  stream_target_tokens_per_s: float = 30.0, prompt_tokens: int = 1200,
                  output_tokens: int = 300) -> CapacityFound:
    """Run ``start``, ``start x factor``, ... streams until two levels in a row fail, then
    bisect ``refine`` times between the best pass and the next failure."""
    steps: dict[int, LoadStep] = {}

    def measure(n: int) -> LoadStep:
        r = run(n)
        rate = 1.0 / r.itl_p50_s if r.itl_p50_s > 0 else math.inf
        held = n * (prompt_tokens + output_tokens // 2)
        ok = r.ttft_p95_s <= ttft_target_s and rate >= stream_target_tokens_per_s
        steps[n] = LoadStep(n, r.output_tokens_per_s, r.ttft_p95_s, rate, held, ok)
        return steps[n]

    n, failures = start, 0
    while n <= max_streams and failures < 2:
        failures = 0 if measure(n).passed else failures + 1
        n = max(n + 1, math.ceil(n * factor))
    for _ in range(refine):
        passed = [k for k, s in steps.items() if s.passed]
        above = [k for k, s in steps.items() if not s.passed and passed and k > max(passed)]
        if not passed or not above or min(above) - max(passed) <= 1:
            break
        measure((max(passed) + min(above)) // 2)
    ordered = tuple(steps[k] for k in sorted(steps))
    best = max((s for s in ordered if s.passed), key=lambda s: s.output_tokens_per_s, default=None)
    return CapacityFound(ordered, best)


def engine_runner(version: Version, duration_s: float = 60.0,
                  warmup_s: float = 20.0) -> Callable[[int], LoadResult]:
    """``run(streams)``: the simulated engine of ``version`` under ``streams`` closed-loop
    streams of the seed's request shape, measured ``duration_s`` model seconds."""
    params = CHAT_7B.with_overrides(engine_params(version))

    def run(streams: int) -> LoadResult:
        return closed_loop(params, streams, duration_s=duration_s, warmup_s=warmup_s)

    return run

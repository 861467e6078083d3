"""The load test at a fixed arrival rate, raised step by step (pure): the schedule, the figures
of one step from what its streams and the pool reported, and the capacity.

Times here are in the replicas' model seconds: a local stack running ``time_scale`` times
faster than real time is measured in wall seconds and converted by the caller's ``time_scale``
(model seconds per wall second). A step passes when p95 TTFT is under ``ttft_p95_s`` (1 s),
at most ``max_slow_share`` of the streams (5%) stream slower than ``stream_tokens_per_s``
(30 tokens/s), and at most ``max_error_share`` of the requests failed (0). The search stops at
the first step that fails; the capacity is the passing step with the highest output tokens/s,
per replica, with the tokens in flight per replica the pool reported during it (prompt plus
remaining output, the autoscaler's unit).
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class StreamSample:
    """One streamed request as the client saw it, wall seconds (monotonic clock)."""

    sent_s: float
    token_times_s: tuple[float, ...] = ()
    """When each streamed chunk with text arrived (vLLM streams one token per chunk)."""
    error: str | None = None


@dataclass(frozen=True)
class PoolSample:
    """The pool of the tested version at one moment (control plane's pool state): tokens in
    flight (prompt + remaining output), streams running, routable replicas."""

    at_s: float
    tokens_in_flight: int
    running: int
    replicas: int


@dataclass(frozen=True)
class Targets:
    """What a step must meet (model seconds, tokens per second, shares 0..1)."""

    ttft_p95_s: float = 1.0
    stream_tokens_per_s: float = 30.0
    max_slow_share: float = 0.05
    max_error_share: float = 0.0


def latency_failures(ttft_p95_s: float, slow_share: float, targets: Targets) -> list[str]:
    """Why a step fails the capacity gate's latency targets (empty: it passes): p95 TTFT
    (seconds) not under ``targets.ttft_p95_s``, or more than ``targets.max_slow_share`` of the
    streams under ``targets.stream_tokens_per_s``. The platform's load test and the simulator's
    capacity drill both judge with it."""
    why = []
    if ttft_p95_s >= targets.ttft_p95_s:
        why.append(f"p95 TTFT {ttft_p95_s:.2f} s >= {targets.ttft_p95_s:g} s")
    if slow_share > targets.max_slow_share:
        why.append(f"{slow_share:.0%} of streams under {targets.stream_tokens_per_s:g} tokens/s")
    return why


@dataclass(frozen=True)
class RateStep:
    """One arrival rate and what the platform did at it, per replica, model time."""

    rate_per_s: float
    """Requests sent per model second (all replicas)."""
    requests: int
    errors: int
    ttft_p95_s: float
    stream_tokens_per_s_p50: float
    slow_share: float
    """Share of the rated streams slower than the target (0..1)."""
    output_tokens_per_s: float
    """Output tokens per model second per replica, inside the measured window."""
    tokens_in_flight: int
    """Mean per replica over the window (tokens), as the replicas reported it."""
    streams: int
    """Mean streams running per replica over the window (at least 1)."""
    passed: bool
    why: tuple[str, ...] = field(default=())


@dataclass(frozen=True)
class RateSearch:
    """Every step run, in order, and the capacity (None when no step passed)."""

    steps: tuple[RateStep, ...]
    capacity: RateStep | None

    def as_dict(self) -> dict[str, Any]:
        """Plain data (the report)."""
        return asdict(self)


def schedule(start_per_s: float, factor: float, steps: int) -> list[float]:
    """Arrival rates per model second: ``start``, ``start x factor``, ... (``steps`` of them,
    3 significant digits)."""
    if start_per_s <= 0 or factor <= 1 or steps < 1:
        raise ValueError("need start > 0, factor > 1 and at least one step")
    return [float(f"{start_per_s * factor ** k:.3g}") for k in range(steps)]


def arrivals(rate_per_s: float, duration_s: float, *, poisson: bool, seed: int) -> list[float]:
    """Send times (seconds from the step's start) of an open loop at ``rate_per_s`` for
    ``duration_s``: exponential gaps from ``random.Random(seed)``, or a fixed interval."""
    if not poisson:
        return [k / rate_per_s for k in range(math.ceil(duration_s * rate_per_s - 1e-9))]
    rng, t, out = random.Random(seed), 0.0, []
    while (t := t + rng.expovariate(rate_per_s)) < duration_s:
        out.append(t)
    return out


def p95(values: Sequence[float]) -> float:
    """Nearest-rank 95th percentile (inf for no values)."""
    if not values:
        return math.inf
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def summarise(rate_per_s: float, streams: Sequence[StreamSample], pool: Sequence[PoolSample],
              window_s: tuple[float, float], time_scale: float, targets: Targets) -> RateStep:
    """One step's figures: TTFT over every request, stream rates over streams of 2+ tokens,
    output tokens/s and pool load over ``window_s`` (wall seconds), per replica, in model time."""
    start, end = window_s
    ok = [s for s in streams if s.error is None and s.token_times_s]
    errors = len(streams) - len(ok)
    ttft = [(s.token_times_s[0] - s.sent_s) * time_scale for s in ok]
    rates = [(len(s.token_times_s) - 1) / ((s.token_times_s[-1] - s.token_times_s[0]) * time_scale)
             for s in ok if len(s.token_times_s) > 1 and s.token_times_s[-1] > s.token_times_s[0]]
    seen = [p for p in pool if start <= p.at_s <= end] or list(pool)
    replicas = max((p.replicas for p in seen), default=0) or 1
    tokens = sum(start <= t <= end for s in ok for t in s.token_times_s)
    out_rate = tokens / ((end - start) * time_scale) / replicas if end > start else 0.0
    held = sum(p.tokens_in_flight for p in seen) / len(seen) / replicas if seen else 0.0
    running = sum(p.running for p in seen) / len(seen) / replicas if seen else 0.0
    slow = sum(r < targets.stream_tokens_per_s for r in rates) / len(rates) if rates else 0.0
    ttft_p95 = p95(ttft)
    why = latency_failures(ttft_p95, slow, targets)
    if streams and errors / len(streams) > targets.max_error_share:
        kinds = Counter(s.error or "no token" for s in streams if s.error or not s.token_times_s)
        why.append(f"{errors} of {len(streams)} requests failed ("
                   + ", ".join(f"{n} {k}" for k, n in kinds.most_common(3)) + ")"
                   + (": the key's limits or the pool's admission bound, not the replica"
                      if "HTTP 429" in kinds or "HTTP 503" in kinds else ""))
    if not streams:
        why.append("no request sent")
    median = sorted(rates)[len(rates) // 2] if rates else 0.0
    return RateStep(rate_per_s, len(streams), errors, ttft_p95, median, slow, out_rate,
                    round(held), max(1, round(running)), not why, tuple(why))


def search(run_step: Callable[[float], RateStep], rates: Sequence[float]) -> RateSearch:
    """Run ``run_step`` at each rate in order until one fails; the capacity is the passing
    step with the highest output tokens/s."""
    steps: list[RateStep] = []
    for rate in rates:
        steps.append(run_step(rate))
        if not steps[-1].passed:
            break
    return RateSearch(tuple(steps), capacity_of(steps))


def capacity_of(steps: Sequence[RateStep]) -> RateStep | None:
    """The passing step with the highest output tokens/s per replica, or None."""
    return max((s for s in steps if s.passed), key=lambda s: s.output_tokens_per_s, default=None)

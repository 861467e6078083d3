"""What a simulation measured: one row per request that arrived in the measured window, one
sample per heartbeat, and the seed's measures computed from them (pure functions).

Units: seconds, tokens, tokens per second. TTFT runs from the request's arrival at the gateway
(queueing in admission included) to its first token; a request that never got one by the end
of the run counts as ``inf``. A stream's rate is its output tokens after the first, over the
seconds from its first to its last token.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum


class Result(StrEnum):
    """How a request ended."""

    OK = "ok"
    REJECTED_429 = "429"
    SHED_503 = "503"
    INVALID_400 = "400"
    ERROR = "error"  # a 5xx from the version, a connection error, or a stream broken midway
    UNFINISHED = "unfinished"  # still running or queued when the run ended


@dataclass(slots=True)
class RequestRow:
    """One measured request."""

    arrival_s: float
    team: str
    tier: str
    prompt_tokens: int
    output_tokens: int
    history_tokens: int
    result: Result = Result.UNFINISHED
    ttft_s: float = math.inf
    stream_tokens_per_s: float = math.inf
    cached_tokens: int = 0
    queued_s: float = 0.0
    """Seconds from the first attempt's arrival to the dispatch of the one that ran."""
    retries: int = 0
    version: str = ""
    """The version that served the last attempt (``model@version``), if one did."""
    region: str = ""
    """The region the last attempt went to."""


@dataclass(slots=True)
class Sample:
    """The pool at one heartbeat (seconds, tokens, requests)."""

    t_s: float
    serving: int
    starting: int
    tokens_in_flight: list[int]
    """Per serving replica, from its own count."""
    view_tokens_in_flight: list[int]
    """Per serving replica, as the picker saw it just before this heartbeat (the last report
    plus what the gateway sent since)."""
    gateway_queue: int
    engine_waiting: int
    engine_running: int


@dataclass
class Measured:
    """Everything recorded over the measured window ``[start_s, end_s)``."""

    start_s: float
    end_s: float
    rows: list[RequestRow] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    output_tokens: int = 0
    """Tokens produced by steps ending in the window."""
    prefill_tokens: int = 0
    """Prompt tokens computed (not served by the prefix cache) by steps ending in the window."""
    scale_events: list[tuple[float, str, str]] = field(default_factory=list)
    """``(time, replica id, event)`` events: requested, serving, draining, gone."""
    completions: list[tuple[float, str, float, int, bool]] = field(default_factory=list)
    """Every attempt a version answered, over the whole run: ``(time, pool key, seconds from
    the attempt's arrival to its first token (NaN on error), output tokens, ok)``."""

    @property
    def duration_s(self) -> float:
        """Length of the window, seconds."""
        return self.end_s - self.start_s


def quantile(xs: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``xs`` by the nearest-rank rule; NaN when empty."""
    if not xs:
        return math.nan
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def served(rows: Sequence[RequestRow], keep: Callable[[RequestRow], bool] = lambda r: True
           ) -> list[RequestRow]:
    """Rows that ran (finished, or still running without a first token: their TTFT is inf)."""
    return [r for r in rows if keep(r) and r.result in (Result.OK, Result.UNFINISHED)]


def ttft_p95_s(rows: Sequence[RequestRow]) -> float:
    """p95 TTFT of the rows that ran, seconds."""
    return quantile([r.ttft_s for r in served(rows)], 0.95)


def slow_stream_share(rows: Sequence[RequestRow], rate: float) -> float:
    """Share (0..1) of finished streams of two or more tokens that averaged under ``rate``
    tokens per second."""
    streams = [r for r in rows if r.result is Result.OK and r.output_tokens > 1]
    if not streams:
        return 0.0
    return sum(1 for r in streams if r.stream_tokens_per_s < rate) / len(streams)


def hit_rates(rows: Sequence[RequestRow], block_size: int) -> tuple[float, float]:
    """``(token hit rate, history hit rate)``: cached over prompt tokens of finished requests,
    and the share of finished requests with a history of at least one block whose cached
    tokens covered all of its full blocks."""
    done = [r for r in rows if r.result is Result.OK]
    prompt = sum(r.prompt_tokens for r in done)
    with_history = [r for r in done if r.history_tokens >= block_size]
    found = sum(1 for r in with_history
                if r.cached_tokens >= r.history_tokens // block_size * block_size)
    return (sum(r.cached_tokens for r in done) / prompt if prompt else 0.0,
            found / len(with_history) if with_history else 0.0)


def imbalance(samples: Sequence[Sample], view: bool = False) -> tuple[float, float]:
    """``(mean, p95)`` over heartbeats of the highest replica's tokens in flight divided by the
    pool average (1.0 is perfect balance), from the replicas' own counts or (``view``) from the
    picker's view; heartbeats with an idle pool are skipped."""
    ratios = []
    for s in samples:
        loads = s.view_tokens_in_flight if view else s.tokens_in_flight
        total = sum(loads)
        if total > 0 and loads:
            ratios.append(max(loads) * len(loads) / total)
    if not ratios:
        return (1.0, 1.0)
    return (sum(ratios) / len(ratios), quantile(ratios, 0.95))


def by_minute(rows: Sequence[RequestRow], start_s: float) -> dict[int, list[RequestRow]]:
    """Rows grouped by the minute of their arrival since ``start_s`` (0, 1, ...)."""
    out: dict[int, list[RequestRow]] = {}
    for r in rows:
        out.setdefault(int((r.arrival_s - start_s) // 60), []).append(r)
    return out


def counts(rows: Sequence[RequestRow], key: Callable[[RequestRow], str]) -> dict[str, dict[str, int]]:
    """Requests per ``key`` (team or tier) and result."""
    out: dict[str, dict[str, int]] = {}
    for r in rows:
        group = out.setdefault(key(r), {})
        group[r.result.value] = group.get(r.result.value, 0) + 1
    return out

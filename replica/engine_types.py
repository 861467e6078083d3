"""The engine's plain records: what a request brings, and what one step reports (model seconds).

``replica.engine`` re-exports every name here; import them from there.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineRequest:
    """What the engine needs to know about a request: sizes and the prefix-cache keys."""

    request_id: str
    prompt_tokens: int
    output_tokens: int
    """Tokens this request will generate (the answer was planned on arrival)."""
    block_hashes: tuple[int, ...] = ()
    """Chained hashes of the full blocks of prompt plus output tokens, in order."""


@dataclass(frozen=True)
class Admission:
    """A request entering the batch in a step."""

    request_id: str
    cached_tokens: int
    """Tokens of its context the prefix cache held."""
    prefill_tokens: int
    """Tokens computed in the step (context minus cached)."""
    queued_s: float
    """Seconds from arrival (or preemption) to admission."""
    first: bool
    """False when a preempted request comes back."""


@dataclass(frozen=True)
class TokenOutput:
    """One output token of one request, produced at the end of a step."""

    request_id: str
    index: int
    """0 for the first token."""
    finished: bool
    interval_s: float
    """Seconds since arrival for the first token (TTFT), since the previous token otherwise."""
    e2e_s: float | None = None
    """Seconds from arrival to this last token, set only when ``finished``."""


@dataclass(frozen=True)
class FirstToken:
    """A request's first output token, produced at the end of the step that admitted it."""

    request_id: str
    ttft_s: float
    """Seconds from arrival to the end of the step."""


@dataclass(frozen=True)
class Finish:
    """A request whose last output token the step produced."""

    request_id: str
    output_tokens: int
    """Tokens it generated in all."""
    e2e_s: float
    """Seconds from arrival to the end of the step."""


@dataclass(frozen=True)
class StepResult:
    """What one step did, in model seconds.

    ``outputs`` (one record per token) is filled only by ``Engine.step(detail=True)``, the
    default; ``tokens``, ``first_tokens`` and ``finished`` are filled in both modes.
    """

    start_s: float
    end_s: float
    context_tokens: int
    """KV-cache tokens the step read, summed over the batch."""
    prefill_tokens: int
    admitted: tuple[Admission, ...] = ()
    outputs: tuple[TokenOutput, ...] = ()
    preempted: tuple[str, ...] = ()
    tokens: int = 0
    """Output tokens produced at the step's end: one per sequence in the batch."""
    first_tokens: tuple[FirstToken, ...] = ()
    """Requests whose first token the step produced, in batch order."""
    finished: tuple[Finish, ...] = ()
    """Requests the step finished, in batch order."""

    @property
    def duration_s(self) -> float:
        """Length of the step in seconds."""
        return self.end_s - self.start_s


@dataclass(frozen=True)
class EngineStats:
    """The engine's gauges and cumulative counters at one moment."""

    running: int
    waiting: int
    kv_usage: float
    """Share (0..1) of KV blocks in use."""
    tokens_in_flight: int
    """Prompt plus remaining output tokens of every request held, running or waiting."""
    prefix_cache_queries: int
    """Context tokens looked up in the prefix cache, summed over admissions."""
    prefix_cache_hits: int
    """Of those, tokens found."""
    prompt_tokens: int
    generation_tokens: int
    preemptions: int
    finished: int

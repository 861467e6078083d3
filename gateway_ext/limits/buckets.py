"""Token-bucket maths for one team x model (pure, integer, clock passed in).

* Capacity = ``tokens_per_minute`` tokens; refill is continuous at ``tokens_per_minute / 60``
  tokens per second; a bucket never seen before is full.
* **Reserve** ``cost`` tokens (prompt estimate + max_tokens) at admission: admitted only if the
  bucket holds at least ``cost``; otherwise denied with ``retry_after_ms``, the exact wait until it
  will (no state change). A ``cost`` above capacity can never pass: :attr:`Verdict.TOO_LARGE`, which
  the gateway answers with a 400 (a 429 would make clients retry what can never succeed).
* **Settle** with the real usage: ``reserved - used`` goes back (a refund, capped at capacity) or,
  when ``used > reserved``, the difference is taken and the bucket may go negative; the debt is
  repaid by refill before anything else is admitted.
* An **expired** reservation (never settled) is treated as fully used: nothing is refunded.

Integers only, so that the Redis Lua script (:mod:`gateway_ext.limits.redis_buckets`) computes bit-for-bit
the same results: time is in whole milliseconds and a bucket's ``level`` is in *units* of
1/60000 token (:data:`UNITS_PER_TOKEN`), so one millisecond refills exactly ``tokens_per_minute``
units. Every value stays below 2**53 (exact in Lua's doubles) while ``tokens_per_minute`` is at most
:data:`MAX_TOKENS_PER_MINUTE`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

UNITS_PER_TOKEN = 60_000
"""Bucket units per token: milliseconds per minute, so refill is ``tokens_per_minute`` units/ms."""
MAX_TOKENS_PER_MINUTE = 10**10
"""Largest supported limit, in tokens per minute (keeps every integer exact in Lua)."""


def to_ms(now: float) -> int:
    """``now`` in seconds as whole milliseconds (rounded)."""
    return round(now * 1000)


def ceil_div(a: int, b: int) -> int:
    """``ceil(a / b)`` for integers, ``b > 0``."""
    return -(-a // b)


@dataclass(frozen=True, slots=True)
class BucketState:
    """A bucket at ``updated_ms`` (milliseconds): ``level`` in units of 1/60000 token (may be
    negative after an overcharge)."""

    level: int
    updated_ms: int

    @property
    def tokens(self) -> int:
        """Whole tokens in the bucket (0 when in debt)."""
        return max(0, self.level // UNITS_PER_TOKEN)


class Verdict(StrEnum):
    """Result of a reservation attempt."""

    RESERVED = "reserved"
    DENIED = "denied"
    TOO_LARGE = "too_large"


@dataclass(frozen=True, slots=True)
class Reservation:
    """A reservation attempt's result.

    ``remaining_tokens``: whole tokens left after it (tokens). ``retry_after_ms``: for DENIED, the
    wait until the same cost would pass (milliseconds), else 0. ``reset_ms``: time until the bucket
    is full again (milliseconds). ``limit_tokens``: capacity (tokens per minute).
    """

    verdict: Verdict
    limit_tokens: int
    remaining_tokens: int
    retry_after_ms: int
    reset_ms: int

    @property
    def retry_after_s(self) -> float:
        """``retry_after_ms`` in seconds."""
        return self.retry_after_ms / 1000

    def headers(self) -> dict[str, str]:
        """OpenAI's ``x-ratelimit-*-tokens`` headers for this result."""
        return ratelimit_headers(self.limit_tokens, self.remaining_tokens, self.reset_ms)


def check_limit(tokens_per_minute: int) -> None:
    """Raise ValueError unless ``tokens_per_minute`` is in 1..MAX_TOKENS_PER_MINUTE."""
    if not 0 < tokens_per_minute <= MAX_TOKENS_PER_MINUTE:
        raise ValueError(f"tokens_per_minute must be in 1..{MAX_TOKENS_PER_MINUTE}, "
                         f"got {tokens_per_minute}")


def refill(state: BucketState | None, tokens_per_minute: int, now_ms: int) -> BucketState:
    """The bucket at ``now_ms`` (milliseconds): full if new, else topped up by
    ``tokens_per_minute`` units per elapsed millisecond, capped at capacity. A clock behind
    ``updated_ms`` (another gateway's skew) refills nothing and keeps ``updated_ms``."""
    capacity = tokens_per_minute * UNITS_PER_TOKEN
    if state is None:
        return BucketState(capacity, now_ms)
    elapsed = now_ms - state.updated_ms
    if elapsed <= 0:
        return BucketState(min(state.level, capacity), state.updated_ms)
    need = capacity - state.level
    if need <= 0 or elapsed >= ceil_div(need, tokens_per_minute):
        return BucketState(capacity, now_ms)
    return BucketState(state.level + elapsed * tokens_per_minute, now_ms)


def reset_ms(state: BucketState, tokens_per_minute: int) -> int:
    """Milliseconds until a bucket at ``state`` (already refilled) is full again."""
    need = tokens_per_minute * UNITS_PER_TOKEN - state.level
    return ceil_div(need, tokens_per_minute) if need > 0 else 0


def reserve(state: BucketState | None, tokens_per_minute: int, cost: int,
            now_ms: int) -> tuple[BucketState | None, Reservation]:
    """Try to take ``cost`` tokens at ``now_ms`` (milliseconds) from a ``tokens_per_minute`` bucket.

    Returns the new state (the input state, unchanged, unless RESERVED: refill is path-independent,
    so a denial need not be written back) and the result.
    """
    now = refill(state, tokens_per_minute, now_ms)
    units = cost * UNITS_PER_TOKEN
    if cost > tokens_per_minute:
        verdict, retry, new = Verdict.TOO_LARGE, 0, state
    elif now.level >= units:
        now = BucketState(now.level - units, now.updated_ms)
        verdict, retry, new = Verdict.RESERVED, 0, now
    else:
        verdict, retry, new = Verdict.DENIED, ceil_div(units - now.level, tokens_per_minute), state
    return new, Reservation(verdict, tokens_per_minute, now.tokens, retry,
                            reset_ms(now, tokens_per_minute))


def settle(state: BucketState | None, tokens_per_minute: int, reserved: int, used: int,
           now_ms: int) -> BucketState:
    """The bucket after a reservation of ``reserved`` tokens turned out to use ``used`` tokens.

    Refunds ``reserved - used`` (capped at capacity) or, if ``used > reserved``, takes the
    difference, possibly leaving the bucket negative.
    """
    now = refill(state, tokens_per_minute, now_ms)
    capacity = tokens_per_minute * UNITS_PER_TOKEN
    return BucketState(min(capacity, now.level + (reserved - used) * UNITS_PER_TOKEN),
                       now.updated_ms)


def format_duration(ms: int) -> str:
    """``ms`` milliseconds as OpenAI writes ``x-ratelimit-reset-*`` (Go style): ``0s``, ``20ms``,
    ``1.5s``, ``6m0s``, ``1h2m3.5s``."""
    if ms <= 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    seconds = f"{rest / 1000:.3f}".rstrip("0").rstrip(".") + "s"
    if hours:
        return f"{hours}h{minutes}m{seconds}"
    return f"{minutes}m{seconds}" if minutes else seconds


def ratelimit_headers(limit_tokens: int, remaining_tokens: int, reset: int) -> dict[str, str]:
    """``x-ratelimit-limit-tokens`` (tokens per minute), ``-remaining-tokens`` (tokens) and
    ``-reset-tokens`` (duration until full, from ``reset`` milliseconds)."""
    return {
        "x-ratelimit-limit-tokens": str(limit_tokens),
        "x-ratelimit-remaining-tokens": str(remaining_tokens),
        "x-ratelimit-reset-tokens": format_duration(reset),
    }

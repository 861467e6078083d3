"""How the batch worker paces itself (pure; clock values and randomness passed in).

* :func:`classify`: what an answer to one line means: done, a final answer (non-2xx, kept as the
  line's result), throttled (429/503: the pool or the team has no room; wait Retry-After and
  send the line again, not counted as an attempt), unreachable (no connection to the API at all:
  the platform is down, not the line; pause with a growing backoff, not counted) or transient
  (5xx, a reset or timeout after sending: back off, counted; the last answer is kept after
  ``max_attempts``).
* :func:`retry_after_s`: the wait the gateway asked for, ``retry-after-ms`` first (as the
  ``openai`` SDK does), then ``Retry-After`` (seconds or an HTTP date).
* :class:`Pacer`: bounded concurrency that halves on each throttling episode and grows by about
  one request per window of successes (AIMD), and a pause until the latest Retry-After, so a
  batch stops sending as soon as the pool says it is busy: it runs on idle capacity only.
* :class:`RateWindow` and :func:`forecast`: lines per second lately, and whether the rest can
  finish before the deadline.
* :func:`choose_tier`: raise a batch to ``standard`` only inside the urgency window before its
  deadline, only while it is at risk, and only if the team may send ``standard`` to the model.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from enum import StrEnum

from batch.models import Risk
from modelfleet.config.schema import Tier

DEFAULT_RETRY_AFTER_S = 1.0
"""Wait after a 429/503 that names none, in seconds."""


class Verdict(StrEnum):
    """What to do with a line after one attempt."""

    DONE = "done"
    FINAL = "final"
    THROTTLED = "throttled"
    UNREACHABLE = "unreachable"
    TRANSIENT = "transient"


def classify(status_code: int | None, connected: bool = True) -> Verdict:
    """The verdict on an HTTP status (None: no answer: reset or timeout once ``connected``,
    refused or unreachable otherwise)."""
    if status_code is None and not connected:
        return Verdict.UNREACHABLE
    if status_code is None or status_code in (500, 502, 504):
        return Verdict.TRANSIENT
    if status_code in (429, 503):
        return Verdict.THROTTLED
    if 200 <= status_code < 300:
        return Verdict.DONE
    return Verdict.FINAL


def retry_after_s(headers: Mapping[str, str], now: float,
                  default_s: float = DEFAULT_RETRY_AFTER_S) -> float:
    """Seconds to wait from ``retry-after-ms`` (milliseconds), else ``Retry-After`` (whole
    seconds or an HTTP date, against ``now`` in seconds since the epoch), else ``default_s``.
    ``headers`` have lower-case names."""
    raw_ms = headers.get("retry-after-ms")
    if raw_ms is not None:
        try:
            return max(0.0, float(raw_ms) / 1000)
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if raw is not None:
        try:
            return max(0.0, float(raw))
        except ValueError:
            pass
        try:
            return max(0.0, float(parsedate_to_datetime(raw).timestamp()) - now)
        except (TypeError, ValueError, IndexError):
            pass
    return default_s


def backoff_s(attempt: int, rng: random.Random, base_s: float = 0.5, cap_s: float = 30.0) -> float:
    """Wait before attempt ``attempt + 1`` after a transient failure (seconds): ``base_s``
    doubled per attempt, capped at ``cap_s``, times a random factor in [0.5, 1)."""
    return min(cap_s, base_s * 2.0 ** max(0, attempt - 1)) * (0.5 + rng.random() / 2)


@dataclass
class Pacer:
    """Concurrency window (requests) and pause of one running batch; times in seconds."""

    max_concurrency: int
    window: float = field(init=False)
    paused_until: float = 0.0

    def __post_init__(self) -> None:
        if self.max_concurrency < 1:
            raise ValueError("max_concurrency must be at least 1")
        self.window = float(self.max_concurrency)

    def paused(self, now: float) -> bool:
        """True while the last Retry-After has not passed."""
        return now < self.paused_until

    def free_slots(self, in_flight: int, now: float) -> int:
        """How many more lines may be sent at ``now`` with ``in_flight`` lines out."""
        if self.paused(now):
            return 0
        return max(0, math.floor(self.window) - in_flight)

    def on_success(self) -> None:
        """A line was answered: grow the window by 1/window (about one per window's worth)."""
        self.window = min(float(self.max_concurrency), self.window + 1.0 / self.window)

    def on_throttled(self, now: float, wait_s: float) -> None:
        """A 429/503 asking for ``wait_s`` seconds: pause until then; the first refusal of a
        pause halves the window (several answers of one burst count once)."""
        if not self.paused(now):
            self.window = max(1.0, self.window / 2)
        self.paused_until = max(self.paused_until, now + wait_s)


class RateWindow:
    """Lines finished per second over the last ``window_s`` seconds of a run that started at
    ``started`` (seconds); unknown for the first ``warmup_s`` seconds."""

    def __init__(self, started: float, window_s: float = 60.0, warmup_s: float = 5.0) -> None:
        self.started, self.window_s, self.warmup_s = started, window_s, warmup_s
        self._times: deque[float] = deque()

    def add(self, now: float, lines: int = 1) -> None:
        """``lines`` lines finished at ``now`` (seconds)."""
        self._times.extend([now] * lines)

    def rate(self, now: float) -> float | None:
        """Lines per second, or None during the warm-up."""
        elapsed = now - self.started
        if elapsed < self.warmup_s:
            return None
        while self._times and self._times[0] <= now - self.window_s:
            self._times.popleft()
        return len(self._times) / min(self.window_s, elapsed)


def forecast(remaining: int, lines_per_s: float | None, time_left_s: float, *,
             safety: float = 1.25, min_lead_s: float = 60.0) -> Risk:
    """On track or at risk: ``remaining`` lines at ``lines_per_s`` (None: no estimate yet) must
    end ``safety`` times inside ``time_left_s`` seconds; with less than ``min_lead_s`` seconds
    left and lines remaining, a batch is at risk whatever its rate."""
    if remaining <= 0:
        return Risk.ON_TRACK
    if time_left_s <= min_lead_s:
        return Risk.AT_RISK
    if lines_per_s is None:
        return Risk.ON_TRACK
    if lines_per_s <= 0:
        return Risk.AT_RISK
    return Risk.AT_RISK if remaining / lines_per_s * safety > time_left_s else Risk.ON_TRACK


def choose_tier(current: Tier, risk: Risk, time_left_s: float, urgent_window_s: float,
                allowed: Collection[Tier]) -> Tier:
    """The tier to send at: ``standard`` if the team may (``allowed`` holds its tiers on the
    model), the batch is at risk and ``time_left_s`` is inside ``urgent_window_s`` seconds (0:
    never); once raised it stays raised. Otherwise ``batch``."""
    if current == "standard" and "standard" in allowed:
        return "standard"
    if (urgent_window_s > 0 and "standard" in allowed and risk is Risk.AT_RISK
            and time_left_s <= urgent_window_s):
        return "standard"
    return "batch"

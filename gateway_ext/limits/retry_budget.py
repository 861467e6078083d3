"""Retry-storm guard (pure; clock and jitter injected).

* Every 429 and 503 carries ``Retry-After``: the policy's exact wait (seconds) stretched by a random
  factor in ``[1, 1 + jitter]`` from an injected :class:`random.Random`, so clients told to wait
  at the same moment do not come back at the same moment, and never earlier than the policy said.
  ``retry-after-ms`` is sent too (the ``openai`` SDK honours it before ``Retry-After``).
* A per-team retry budget: a request whose fingerprint (team + conversation id, else a hash of the
  body) was refused and comes back *inside its own Retry-After window* is an early retry. Early
  retries are allowed up to ``max(min_early_retries, early_retry_ratio x the team's other requests)``
  per ``window_s``; past that they are refused cheaply (429, before parsing or any bucket call).
"""

from __future__ import annotations

import hashlib
import math
import random
from collections import deque
from dataclasses import dataclass

DEFAULT_JITTER = 0.5


def jittered(base_s: float, rng: random.Random, jitter: float = DEFAULT_JITTER) -> float:
    """``base_s`` seconds times a random factor in ``[1, 1 + jitter]`` (seconds)."""
    return base_s * (1.0 + rng.random() * jitter)


def retry_after_headers(delay_s: float) -> dict[str, str]:
    """``Retry-After`` (whole seconds, rounded up, at least 1) and ``retry-after-ms`` (milliseconds,
    rounded up) for a wait of ``delay_s`` seconds."""
    return {"retry-after": str(max(1, math.ceil(delay_s))),
            "retry-after-ms": str(max(1, math.ceil(delay_s * 1000)))}


def fingerprint(conversation_id: str | None, body: bytes) -> str:
    """What identifies a client's retry: ``c:<conversation id>``, else ``b:`` + a hash of the body
    (a retry resends the same body)."""
    if conversation_id:
        return "c:" + conversation_id
    return "b:" + hashlib.blake2b(body, digest_size=16).hexdigest()


@dataclass(frozen=True, slots=True)
class RetryBudgetConfig:
    """Budget window (seconds), early retries always allowed per window, extra allowance as a
    fraction of the team's other requests in the window, jitter fraction, fingerprints kept."""

    window_s: float = 60.0
    min_early_retries: int = 10
    early_retry_ratio: float = 0.1
    jitter: float = DEFAULT_JITTER
    max_tracked: int = 100_000


@dataclass(frozen=True, slots=True)
class RetryCheck:
    """``allowed``: go on with the request. ``early``: it came back inside its Retry-After window.
    ``retry_after_s``: for a refusal, the jittered wait (seconds)."""

    allowed: bool
    early: bool
    retry_after_s: float = 0.0


class _Window:
    """Counts per whole second over the last ``span`` seconds, with running totals."""

    def __init__(self, span: float) -> None:
        self.span = span
        self.slots: deque[list[int]] = deque()  # [second, requests, early]
        self.requests = 0
        self.early = 0

    def advance(self, now: float) -> None:
        """Forget the seconds older than ``span`` before ``now`` (seconds)."""
        while self.slots and self.slots[0][0] <= now - self.span:
            _, requests, early = self.slots.popleft()
            self.requests -= requests
            self.early -= early

    def add(self, now: float, early: bool) -> None:
        """Count one request (an early retry if ``early``) at ``now`` (seconds)."""
        second = math.floor(now)
        if not self.slots or self.slots[-1][0] != second:
            self.slots.append([second, 0, 0])
        self.slots[-1][2 if early else 1] += 1
        if early:
            self.early += 1
        else:
            self.requests += 1


class RetryBudget:
    """Per-team retry budgets and the Retry-After windows of refused requests (one gateway process)."""

    def __init__(self, rng: random.Random, config: RetryBudgetConfig | None = None) -> None:
        self.rng = rng
        self.config = config or RetryBudgetConfig()
        self._windows: dict[str, _Window] = {}
        self._until: dict[tuple[str, str], float] = {}

    def check(self, team: str, print_: str, now: float) -> RetryCheck:
        """Account an arriving request of ``team`` with fingerprint ``print_`` at ``now`` (seconds)."""
        window = self._windows.get(team)
        if window is None:
            window = self._windows[team] = _Window(self.config.window_s)
        window.advance(now)
        until = self._until.get((team, print_))
        if until is None or now >= until:
            self._until.pop((team, print_), None)
            window.add(now, early=False)
            return RetryCheck(True, False)
        allowance = max(self.config.min_early_retries,
                        math.floor(self.config.early_retry_ratio * window.requests))
        if window.early >= allowance:
            return RetryCheck(False, True, jittered(until - now, self.rng, self.config.jitter))
        window.add(now, early=True)
        return RetryCheck(True, True)

    def refused(self, team: str, print_: str, base_retry_after_s: float, now: float) -> float:
        """Note a 429/503 to ``team``'s ``print_`` at ``now`` (seconds) with the policy's wait
        ``base_retry_after_s`` (seconds); returns the jittered Retry-After (seconds) to send."""
        delay = jittered(base_retry_after_s, self.rng, self.config.jitter)
        key = (team, print_)
        self._until.pop(key, None)
        self._until[key] = now + delay
        self._forget(now)
        return delay

    def tracked(self) -> int:
        """Fingerprints currently remembered."""
        return len(self._until)

    def _forget(self, now: float) -> None:
        """Drop expired windows from the oldest end, and the oldest beyond ``max_tracked``."""
        while self._until:
            key = next(iter(self._until))
            if self._until[key] > now and len(self._until) <= self.config.max_tracked:
                break
            del self._until[key]

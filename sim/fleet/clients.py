"""The clients in the simulator: they replay the arrivals, send each request to a region, and
retry refusals and failures as the openai SDK does.

Retry rule (openai-python's ``_calculate_retry_timeout``, ``max_retries=2``): a 408, 409, 429,
5xx or a connection error is retried; the wait is the response's ``Retry-After`` when it is
given and in ``(0, 60]`` seconds, else ``min(0.5 x 2^n, 8)`` seconds times a jitter factor in
``(0.75, 1]`` after ``n`` earlier retries. The gateway's Retry-After already carries its own
jitter (``gateway_ext.limits.retry_budget``). Batch work (the batch worker) keeps pausing and
retrying: ``batch_max_retries``. A retry resends the same request (its full history) at the
region the client's DNS answer names *then*: after a failover, another region.

One :class:`~sim.fleet.measures.RequestRow` per request that first arrived in the measured window: a
retry updates the same row (``retries``, and its result is the last attempt's); TTFT runs from
the first attempt.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

from sim.fleet.loop import ARRIVAL, RETRY, Loop
from sim.fleet.measures import RequestRow, Result
from sim.traces.arrivals import Arrival


@dataclass(frozen=True)
class RetryPolicy:
    """How clients retry; seconds. The defaults are the openai SDK's."""

    max_retries: int = 2
    batch_max_retries: int = 10
    max_retry_after_s: float = 60.0
    initial_s: float = 0.5
    max_backoff_s: float = 8.0

    def limit(self, tier: str) -> int:
        """Retries allowed for a request of ``tier``."""
        return self.batch_max_retries if tier == "batch" else self.max_retries


def retry_delay(policy: RetryPolicy, retries_done: int, retry_after_s: float | None,
                draw: float) -> float:
    """Seconds before the next attempt, after ``retries_done`` retries; ``retry_after_s`` the
    response's Retry-After (None: none, e.g. a connection error); ``draw`` in [0, 1)."""
    if retry_after_s is not None and 0 < retry_after_s <= policy.max_retry_after_s:
        return retry_after_s
    return min(policy.initial_s * 2.0 ** retries_done, policy.max_backoff_s) * (1 - 0.25 * draw)


def retry_after_s(headers: Mapping[str, str]) -> float | None:
    """The Retry-After of a response, seconds (``retry-after-ms`` first, as the SDK reads it)."""
    if "retry-after-ms" in headers:
        return float(headers["retry-after-ms"]) / 1000
    if "retry-after" in headers:
        return float(headers["retry-after"])
    return None


class Region(Protocol):
    """A region as the clients see it: somewhere to send a request."""

    def arrive(self, a: Arrival, row: RequestRow | None, t0: float, attempt: int,
               t: float) -> None: ...


@dataclass(slots=True)
class Attempt:
    """A retry in flight: the request, its row, its first arrival (seconds), the attempt number."""

    arrival: Arrival
    row: RequestRow | None
    t0: float
    attempt: int


class Clients:
    """Every client: arrivals from ``source``, each to the region ``route(arrival, t)`` names."""

    def __init__(self, loop: Loop, regions: Mapping[str, Region],
                 route: Callable[[Arrival, float], str], window: tuple[float, float],
                 policy: RetryPolicy | None = None, seed: int = 0) -> None:
        self.loop, self.regions, self.route = loop, regions, route
        self.start_s, self.end_s = window
        self.policy = policy
        self.rng = random.Random(seed)
        self.rows: list[RequestRow] = []
        self.failures: list[tuple[float, str, str, str]] = []
        """``(time, region, result, tier)`` of every refused or failed attempt (seconds)."""
        self._source: Iterator[Arrival] = iter(())

    def start(self, source: Iterable[Arrival]) -> None:
        """Replay ``source`` (time order) from now on."""
        self._source = iter(source)
        self._pull()

    def _pull(self) -> None:
        a = next(self._source, None)
        if a is not None:
            self.loop.push(a.time_s, self, ARRIVAL, a)

    def handle(self, kind: int, ref: object, t: float) -> None:
        """A new request (``ARRIVAL``) or a retry (``RETRY``) at ``t`` seconds."""
        if kind == ARRIVAL:
            a: Arrival = ref  # type: ignore[assignment]
            row = None
            if self.start_s <= t < self.end_s:
                row = RequestRow(t, a.team, a.tier, a.prompt_tokens, a.output_tokens,
                                 a.history_tokens)
                self.rows.append(row)
            self.regions[self.route(a, t)].arrive(a, row, t, 0, t)
            self._pull()
        else:
            r: Attempt = ref  # type: ignore[assignment]
            self.regions[self.route(r.arrival, t)].arrive(r.arrival, r.row, r.t0, r.attempt, t)

    def failed(self, a: Arrival, row: RequestRow | None, t0: float, attempt: int, t: float,
               result: Result, retry_after: float | None, region: str) -> None:
        """An attempt was refused or failed at ``t`` (seconds): retry it, or let the row end so."""
        self.failures.append((t, region, result.value, a.tier))
        if row is not None:
            row.result = result
        policy = self.policy
        if policy is None or attempt >= policy.limit(a.tier):
            return
        if row is not None:
            row.retries += 1
        delay = retry_delay(policy, attempt, retry_after, self.rng.random())
        self.loop.push(t + delay, self, RETRY, Attempt(a, row, t0, attempt + 1))

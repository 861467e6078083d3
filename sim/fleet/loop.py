"""The simulator's event loop: one heap of timed events shared by every region and the clients.

An event is ``(time_s, order, target, kind, ref)``: ``target.handle(kind, ref, time_s)`` runs
it. ``order`` is the push count, so simultaneous events run in the order they were pushed:
deterministic, never by wall time or ``hash``.
"""

from __future__ import annotations

import gc
import heapq
import itertools
from typing import Protocol

STEP, ARRIVAL, TICK, READY, RETRY = 0, 1, 2, 3, 4
"""Event kinds: an engine step ends, a request arrives, a heartbeat, a replica is ready, a
client retries."""


_GC_YOUNG = 50_000
"""Allocations between two collections of the garbage collector's youngest generation in a run."""


class Handler(Protocol):
    """What an event's target does with it at ``t`` (model seconds)."""

    def handle(self, kind: int, ref: object, t: float) -> None: ...


class Loop:
    """The heap of pending events, in model seconds."""

    __slots__ = ("_seq", "end_s", "heap")

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, Handler, int, object]] = []
        self._seq = itertools.count()
        self.end_s = float("inf")

    def push(self, t: float, target: Handler, kind: int, ref: object) -> None:
        """Run ``target.handle(kind, ref, t)`` at ``t`` seconds."""
        heapq.heappush(self.heap, (t, next(self._seq), target, kind, ref))

    def run(self, end_s: float) -> None:
        """Run events in time order until the first one at or after ``end_s`` seconds (or an
        earlier end set by :meth:`stop`)."""
        self.end_s = min(self.end_s, end_s)
        heap, pop = self.heap, heapq.heappop
        # A run makes millions of short-lived tuples and records: collect the youngest
        # generation every _GC_YOUNG allocations instead of every 700 (a few % of the run's time).
        threshold = gc.get_threshold()
        gc.set_threshold(max(threshold[0], _GC_YOUNG), *threshold[1:])
        try:
            while heap:
                t, _, target, kind, ref = pop(heap)
                if t >= self.end_s:
                    break
                target.handle(kind, ref, t)
        finally:
            gc.set_threshold(*threshold)

    def stop(self, at_s: float) -> None:
        """End the run at ``at_s`` seconds at the latest."""
        self.end_s = min(self.end_s, at_s)

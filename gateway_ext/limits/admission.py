"""Admission of requests to one pool (``model@version`` in a region) by tier, team share and
concurrency: a pure state machine over plain data, clock passed in; the service drives it.

Load is *tokens in flight*: each request adds its ``tokens`` (the caller's estimate, e.g. prompt
plus max_tokens) from admission until :meth:`PoolAdmission.release`. Capacity is the version's
load-tested tokens in flight per replica x serving replicas (:func:`pool_capacity_tokens`).

Order of rules for an arriving request:

1. the team already has ``max_concurrency`` requests admitted or queued on the model: 429;
2. nothing of its tier or higher is queued and it fits: ADMIT (batch fits only below
   ``batch_ceiling`` x capacity with an empty queue; a team may burst above its guaranteed share
   into idle capacity);
3. otherwise the pool is overloaded for it, and the order is fixed: batch pauses (queued last);
   then a team above its guaranteed share (its tokens in flight + queued, plus this request,
   above ``guaranteed_share`` x capacity) gets 429; then standard queues behind interactive;
   interactive inside its guarantee queues first in line and is never shed. A pool with no
   capacity (no serving replica yet) queues every tier: no team is above a share of nothing.

The queue is bounded (``max_queue`` entries). Past the bound the lowest tier present (the arrival
included) is shed with 503, the newest entry of that tier first; interactive entries are never
shed and may exceed the bound. Each tier has a queue timeout (503 when it passes; None: wait until
capacity frees or the client leaves). Freed capacity goes to the head of the highest tier (strict
priority, FIFO within a tier).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from gateway_ext.limits.admission_types import (
    AdmissionConfig,
    AdmissionDecision,
    AdmissionReason,
    AdmissionRequest,
    Outcome,
    PoolView,
)
from gateway_ext.limits.concurrency import TeamConcurrency
from modelfleet.config.schema import TIERS, Tier

__all__ = [
    "AdmissionConfig",
    "AdmissionDecision",
    "AdmissionReason",
    "AdmissionRequest",
    "Outcome",
    "PoolAdmission",
    "PoolView",
    "pool_capacity_tokens",
]


@dataclass(slots=True)
class _Entry:
    req: AdmissionRequest
    since: float
    deadline: float | None


def pool_capacity_tokens(tokens_in_flight_per_replica: int, replicas: int) -> int:
    """Pool capacity in tokens in flight: load-tested tokens per replica x serving replicas."""
    return tokens_in_flight_per_replica * replicas


class PoolAdmission:
    """Admission state of one pool. ``concurrency`` may be shared by the pools of one model."""

    def __init__(self, capacity_tokens: int, config: AdmissionConfig | None = None,
                 concurrency: TeamConcurrency | None = None) -> None:
        self.capacity_tokens = capacity_tokens
        self.config = config or AdmissionConfig()
        self.concurrency = concurrency if concurrency is not None else TeamConcurrency()
        self.in_flight_tokens = 0
        self._in_flight: dict[str, _Entry] = {}
        self._team_in_flight: dict[str, int] = {}
        self._team_queued: dict[str, int] = {}
        self._queues: dict[Tier, OrderedDict[str, _Entry]] = {t: OrderedDict() for t in TIERS}

    def offer(self, req: AdmissionRequest, now: float) -> Outcome:
        """Decide on an arriving request at ``now`` (seconds)."""
        if req.request_id in self._in_flight or self._queued_entry(req.request_id):
            raise ValueError(f"request {req.request_id!r} was already offered")
        if self.concurrency.in_use(req.team) >= req.max_concurrency:
            return self._refuse(req.request_id, AdmissionDecision.REJECT_429, AdmissionReason.MAX_CONCURRENCY)
        rank = TIERS.index(req.tier)
        ahead = any(self._queues[t] for t in TIERS[: rank + 1])
        if not ahead and self._fits(req):
            self.concurrency.acquire(req.team)
            self._admit(_Entry(req, now, None))
            within = self._team_load(req.team) <= req.guaranteed_share * self.capacity_tokens
            return Outcome(req.request_id, AdmissionDecision.ADMIT, AdmissionReason.FITS if within else AdmissionReason.BURST)
        if req.tier == "batch":
            return self._enqueue(req, now, AdmissionReason.BATCH_PAUSED)
        if self.capacity_tokens > 0 and (self._team_load(req.team) + req.tokens
                                         > req.guaranteed_share * self.capacity_tokens):
            return self._refuse(req.request_id, AdmissionDecision.REJECT_429, AdmissionReason.ABOVE_SHARE)
        return self._enqueue(req, now, AdmissionReason.POOL_FULL)

    def release(self, request_id: str, now: float) -> list[Outcome]:
        """A request finished (or its client left) at ``now`` (seconds): free its tokens or queue
        slot; returns the queued requests admitted in its place. Unknown ids are ignored."""
        entry = self._in_flight.pop(request_id, None)
        if entry is not None:
            self.in_flight_tokens -= entry.req.tokens
            self._add(self._team_in_flight, entry.req.team, -entry.req.tokens)
            self.concurrency.release(entry.req.team)
        else:
            self._dequeue(request_id)
        return self._drain(now)

    def expire(self, now: float) -> list[Outcome]:
        """Time out queued requests past their tier's timeout (503) and drop admitted requests held
        longer than ``in_flight_ttl_s`` (seconds); returns the 503s, then the admissions made."""
        timed_out: list[Outcome] = []
        for queue in self._queues.values():
            for rid, entry in list(queue.items()):
                if entry.deadline is not None and now >= entry.deadline:
                    self._dequeue(rid)
                    timed_out.append(self._refuse(rid, AdmissionDecision.SHED_503, AdmissionReason.QUEUE_TIMEOUT,
                                                  now - entry.since))
        stale = [rid for rid, e in self._in_flight.items()
                 if now - e.since >= self.config.in_flight_ttl_s]
        admitted = [o for rid in stale for o in self.release(rid, now)]
        return timed_out + admitted + self._drain(now)

    def set_capacity(self, capacity_tokens: int, now: float) -> list[Outcome]:
        """New capacity in tokens in flight (replicas came or went); returns admissions made."""
        self.capacity_tokens = capacity_tokens
        return self._drain(now)

    def next_deadline(self) -> float | None:
        """The earliest queue deadline (seconds), if any: when :meth:`expire` next has work."""
        deadlines = [e.deadline for q in self._queues.values() for e in q.values()
                     if e.deadline is not None]
        return min(deadlines, default=None)

    def view(self) -> PoolView:
        """Capacity, tokens in flight and queue depth per tier."""
        return PoolView(self.capacity_tokens, self.in_flight_tokens,
                        {t: len(q) for t, q in self._queues.items()})

    def _fits(self, req: AdmissionRequest) -> bool:
        limit = self.capacity_tokens * (self.config.batch_ceiling if req.tier == "batch" else 1.0)
        if self.in_flight_tokens == 0 and self.capacity_tokens > 0:
            return True  # one request larger than the pool still runs on an idle pool
        return self.in_flight_tokens + req.tokens <= limit

    def _team_load(self, team: str) -> int:
        return self._team_in_flight.get(team, 0) + self._team_queued.get(team, 0)

    def _refuse(self, rid: str, decision: AdmissionDecision, reason: AdmissionReason, waited: float = 0.0) -> Outcome:
        return Outcome(rid, decision, reason, self.config.retry_after_s.get(reason, 1.0), waited)

    def _admit(self, entry: _Entry) -> None:
        self._in_flight[entry.req.request_id] = entry
        self.in_flight_tokens += entry.req.tokens
        self._add(self._team_in_flight, entry.req.team, entry.req.tokens)

    def _enqueue(self, req: AdmissionRequest, now: float, reason: AdmissionReason) -> Outcome:
        shed: tuple[Outcome, ...] = ()
        if sum(len(q) for q in self._queues.values()) >= self.config.max_queue:
            victim = self._victim(req.tier)
            if victim is None and req.tier != "interactive":
                return self._refuse(req.request_id, AdmissionDecision.SHED_503, AdmissionReason.QUEUE_FULL)
            evicted = self._dequeue(victim) if victim is not None else None
            if evicted is not None:
                shed = (self._refuse(evicted.req.request_id, AdmissionDecision.SHED_503, AdmissionReason.QUEUE_FULL,
                                     now - evicted.since),)
        timeout = self.config.queue_timeout_s.get(req.tier)
        self._queues[req.tier][req.request_id] = _Entry(
            req, now, None if timeout is None else now + timeout)
        self.concurrency.acquire(req.team)
        if req.tier != "batch":
            self._add(self._team_queued, req.team, req.tokens)
        return Outcome(req.request_id, AdmissionDecision.QUEUE, reason, shed=shed)

    def _victim(self, arriving: Tier) -> str | None:
        """Newest queued entry of the lowest sheddable tier strictly below ``arriving``."""
        for tier in reversed(TIERS[TIERS.index(arriving) + 1:]):
            if tier != "interactive" and self._queues[tier]:
                return next(reversed(self._queues[tier]))
        return None

    def _queued_entry(self, rid: str) -> _Entry | None:
        return next((q[rid] for q in self._queues.values() if rid in q), None)

    def _dequeue(self, rid: str) -> _Entry | None:
        for queue in self._queues.values():
            entry = queue.pop(rid, None)
            if entry is not None:
                self.concurrency.release(entry.req.team)
                if entry.req.tier != "batch":
                    self._add(self._team_queued, entry.req.team, -entry.req.tokens)
                return entry
        return None

    def _drain(self, now: float) -> list[Outcome]:
        admitted: list[Outcome] = []
        for tier in TIERS:
            queue = self._queues[tier]
            while queue:
                entry = next(iter(queue.values()))
                if not self._fits(entry.req):
                    return admitted
                del queue[entry.req.request_id]
                if tier != "batch":
                    self._add(self._team_queued, entry.req.team, -entry.req.tokens)
                self._admit(entry)
                entry.since, waited = now, now - entry.since
                admitted.append(Outcome(entry.req.request_id, AdmissionDecision.ADMIT, AdmissionReason.FITS,
                                        waited_s=waited))
        return admitted

    @staticmethod
    def _add(counter: dict[str, int], team: str, tokens: int) -> None:
        value = counter.get(team, 0) + tokens
        if value:
            counter[team] = value
        else:
            counter.pop(team, None)

"""The gateway's request lifecycle on one asyncio loop: decide, wait in the queue, run, settle.

:class:`RequestLifecycle` drives the pure :class:`~gateway_ext.decision.GatewayCore` and its pools:

* ``check``: a decision; an admitted request starts *running* (a ticket keyed by its reservation
  id); a queued one waits on a future until the admission outcomes of later events (a settle that
  frees capacity, a queue timeout, a shed to make room, new capacity) resolve it to admitted or
  503. A client that goes away while queued (``gone`` completes: Envoy cancelled the check) leaves
  the queue and gets its reservation back.
* ``settle``: the replica's report of real usage ends a running request: the bucket is settled
  (refund or overcharge), the pool slot and concurrency are released, the usage is metered. A
  report for a reservation this process does not hold (another gateway process admitted it, or
  it restarted) still settles the shared bucket and meters the usage (with Redis,
  :class:`~gateway_ext.shared_lifecycle.SharedLifecycle` also tells the admitting process to free its slot).
* ``tick``: queue timeouts (503), admitted requests never settled (dropped when their reservation
  expires), garbage collection; ``run_timer`` calls it at the earliest queue deadline, and at
  least every ``interval_s``.
* ``on_start`` / ``on_end``: a request starts running (its replica is picked then, at once or out
  of the queue, with the loads of that moment) and ends (settled, left, or forgotten).

Single-threaded by design: every method runs on the service's event loop; the clock is injected.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gateway_ext.decision import Admitted, GatewayCore, Refused
from gateway_ext.limits.admission_types import AdmissionDecision, Outcome
from gateway_ext.limits.bucket_store import BucketKey, Settlement, SettleVerdict
from gateway_ext.limits.retry_budget import fingerprint, retry_after_headers
from gateway_ext.metrics import GatewayMetrics, MetricsRecorder
from gateway_ext.request import header, parse_tier
from modelfleet.config.schema import TeamLimit
from modelfleet.contract.errors import ApiError, ErrorType, shed
from modelfleet.contract.headers import CONVERSATION_HEADER, PRIORITY_HEADER

CLIENT_GONE = ApiError(499, ErrorType.INVALID_REQUEST, "The client closed the request.",
                       "client_closed")
"""What a check answers when its client left while queued (nobody reads it)."""


@dataclass(frozen=True, slots=True)
class UsageReport:
    """A replica's report on how a reservation ended: real usage in tokens, and ``outcome``
    (``finished``, ``client_disconnect``, ``error``, ``rejected``)."""

    reservation_id: str
    team: str
    model: str
    version: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    outcome: str = "finished"
    tier: str = "standard"
    """The request's tier, metered on a settle for a reservation another process admitted."""


@dataclass(slots=True)
class _Waiter:
    admitted: Admitted
    future: asyncio.Future[Admitted | Refused]
    print_: str


@dataclass(frozen=True, slots=True)
class _Ticket:
    admitted: Admitted
    forget_at: float


class RequestLifecycle:
    """Requests of one gateway process: queued waiters and running tickets over ``core``."""

    def __init__(self, core: GatewayCore, metrics: GatewayMetrics, clock: Callable[[], float],
                 new_id: Callable[[], str] = lambda: uuid.uuid4().hex,
                 on_start: Callable[[Admitted, float], Admitted] | None = None,
                 on_end: Callable[[str], None] | None = None) -> None:
        self.core = core
        self.record = MetricsRecorder(metrics)
        self.clock = clock
        self.new_id = new_id
        self.on_start = on_start
        self.on_end = on_end
        self._waiting: dict[str, _Waiter] = {}
        self._running: dict[str, _Ticket] = {}
        self._rearm = asyncio.Event()

    @property
    def queued(self) -> int:
        """Requests waiting in a queue."""
        return len(self._waiting)

    @property
    def running(self) -> int:
        """Admitted requests not settled yet."""
        return len(self._running)

    async def check(self, headers: Mapping[str, str], body: bytes,
                    gone: Callable[[], Awaitable[object]] | None = None) -> Admitted | Refused:
        """Decide on a chat request; wait while it is queued. ``gone()`` (called only if the
        request queues) completes when the client leaves: the request then leaves the queue and
        :data:`CLIENT_GONE` is returned."""
        now = self.clock()
        result = await self._decide(headers, body, now)
        if isinstance(result, Refused):
            self._count_refusal(result, header(headers, PRIORITY_HEADER))
            return result
        self.record.bucket(result.team, result.request.model, "reserved",
                           result.request.reserve_tokens)
        self._resolve(result.outcome.shed, now)
        if result.outcome.decision is AdmissionDecision.ADMIT:
            return self._start(result, now, 0.0)
        rid = result.reservation_id
        future: asyncio.Future[Admitted | Refused] = asyncio.get_running_loop().create_future()
        self._waiting[rid] = _Waiter(result, future,
                                     fingerprint(header(headers, CONVERSATION_HEADER), body))
        self._rearm.set()
        try:
            answer = await self._wait(future, gone)
        except BaseException:  # the check itself was cancelled
            self._leave(rid)
            raise
        if isinstance(answer, Refused) and answer.error is CLIENT_GONE:
            self._leave(rid)
        return answer

    async def _wait(self, future: asyncio.Future[Admitted | Refused],
                    gone: Callable[[], Awaitable[object]] | None) -> Admitted | Refused:
        if gone is None:
            return await future
        watcher: asyncio.Future[Any] = asyncio.ensure_future(gone())
        either: set[asyncio.Future[Any]] = {future, watcher}
        try:
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        finally:
            left = watcher.done()
            watcher.cancel()
        return Refused(CLIENT_GONE) if left else future.result()

    def _leave(self, rid: str) -> None:
        """The client left: a queued or just-admitted request gives back its slot and tokens."""
        waiter = self._waiting.pop(rid, None)
        ticket = self._running.pop(rid, None)
        admitted = waiter.admitted if waiter else ticket.admitted if ticket else None
        if admitted is None:
            return
        self._ended(rid)
        now = self.clock()
        self._refunded(admitted, admitted.request.reserve_tokens)
        self._resolve(self._abandon(admitted, now, shed=False), now)
        if waiter is not None and not waiter.future.done():
            waiter.future.set_result(Refused(CLIENT_GONE))

    def settle(self, report: UsageReport) -> Settlement:
        """End a running request with its real usage; returns the bucket settlement."""
        now = self.clock()
        ticket = self._running.pop(report.reservation_id, None)
        self._ended(report.reservation_id)
        if ticket is not None:
            settlement, outcomes = self.core.finish(
                ticket.admitted, report.prompt_tokens, report.cached_tokens,
                report.completion_tokens, now)
            self._resolve(outcomes, now)
        else:
            settlement = self._settle_foreign(report, now)
        self._record_settled(report, settlement)
        return settlement

    async def settle_async(self, report: UsageReport) -> Settlement:
        """:meth:`settle` for the service (a lifecycle whose store does I/O awaits it here)."""
        return self.settle(report)

    async def _decide(self, headers: Mapping[str, str], body: bytes,
                      now: float) -> Admitted | Refused:
        """The core's decision (a lifecycle whose store does I/O awaits it here)."""
        return self.core.decide(headers, body, now, self.new_id())

    def _abandon(self, admitted: Admitted, now: float, shed: bool) -> list[Outcome]:
        """A queued or just-admitted request leaves without running (see ``core.abandon``)."""
        return self.core.abandon(admitted, now, shed)

    def _record_settled(self, report: UsageReport, settlement: Settlement) -> None:
        if settlement.verdict in (SettleVerdict.SETTLED, SettleVerdict.EXPIRED):
            self.record.usage(report.team, report.model, report.prompt_tokens,
                              report.cached_tokens, report.completion_tokens)
        if settlement.verdict is SettleVerdict.SETTLED:
            over = report.prompt_tokens + report.completion_tokens - settlement.reserved_tokens
            self.record.bucket(report.team, report.model, "refunded", max(0, -over))
            self.record.bucket(report.team, report.model, "overcharged", max(0, over))

    def _settle_foreign(self, report: UsageReport, now: float) -> Settlement:
        limit = self._foreign_limit(report)
        if limit is None:
            return Settlement(SettleVerdict.UNKNOWN, 0, 0)
        used = report.prompt_tokens + report.completion_tokens
        settlement = self.core.store.settle(BucketKey(report.team, report.model),
                                            limit.tokens_per_minute, report.reservation_id, used,
                                            now)
        self._meter_foreign(report, settlement, now)
        return settlement

    def _foreign_limit(self, report: UsageReport) -> TeamLimit | None:
        team = next((t for t in self.core.config.teams if t.name == report.team), None)
        return next((lim for lim in team.limits if lim.model == report.model), None) if team \
            else None

    def _meter_foreign(self, report: UsageReport, settlement: Settlement, now: float) -> None:
        if settlement.verdict in (SettleVerdict.SETTLED, SettleVerdict.EXPIRED):
            self.core.meter.record_usage(report.team, report.model, report.version, now,
                                         report.prompt_tokens, report.cached_tokens,
                                         report.completion_tokens, report.tier)

    def set_capacity(self, pool: str, capacity_tokens: int) -> None:
        """New capacity (tokens in flight) for ``pool``: queued requests that now fit run."""
        now = self.clock()
        self._resolve(self.core.pools[pool].set_capacity(capacity_tokens, now), now)

    def tick(self) -> float | None:
        """Time out queued requests, drop admitted ones whose reservation expired, forget old
        records; returns the earliest queue deadline (seconds) if any."""
        now = self.clock()
        for pool in self.core.pools.values():
            self._resolve(pool.expire(now), now)
        self.observe_pools()
        stale = [rid for rid, t in self._running.items() if now >= t.forget_at]
        for rid in stale:
            del self._running[rid]
            self._ended(rid)
        sweep = getattr(self.core.store, "sweep", None)
        if callable(sweep):
            sweep(now - 600.0)  # keep expired records 10 min so late settles read EXPIRED
        deadlines = [d for p in self.core.pools.values() if (d := p.next_deadline()) is not None]
        return min(deadlines, default=None)

    async def run_timer(self, interval_s: float = 1.0) -> None:
        """Call :meth:`tick` at every queue deadline and at least every ``interval_s`` seconds,
        until cancelled."""
        while True:
            deadline = self.tick()
            delay = interval_s if deadline is None else min(interval_s, deadline - self.clock())
            self._rearm.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._rearm.wait(), max(0.0, delay))

    def _start(self, admitted: Admitted, now: float, waited_s: float) -> Admitted:
        if self.on_start is not None:
            admitted = self.on_start(admitted, now)
        ttl = self.core.pools[admitted.pool].config.in_flight_ttl_s
        self._running[admitted.reservation_id] = _Ticket(admitted, now + 2 * ttl)
        self.record.admitted(admitted.pool, admitted.request.tier, waited_s)
        return admitted

    def _ended(self, rid: str) -> None:
        if self.on_end is not None:
            self.on_end(rid)

    def _resolve(self, outcomes: Iterable[Outcome], now: float) -> None:
        work = list(outcomes)
        while work:
            outcome = work.pop(0)
            waiter = self._waiting.pop(outcome.request_id, None)
            if waiter is None:
                continue
            admitted = waiter.admitted
            if outcome.decision is AdmissionDecision.ADMIT:
                admitted = self._start(admitted, now, outcome.waited_s)
                if not waiter.future.done():
                    waiter.future.set_result(admitted)
                continue
            self._refunded(admitted, admitted.request.reserve_tokens)
            work += self._abandon(admitted, now, shed=True)
            delay = self.core.retry.refused(admitted.team, waiter.print_, outcome.retry_after_s,
                                            now)
            error = shed(f"The '{admitted.request.model}' pool is overloaded; "
                         f"'{admitted.request.tier}' requests are being shed "
                         f"({outcome.reason}).").with_headers(retry_after_headers(delay))
            self.record.shed(admitted.team, admitted.request.model, admitted.request.tier)
            if not waiter.future.done():
                waiter.future.set_result(Refused(error, admitted.team, admitted.request.model))

    def _refunded(self, admitted: Admitted, tokens: int) -> None:
        self.record.bucket(admitted.team, admitted.request.model, "refunded", tokens)

    def _count_refusal(self, refused: Refused, priority: str | None) -> None:
        team, model = refused.team or "-", refused.model or "-"
        if refused.error.status == 429:
            self.record.rejected(team, model, refused.error.code)
        elif refused.error.status == 503:
            tier = parse_tier(priority)
            self.record.shed(team, model, tier if isinstance(tier, str) else "-")

    def observe_pools(self) -> None:
        """Set every pool's gauges (queue depth, tokens in flight, capacity): called by the timer
        and before each scrape, not per request."""
        self.record.pools(self.core.pools)

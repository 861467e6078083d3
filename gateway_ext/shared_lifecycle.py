"""The lifecycle of one of several gateway_ext processes sharing one Redis (a region runs several pods).

:class:`SharedLifecycle` is a :class:`~gateway_ext.lifecycle.RequestLifecycle` whose bucket store is awaited (the
asyncio Redis client: no decision blocks the event loop) and whose limits hold across processes:

* ``max_concurrency`` per team x model is counted in Redis by the same script that reserves the
  bucket (a set of open reservation ids scored by expiry, :mod:`gateway_ext.limits.redis_buckets`), so
  it is exact however the requests spread over the processes; every settle, on any process,
  frees the slot. While Redis is down the pool's per-process count decides (fail open).
* a settle that lands on a process that did not admit the request (replicas settle through the
  Service) settles the shared bucket there and is announced on the release channel; the
  admitting process frees its pool slot (tokens in flight) when it hears it
  (:meth:`release_foreign`, idempotent).
* pool capacity is split between the live processes (:func:`~gateway_ext.routing.peers.gateway_share`):
  each admits against its share of every pool, re-split whenever the live count changes.

The version (step 6) is awaited too when ``choose_version`` is given (conversation pins on the
asyncio Redis, :mod:`gateway_ext.routing.async_pins`), between the bucket and
:meth:`~gateway_ext.decision.GatewayCore.conclude`, and only for a request the bucket let through.

Refunds of refused or abandoned reservations run as background tasks (their answer is not
needed); settles of running requests are awaited (their verdict is the replica's answer).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from gateway_ext.decision import Admitted, GatewayCore, Refused
from gateway_ext.lifecycle import RequestLifecycle, UsageReport
from gateway_ext.limits.admission_types import Outcome
from gateway_ext.limits.async_fallback_store import AsyncFallbackBucketStore
from gateway_ext.limits.bucket_store import BucketKey, Concurrency, Settlement, SettleVerdict
from gateway_ext.limits.buckets import Verdict
from gateway_ext.metrics import GatewayMetrics
from gateway_ext.request import ChatRequest
from gateway_ext.routing.peers import GatewayPeers, gateway_share

UNCOUNTED = 1 << 30
"""The pool's concurrency limit when Redis already granted the slot (the local count never binds)."""


class SharedLifecycle(RequestLifecycle):
    """A lifecycle over ``store`` (awaited) and, when given, ``peers`` (release announcements);
    other arguments as :class:`~gateway_ext.lifecycle.RequestLifecycle`."""

    def __init__(self, core: GatewayCore, metrics: GatewayMetrics, clock: Callable[[], float],
                 store: AsyncFallbackBucketStore, peers: GatewayPeers | None = None,
                 choose_version: Callable[[ChatRequest, str], Awaitable[str]] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(core, metrics, clock, **kwargs)
        self.astore = store
        self.peers = peers
        self.choose_version = choose_version
        """Step 6, awaited (the router's pins on the asyncio Redis); None: ``core``'s chooser."""
        self.live_gateways = 1
        self._full = {key: pool.capacity_tokens for key, pool in core.pools.items()}
        self._tasks: set[asyncio.Task[Any]] = set()

    async def _decide(self, headers: Mapping[str, str], body: bytes,
                      now: float) -> Admitted | Refused:
        charge = self.core.prepare(headers, body, now, self.new_id())
        if isinstance(charge, Refused):
            return charge
        rid, tpm = charge.reservation_id, charge.limit.tokens_per_minute
        try:
            counted = await self.astore.reserve(charge.key, tpm, charge.request.reserve_tokens,
                                                rid, now, charge.ttl_s,
                                                charge.limit.max_concurrency)
        except asyncio.CancelledError:  # Envoy gave up on the check: undo what may have landed
            self._refund(charge.key, tpm, rid, now)
            raise
        cap = {Concurrency.GRANTED: UNCOUNTED, Concurrency.REFUSED: 0,
               Concurrency.LOCAL: None}[counted.concurrency]
        charged = (counted.reservation.verdict is Verdict.RESERVED
                   and counted.concurrency is not Concurrency.REFUSED)
        version = None
        if self.choose_version is not None and counted.reservation.verdict is Verdict.RESERVED:
            try:  # past the bucket only: a 429 or a too-large request writes no pin
                version = await self.choose_version(charge.request, charge.team)
            except BaseException:
                if charged:
                    self._refund(charge.key, tpm, rid, now)
                raise
        result = self.core.conclude(charge, counted.reservation, now, cap, version)
        if isinstance(result, Refused) and charged:
            self._refund(charge.key, tpm, rid, now)
        return result

    def _abandon(self, admitted: Admitted, now: float, shed: bool) -> list[Outcome]:
        self._refund(BucketKey(admitted.team, admitted.request.model),
                     admitted.tokens_per_minute, admitted.reservation_id, now)
        return self.core.dropped(admitted, now, shed)

    def _refund(self, key: BucketKey, tokens_per_minute: int, reservation_id: str,
                now: float) -> None:
        """Give a reservation back whole (and its open slot), in the background."""
        task = asyncio.get_running_loop().create_task(
            self.astore.settle(key, tokens_per_minute, reservation_id, 0, now))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def settle_async(self, report: UsageReport) -> Settlement:
        """End a request with its real usage (tokens): settle the shared bucket (which frees the
        open slot); free the pool slot here, or announce the release when another process
        admitted it."""
        now = self.clock()
        rid = report.reservation_id
        used = report.prompt_tokens + report.completion_tokens
        ticket = self._running.pop(rid, None)
        self._ended(rid)
        if ticket is not None:
            admitted = ticket.admitted
            settlement = await self.astore.settle(
                BucketKey(admitted.team, admitted.request.model), admitted.tokens_per_minute,
                rid, used, now)
            now = self.clock()
            self._resolve(self.core.complete(admitted, settlement, report.prompt_tokens,
                                             report.cached_tokens, report.completion_tokens,
                                             now), now)
        else:
            limit = self._foreign_limit(report)
            settlement = Settlement(SettleVerdict.UNKNOWN, 0, 0) if limit is None else \
                await self.astore.settle(BucketKey(report.team, report.model),
                                         limit.tokens_per_minute, rid, used, now)
            self._meter_foreign(report, settlement, now)
            if self.peers is not None:
                await self.peers.announce_release(rid)
        self._record_settled(report, settlement)
        return settlement

    def settle(self, report: UsageReport) -> Settlement:
        """Not here: the store is awaited (:meth:`settle_async`)."""
        raise TypeError("SharedLifecycle settles with 'await settle_async(report)'")

    def release_foreign(self, reservation_id: str) -> None:
        """Another process settled ``reservation_id``: if this process admitted it, free its
        pool slot now (ignored otherwise, and the second time)."""
        ticket = self._running.pop(reservation_id, None)
        if ticket is None:
            return
        self._ended(reservation_id)
        now = self.clock()
        self._resolve(self.core.pools[ticket.admitted.pool].release(reservation_id, now), now)

    def set_capacity(self, pool: str, capacity_tokens: int) -> None:
        """The whole pool's capacity (tokens in flight); this process admits against its share."""
        self._full[pool] = capacity_tokens
        super().set_capacity(pool, gateway_share(capacity_tokens, self.live_gateways))

    def set_live_gateways(self, live: int) -> None:
        """``live`` gateway processes (this one included) now share every pool."""
        live = max(1, live)
        if live == self.live_gateways:
            return
        self.live_gateways = live
        for pool, full in self._full.items():
            if pool in self.core.pools:
                super().set_capacity(pool, gateway_share(full, live))

    def tick(self) -> float | None:
        """:meth:`RequestLifecycle.tick`, and forget local reservations expired 10 minutes ago."""
        deadline = super().tick()
        self.astore.sweep(self.clock() - 600.0)
        return deadline

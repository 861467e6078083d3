"""The asyncio counterpart of :class:`~gateway_ext.limits.fallback_store.FallbackBucketStore`: Redis
buckets and the shared open-request count, failing open to this process's memory.

Same rules as the sync store (see :mod:`gateway_ext.limits.fallback_store`): while the shared store
answers, reservations and the ``max_concurrency`` count live in Redis; after a failed call
(refused, timed out) this process uses its own buckets for ``retry_s`` seconds and the pool's
per-process concurrency count decides (:attr:`~gateway_ext.limits.bucket_store.Concurrency.LOCAL`);
a reservation made in memory is settled in memory; a failed settle of a shared reservation is
dropped (it expires in Redis, counted as fully used, and its open slot expires with it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from gateway_ext.limits.bucket_store import (
    BucketKey,
    Concurrency,
    CountedReservation,
    MemoryBucketStore,
    Settlement,
    SettleVerdict,
)
from gateway_ext.limits.buckets import BucketState, Reservation
from gateway_ext.limits.fail_open import FailOpenWindow
from gateway_ext.limits.fallback_store import StoreErrors


class AsyncSharedStore(Protocol):
    """What :class:`AsyncFallbackBucketStore` needs of the shared store
    (:class:`~gateway_ext.limits.redis_buckets.AsyncRedisBucketStore`)."""

    async def reserve_counted(self, key: BucketKey, tokens_per_minute: int, cost: int,
                              reservation_id: str, now: float, ttl_s: float,
                              max_concurrency: int) -> CountedReservation:
        """Reserve ``cost`` tokens and one open-request slot (see the Redis store)."""
        ...

    async def settle(self, key: BucketKey, tokens_per_minute: int, reservation_id: str,
                     used: int, now: float) -> Settlement:
        """Settle ``reservation_id`` with ``used`` tokens and free its slot."""
        ...

    async def bucket_state(self, key: BucketKey) -> BucketState | None:
        """The stored bucket."""
        ...


class AsyncFallbackBucketStore:
    """Awaitable buckets over ``primary`` that fail open to ``fallback`` for ``retry_s`` seconds
    (``clock`` in seconds) after ``primary`` raises one of ``errors``; ``on_fallback(op)`` once
    per failed call (a metric)."""

    def __init__(self, primary: AsyncSharedStore, errors: StoreErrors,
                 clock: Callable[[], float], retry_s: float = 1.0,
                 fallback: MemoryBucketStore | None = None,
                 on_fallback: Callable[[str], None] = lambda _op: None) -> None:
        self.primary = primary
        self.fallback = fallback if fallback is not None else MemoryBucketStore()
        self.errors = errors
        self.window = FailOpenWindow("per-process buckets and concurrency", clock, retry_s,
                                     on_fallback)
        self._failed = self.window.failed
        self._local: set[str] = set()

    @property
    def degraded(self) -> bool:
        """True while the shared store is being skipped."""
        return self.window.degraded

    async def reserve(self, key: BucketKey, tokens_per_minute: int, cost: int,
                      reservation_id: str, now: float, ttl_s: float,
                      max_concurrency: int) -> CountedReservation:
        """Take ``cost`` tokens from ``key``'s bucket at ``now`` (seconds) for ``ttl_s``
        seconds, and an open-request slot out of ``max_concurrency`` in the shared count; in
        memory (:attr:`Concurrency.LOCAL`) while the shared store is down."""
        if not self.degraded:
            try:
                return await self.primary.reserve_counted(
                    key, tokens_per_minute, cost, reservation_id, now, ttl_s, max_concurrency)
            except self.errors as exc:
                self._failed("reserve", exc)
        self._local.add(reservation_id)
        res: Reservation = self.fallback.reserve(key, tokens_per_minute, cost, reservation_id,
                                                 now, ttl_s)
        return CountedReservation(res, Concurrency.LOCAL)

    async def settle(self, key: BucketKey, tokens_per_minute: int, reservation_id: str,
                     used: int, now: float) -> Settlement:
        """Settle ``reservation_id`` with ``used`` tokens at ``now`` (seconds), where it was
        made; UNKNOWN when the shared store fails."""
        if reservation_id in self._local:
            self._local.discard(reservation_id)
            return self.fallback.settle(key, tokens_per_minute, reservation_id, used, now)
        try:
            return await self.primary.settle(key, tokens_per_minute, reservation_id, used, now)
        except self.errors as exc:
            self._failed("settle", exc)
            return Settlement(SettleVerdict.UNKNOWN, 0, 0)

    def is_local(self, reservation_id: str) -> bool:
        """Whether ``reservation_id`` was reserved in this process's memory."""
        return reservation_id in self._local

    async def bucket_state(self, key: BucketKey) -> BucketState | None:
        """The shared bucket, or the local one while degraded or unreachable."""
        if not self.degraded:
            try:
                return await self.primary.bucket_state(key)
            except self.errors as exc:
                self._failed("bucket_state", exc)
        return self.fallback.bucket_state(key)

    def sweep(self, now: float) -> int:
        """Forget local reservations expired at ``now`` (seconds); returns how many."""
        gone = self.fallback.sweep(now)
        self._local = {rid for rid in self._local if self.fallback.knows(rid)}
        return gone

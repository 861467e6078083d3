"""Redis down: fail open to this process's own buckets (the service's choice; pure, clock injected).

:class:`FallbackBucketStore` uses the shared store (Redis) while it answers. When a call fails
(connection refused, timeout), it switches to an in-memory store for ``retry_s`` seconds, then
tries the shared store again:

* a reservation made in memory is settled in memory (its id is remembered);
* a settle of a shared reservation that fails is dropped: that reservation expires in Redis and
  counts as fully used (never a refund granted twice, at worst a team is charged its whole
  reservation);
* while Redis is down each gateway process enforces every team's full limit on its own, so a
  region of N processes admits up to N x a team's tokens per minute. Admission (pool capacity,
  max_concurrency, guaranteed shares) is local state and stays fully enforced: the GPUs are
  protected, only the fairness between teams loosens.

The service's :class:`~gateway_ext.limits.async_fallback_store.AsyncFallbackBucketStore` follows the
same rules, awaited, and also falls back from the shared ``max_concurrency`` count to the pool's
per-process one; this synchronous store serves the simulator and the benchmark.

Why open: the buckets protect teams from each other, not the fleet from overload. Failing closed
would turn a Redis outage into a full API outage for every team; the seed asks the platform to
keep serving when a dependency (the control plane) is down, and Envoy's own rate-limit service
fails open by default for the same reason.
"""

from __future__ import annotations

from collections.abc import Callable

from gateway_ext.limits.bucket_store import (
    BucketKey,
    BucketStore,
    MemoryBucketStore,
    Settlement,
    SettleVerdict,
)
from gateway_ext.limits.buckets import BucketState, Reservation
from gateway_ext.limits.fail_open import FailOpenWindow

StoreErrors = tuple[type[BaseException], ...]


class FallbackBucketStore:
    """A :class:`~gateway_ext.limits.bucket_store.BucketStore` over ``primary`` that fails open to
    ``fallback`` for ``retry_s`` seconds (``clock`` in seconds) whenever ``primary`` raises one of
    ``errors``; ``on_fallback`` is called once per failed call (a metric)."""

    def __init__(self, primary: BucketStore, errors: StoreErrors, clock: Callable[[], float],
                 retry_s: float = 1.0, fallback: MemoryBucketStore | None = None,
                 on_fallback: Callable[[str], None] = lambda _op: None) -> None:
        self.primary = primary
        self.fallback = fallback if fallback is not None else MemoryBucketStore()
        self.errors = errors
        self.window = FailOpenWindow("per-process buckets", clock, retry_s, on_fallback)
        self._failed = self.window.failed
        self._local: set[str] = set()

    @property
    def degraded(self) -> bool:
        """True while the shared store is being skipped."""
        return self.window.degraded

    def reserve(self, key: BucketKey, tokens_per_minute: int, cost: int, reservation_id: str,
                now: float, ttl_s: float) -> Reservation:
        """See :meth:`~gateway_ext.limits.bucket_store.BucketStore.reserve`."""
        if not self.degraded:
            try:
                return self.primary.reserve(key, tokens_per_minute, cost, reservation_id, now,
                                            ttl_s)
            except self.errors as exc:
                self._failed("reserve", exc)
        self._local.add(reservation_id)
        return self.fallback.reserve(key, tokens_per_minute, cost, reservation_id, now, ttl_s)

    def settle(self, key: BucketKey, tokens_per_minute: int, reservation_id: str, used: int,
               now: float) -> Settlement:
        """See :meth:`~gateway_ext.limits.bucket_store.BucketStore.settle`; a reservation made in
        memory is settled there."""
        if reservation_id in self._local:
            self._local.discard(reservation_id)
            return self.fallback.settle(key, tokens_per_minute, reservation_id, used, now)
        try:
            return self.primary.settle(key, tokens_per_minute, reservation_id, used, now)
        except self.errors as exc:
            self._failed("settle", exc)
            return Settlement(SettleVerdict.UNKNOWN, 0, 0)

    def bucket_state(self, key: BucketKey) -> BucketState | None:
        """The shared bucket, or the local one while degraded or unreachable."""
        if not self.degraded:
            try:
                return self.primary.bucket_state(key)
            except self.errors as exc:
                self._failed("bucket_state", exc)
        return self.fallback.bucket_state(key)

    def sweep(self, now: float) -> int:
        """Forget local reservations expired at ``now`` (seconds); returns how many."""
        gone = self.fallback.sweep(now)
        self._local = {rid for rid in self._local if self.fallback.knows(rid)}
        return gone

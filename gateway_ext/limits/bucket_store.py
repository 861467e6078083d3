"""Where token buckets and reservations live: one interface, an in-memory backend (the local
default, one process) and a Redis backend (:mod:`gateway_ext.limits.redis_buckets`, one bucket per
team x model shared by every gateway_ext process of a region).

Both run the maths of :mod:`gateway_ext.limits.buckets`; the store adds reservation records:

* ``reserve`` with a ``reservation_id`` already recorded charges nothing again and answers
  RESERVED (a retried call is idempotent);
* a reservation expires ``ttl_s`` seconds after it was made; an expired one is treated as fully
  used, so settling it changes nothing (:attr:`SettleVerdict.EXPIRED`);
* ``settle`` is idempotent by reservation id: a second settle is :attr:`SettleVerdict.DUPLICATE`
  and refunds nothing.

Time is always passed in (``now``, seconds) so that tests and the simulator drive a fake clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from gateway_ext.limits.buckets import (
    BucketState,
    Reservation,
    Verdict,
    check_limit,
    refill,
    reserve,
    reset_ms,
    settle,
    to_ms,
)


@dataclass(frozen=True, slots=True, order=True)
class BucketKey:
    """The bucket of ``team`` on ``model`` (a model name, every version shares it)."""

    team: str
    model: str


class SettleVerdict(StrEnum):
    """Result of a settle."""

    SETTLED = "settled"
    DUPLICATE = "duplicate"
    EXPIRED = "expired"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Settlement:
    """A settle's result: ``reserved_tokens`` of the reservation (0 if unknown) and
    ``remaining_tokens`` in the bucket afterwards (tokens)."""

    verdict: SettleVerdict
    reserved_tokens: int
    remaining_tokens: int


class Concurrency(StrEnum):
    """What a shared open-request count said of a reservation: it holds a slot (``granted``), the
    team is at its ``max_concurrency`` (``refused``, nothing charged), or nothing shared counted it
    (``local``: the pool's own per-process count decides)."""

    GRANTED = "granted"
    REFUSED = "refused"
    LOCAL = "local"


@dataclass(frozen=True, slots=True)
class CountedReservation:
    """A bucket reservation and the open-request count's answer (see :class:`Concurrency`)."""

    reservation: Reservation
    concurrency: Concurrency


def reservation_ttl_s(max_output_tokens: int, slowest_tokens_per_s: float = 10.0,
                      margin_s: float = 180.0) -> float:
    """Seconds a reservation lives unsettled: the longest stream of ``max_output_tokens`` tokens at
    ``slowest_tokens_per_s`` tokens per second, plus ``margin_s`` seconds for queueing and prefill."""
    return max_output_tokens / slowest_tokens_per_s + margin_s


class BucketStore(Protocol):
    """Token buckets per team x model with reservation records."""

    def reserve(self, key: BucketKey, tokens_per_minute: int, cost: int, reservation_id: str,
                now: float, ttl_s: float) -> Reservation:
        """Take ``cost`` tokens from ``key``'s bucket (capacity ``tokens_per_minute``) at ``now``
        (seconds); on success record ``reservation_id`` for ``ttl_s`` seconds."""
        ...

    def settle(self, key: BucketKey, tokens_per_minute: int, reservation_id: str, used: int,
               now: float) -> Settlement:
        """Settle ``reservation_id`` with ``used`` tokens at ``now`` (seconds): refund or charge
        the difference, at most once."""
        ...

    def bucket_state(self, key: BucketKey) -> BucketState | None:
        """The stored state of ``key``'s bucket (None: never used or expired, i.e. full)."""
        ...


@dataclass(slots=True)
class _Record:
    key: BucketKey
    tokens: int
    expires_ms: int
    settled: bool = False


class MemoryBucketStore:
    """Buckets and reservations in this process's memory. Not thread-safe: call it from one
    thread (the service's event loop, or the simulator)."""

    def __init__(self) -> None:
        self._buckets: dict[BucketKey, BucketState] = {}
        self._records: dict[str, _Record] = {}

    def reserve(self, key: BucketKey, tokens_per_minute: int, cost: int, reservation_id: str,
                now: float, ttl_s: float) -> Reservation:
        """See :meth:`BucketStore.reserve`."""
        check_limit(tokens_per_minute)
        now_ms = to_ms(now)
        state = self._buckets.get(key)
        record = self._records.get(reservation_id)
        if record is not None and record.key == key:
            view = refill(state, tokens_per_minute, now_ms)
            return Reservation(Verdict.RESERVED, tokens_per_minute, view.tokens, 0,
                               reset_ms(view, tokens_per_minute))
        new, result = reserve(state, tokens_per_minute, cost, now_ms)
        if result.verdict is Verdict.RESERVED and new is not None:
            self._buckets[key] = new
            self._records[reservation_id] = _Record(key, cost, now_ms + to_ms(ttl_s))
        return result

    def settle(self, key: BucketKey, tokens_per_minute: int, reservation_id: str, used: int,
               now: float) -> Settlement:
        """See :meth:`BucketStore.settle`."""
        check_limit(tokens_per_minute)
        now_ms = to_ms(now)
        state = self._buckets.get(key)
        record = self._records.get(reservation_id)
        if record is None or record.key != key:
            return Settlement(SettleVerdict.UNKNOWN, 0,
                              refill(state, tokens_per_minute, now_ms).tokens)
        if record.settled or now_ms >= record.expires_ms:
            verdict = SettleVerdict.DUPLICATE if record.settled else SettleVerdict.EXPIRED
            return Settlement(verdict, record.tokens,
                              refill(state, tokens_per_minute, now_ms).tokens)
        new = settle(state, tokens_per_minute, record.tokens, used, now_ms)
        self._buckets[key] = new
        record.settled = True
        return Settlement(SettleVerdict.SETTLED, record.tokens, new.tokens)

    def bucket_state(self, key: BucketKey) -> BucketState | None:
        """See :meth:`BucketStore.bucket_state`."""
        return self._buckets.get(key)

    def knows(self, reservation_id: str) -> bool:
        """Whether ``reservation_id`` is recorded (made and not swept yet)."""
        return reservation_id in self._records

    def sweep(self, now: float) -> int:
        """Forget reservations expired at ``now`` (seconds); returns how many."""
        now_ms = to_ms(now)
        gone = [rid for rid, r in self._records.items() if now_ms >= r.expires_ms]
        for rid in gone:
            del self._records[rid]
        return len(gone)

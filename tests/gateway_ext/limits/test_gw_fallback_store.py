"""Fail open: while the shared bucket store fails, per-process buckets; back to it after retry_s."""

from __future__ import annotations

from gateway_ext.limits.bucket_store import BucketKey, MemoryBucketStore, Settlement, SettleVerdict
from gateway_ext.limits.buckets import BucketState, Reservation, Verdict
from gateway_ext.limits.fallback_store import FallbackBucketStore

KEY = BucketKey("search", "chat-7b")


class Flaky(MemoryBucketStore):
    """A shared store that raises ConnectionError while ``down``."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False

    def reserve(self, key: BucketKey, tokens_per_minute: int, cost: int, reservation_id: str,
                now: float, ttl_s: float) -> Reservation:
        if self.down:
            raise ConnectionError("refused")
        return super().reserve(key, tokens_per_minute, cost, reservation_id, now, ttl_s)

    def settle(self, key: BucketKey, tokens_per_minute: int, reservation_id: str, used: int,
               now: float) -> Settlement:
        if self.down:
            raise ConnectionError("refused")
        return super().settle(key, tokens_per_minute, reservation_id, used, now)

    def bucket_state(self, key: BucketKey) -> BucketState | None:
        if self.down:
            raise ConnectionError("refused")
        return super().bucket_state(key)


def test_fails_open_then_returns_to_the_shared_store() -> None:
    clock = [0.0]
    shared = Flaky()
    failures: list[str] = []
    store = FallbackBucketStore(shared, (ConnectionError,), lambda: clock[0], retry_s=1.0,
                                on_fallback=failures.append)
    assert store.reserve(KEY, 1000, 100, "a", 0.0, 60).verdict is Verdict.RESERVED
    shared.down = True
    assert store.reserve(KEY, 1000, 100, "b", 0.0, 60).verdict is Verdict.RESERVED  # local
    assert store.degraded and failures == ["reserve"]
    assert store.reserve(KEY, 1000, 901, "c", 0.0, 60).verdict is Verdict.DENIED  # local limit
    assert failures == ["reserve"]  # no second try within retry_s
    # settling the shared reservation while down: dropped (it will expire, fully charged)
    assert store.settle(KEY, 1000, "a", 0, 0.1).verdict is SettleVerdict.UNKNOWN
    shared.down = False
    clock[0] = 1.5
    assert store.settle(KEY, 1000, "b", 10, 1.5).verdict is SettleVerdict.SETTLED  # in memory
    assert store.reserve(KEY, 1000, 100, "d", 1.5, 60).verdict is Verdict.RESERVED
    assert not store.degraded and shared.knows("d") and not shared.knows("b")
    assert store.bucket_state(KEY) == shared.bucket_state(KEY)
    assert store.sweep(1000.0) == 1  # the expired local record ("b") is forgotten

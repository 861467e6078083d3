"""Bucket stores: one table through the memory store (the pure maths) and the Redis Lua script,
a random sequence compared step by step, idempotent settle, expiry, and one limit enforced
exactly across two processes."""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio

from gateway_ext.limits.bucket_store import BucketKey, BucketStore, MemoryBucketStore, SettleVerdict
from gateway_ext.limits.buckets import UNITS_PER_TOKEN, Verdict
from gateway_ext.limits.redis_buckets import AsyncRedisBucketStore, RedisBucketStore

TPM = 600  # 10 tokens per second
TTL_S = 120.0
KEY = BucketKey("team-a", "chat-7b")
R, D, T = Verdict.RESERVED, Verdict.DENIED, Verdict.TOO_LARGE
S, DUP, EXP, UNK = (SettleVerdict.SETTLED, SettleVerdict.DUPLICATE, SettleVerdict.EXPIRED,
                    SettleVerdict.UNKNOWN)

# (op, now s, reservation id, tokens, expected)
#   reserve -> (verdict, remaining tokens, retry_after ms, reset ms)
#   settle  -> (verdict, reserved tokens, remaining tokens)
TABLE: list[tuple[str, float, str, int, tuple[object, ...]]] = [
    ("reserve", 0, "r1", 500, (R, 100, 0, 50_000)),
    ("reserve", 0, "r2", 200, (D, 100, 10_000, 50_000)),          # over the limit: exact wait
    ("reserve", 9.999, "r2", 200, (D, 199, 1, 40_001)),           # 1 ms early
    ("reserve", 10, "r2", 200, (R, 0, 0, 60_000)),                # on time
    ("settle", 10, "r1", 300, (S, 500, 200)),                     # refund 200
    ("settle", 10, "r1", 0, (DUP, 500, 200)),                     # settling twice refunds nothing
    ("settle", 11, "r2", 500, (S, 200, 0)),                       # overcharge: 210 - 300 = -90
    ("reserve", 11, "r3", 1, (D, 0, 9_100, 69_000)),              # the debt is repaid first
    ("reserve", 20.1, "r3", 1, (R, 0, 0, 60_000)),
    ("reserve", 20.1, "r3", 1, (R, 0, 0, 60_000)),                # same id again: no charge
    ("reserve", 20.1, "r4", 601, (T, 0, 0, 60_000)),              # larger than the bucket
    ("reserve", 20.1, "r5", 600, (D, 0, 60_000, 60_000)),
    ("settle", 30, "nope", 5, (UNK, 0, 99)),
    ("settle", 30, "r3", 0, (S, 1, 100)),
    ("reserve", 100, "r6", 600, (R, 0, 0, 60_000)),               # refilled to full by then
    ("reserve", 200, "r7", 600, (R, 0, 0, 60_000)),
    ("settle", 220, "r6", 0, (EXP, 600, 200)),                    # expired: treated as used
    ("settle", 230, "r7", 0, (S, 600, 600)),                      # refund capped at capacity
    ("reserve", 229, "r8", 1, (R, 599, 0, 100)),                  # a clock behind: no refill
]


@pytest.fixture(params=["memory", "redis"])
def store(request: pytest.FixtureRequest) -> Iterator[BucketStore]:
    if request.param == "memory":
        yield MemoryBucketStore()
        return
    client: redis.Redis = request.getfixturevalue("redis_client")
    yield RedisBucketStore(client, prefix=request.getfixturevalue("redis_prefix"))


def run_step(store: BucketStore, op: str, now: float, rid: str, amount: int) -> tuple[object, ...]:
    if op == "reserve":
        r = store.reserve(KEY, TPM, amount, rid, now, TTL_S)
        assert r.limit_tokens == TPM
        return (r.verdict, r.remaining_tokens, r.retry_after_ms, r.reset_ms)
    s = store.settle(KEY, TPM, rid, amount, now)
    return (s.verdict, s.reserved_tokens, s.remaining_tokens)


def test_the_bucket_table(store: BucketStore) -> None:
    got = [run_step(store, op, now, rid, amount) for op, now, rid, amount, _ in TABLE]
    assert got == [row[4] for row in TABLE]
    state = store.bucket_state(KEY)
    assert state is not None and state.level == 599 * UNITS_PER_TOKEN and state.updated_ms == 230_000


def test_settle_on_another_bucket_is_unknown(store: BucketStore) -> None:
    store.reserve(KEY, TPM, 100, "r1", 0, TTL_S)
    other = BucketKey("team-b", "chat-7b")
    assert store.settle(other, TPM, "r1", 0, 1).verdict is SettleVerdict.UNKNOWN
    assert store.settle(KEY, TPM, "r1", 0, 1).verdict is SettleVerdict.SETTLED


def test_buckets_are_per_team_and_model(store: BucketStore) -> None:
    assert store.reserve(KEY, TPM, 600, "a", 0, TTL_S).verdict is Verdict.RESERVED
    assert store.reserve(KEY, TPM, 1, "b", 0, TTL_S).verdict is Verdict.DENIED
    for key in (BucketKey("team-b", "chat-7b"), BucketKey("team-a", "reason-70b")):
        assert store.reserve(key, TPM, 600, "c", 0, TTL_S).verdict is Verdict.RESERVED


def test_redis_runs_the_same_maths_as_memory_step_by_step(redis_client: redis.Redis,
                                                           redis_prefix: str) -> None:
    rng = random.Random(7)
    mem, red = MemoryBucketStore(), RedisBucketStore(redis_client, prefix=redis_prefix)
    now, ids = 1_700_000_000.0, ["r0"]
    for i in range(1500):
        now += rng.choice([0, 0, 0.001, 0.013, 0.5, 2.0, 7.3, 45.0]) - (0.2 if i % 97 == 0 else 0)
        tpm = rng.choice([600, 600, 599, 7, 6_000_000, 10**10])
        a: tuple[object, ...]
        b: tuple[object, ...]
        if rng.random() < 0.6:
            rid = f"r{i}" if rng.random() < 0.9 else rng.choice(ids)
            ids.append(rid)
            cost = rng.choice([1, rng.randint(1, 700), rng.randint(1, 10**6)])
            ttl = rng.choice([5.0, 60.0])
            a = mem.reserve(KEY, tpm, cost, rid, now, ttl), mem.bucket_state(KEY)
            b = red.reserve(KEY, tpm, cost, rid, now, ttl), red.bucket_state(KEY)
        else:
            rid, used = rng.choice(ids), rng.randint(0, 10**6)
            a = mem.settle(KEY, tpm, rid, used, now), mem.bucket_state(KEY)
            b = red.settle(KEY, tpm, rid, used, now), red.bucket_state(KEY)
        assert a == b, (i, a, b)


def test_the_async_redis_store_runs_the_table(redis_url: str, redis_prefix: str) -> None:
    async def run() -> list[tuple[object, ...]]:
        client = redis.asyncio.Redis.from_url(redis_url)
        store = AsyncRedisBucketStore(client, prefix=redis_prefix)
        out: list[tuple[object, ...]] = []
        try:
            for op, now, rid, amount, _ in TABLE:
                if op == "reserve":
                    r = await store.reserve(KEY, TPM, amount, rid, now, TTL_S)
                    out.append((r.verdict, r.remaining_tokens, r.retry_after_ms, r.reset_ms))
                else:
                    s = await store.settle(KEY, TPM, rid, amount, now)
                    out.append((s.verdict, s.reserved_tokens, s.remaining_tokens))
            state = await store.bucket_state(KEY)
            assert state is not None and state.updated_ms == 230_000
        finally:
            await client.aclose()
        return out

    assert asyncio.run(run()) == [row[4] for row in TABLE]


def test_redis_keys_expire_for_garbage_collection(redis_client: redis.Redis,
                                                  redis_prefix: str) -> None:
    store = RedisBucketStore(redis_client, prefix=redis_prefix, gc_grace_ms=1_000)
    store.reserve(KEY, TPM, 300, "r1", 0, 2.0)
    keys = sorted(k.decode() for k in redis_client.scan_iter(match=f"{redis_prefix}:*"))
    assert keys == [f"{redis_prefix}:bucket:{{team-a:chat-7b}}",
                    f"{redis_prefix}:resv:{{team-a:chat-7b}}:r1"]
    bucket_ttl, resv_ttl = (redis_client.pttl(k) for k in keys)
    assert 30_000 < bucket_ttl <= 31_000  # until full again (30 s) + grace
    assert 2_000 < resv_ttl <= 3_000      # reservation ttl + grace


def test_one_limit_holds_exactly_across_two_processes(redis_client: redis.Redis, redis_url: str,
                                                      redis_prefix: str) -> None:
    tpm, now = 20_000, 1_700_000_000.0
    script = Path(__file__).with_name("gw_hammer.py")
    procs = [subprocess.Popen([sys.executable, str(script), redis_url, redis_prefix, str(tpm),
                               str(cost), "100000", str(now), f"w{cost}"],
                              stdout=subprocess.PIPE, text=True)
             for cost in (7, 13)]
    redis_client.set(f"{redis_prefix}:go", 1)
    totals = []
    for proc in procs:
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0
        totals.append(json.loads(out)["admitted_tokens"])
    total = sum(totals)
    assert all(t > 0 for t in totals), totals  # both really competed
    assert tpm - 7 < total <= tpm  # the 7-token worker stops only once fewer than 7 are left
    state = RedisBucketStore(redis_client, prefix=redis_prefix).bucket_state(
        BucketKey("team", "model"))
    assert state is not None and state.level == (tpm - total) * UNITS_PER_TOKEN  # no lost update

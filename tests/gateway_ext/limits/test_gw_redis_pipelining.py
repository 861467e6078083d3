"""Auto-pipelining of script calls (gateway_ext.limits.redis_pipelining) on the real Redis: calls in
flight together share one round trip and each gets its own reply; errors stay per call."""

from __future__ import annotations

import asyncio

import pytest
import redis
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from gateway_ext.limits.bucket_store import BucketKey
from gateway_ext.limits.buckets import Verdict
from gateway_ext.limits.redis_buckets import AsyncRedisBucketStore
from gateway_ext.limits.redis_pipelining import ScriptPipeline

INCR = "return redis.call('INCRBY', KEYS[1], ARGV[1])"
FAIL = "return redis.error_reply('ERR refused by the script')"


async def test_calls_in_flight_together_share_one_pipeline(redis_url: str,
                                                          redis_prefix: str) -> None:
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        script = client.register_script(INCR)
        pipe = ScriptPipeline(client)
        key = f"{redis_prefix}:n"
        replies = await asyncio.gather(*(pipe.call(script, [key], [i]) for i in range(1, 41)))
        # one pipeline, run in the order issued: each reply is the running sum
        assert pipe.pipelines == 1
        assert replies == [i * (i + 1) // 2 for i in range(1, 41)]
        # a lone call goes out on its own
        assert await pipe.call(script, [key], [1]) == 821
        assert pipe.pipelines == 1
    finally:
        await client.aclose()


async def test_a_script_error_fails_only_its_caller(redis_url: str, redis_prefix: str) -> None:
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        good, bad = client.register_script(INCR), client.register_script(FAIL)
        pipe = ScriptPipeline(client)
        key = f"{redis_prefix}:n"
        results = await asyncio.gather(pipe.call(good, [key], [2]), pipe.call(bad, [key], []),
                                       pipe.call(good, [key], [3]), return_exceptions=True)
        assert results[0] == 2 and results[2] == 5
        assert isinstance(results[1], redis.ResponseError)
        assert "refused by the script" in str(results[1])
    finally:
        await client.aclose()


async def test_a_server_that_lost_its_scripts_gets_them_again(redis_url: str,
                                                             redis_prefix: str) -> None:
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        script = client.register_script(INCR + " -- flushed")
        pipe = ScriptPipeline(client)
        key = f"{redis_prefix}:n"
        assert await pipe.call(script, [key], [1]) == 1  # loaded on first use
        await client.script_flush()  # as after a restart or a failover
        again = await asyncio.gather(pipe.call(script, [key], [1]), pipe.call(script, [key], [1]))
        assert list(again) == [2, 3]
    finally:
        await client.aclose()


async def test_a_lost_connection_fails_every_call_of_the_batch() -> None:
    client = redis.asyncio.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5,
                                 retry=Retry(NoBackoff(), 0))
    try:
        pipe = ScriptPipeline(client)
        script = client.register_script(INCR)
        results = await asyncio.gather(*(pipe.call(script, ["k"], [1]) for _ in range(3)),
                                       return_exceptions=True)
        assert all(isinstance(r, (redis.ConnectionError, OSError)) for r in results)
    finally:
        await client.aclose()


async def test_the_async_store_keeps_its_answers_when_pipelined(redis_url: str,
                                                               redis_prefix: str) -> None:
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        store = AsyncRedisBucketStore(client, prefix=redis_prefix)
        key = BucketKey("search", "chat-7b")
        # 60,000 tokens per minute: a full bucket holds 60,000; 7 x 10,000 fit 6 times
        got = await asyncio.gather(*(store.reserve(key, 60_000, 10_000, f"r{i}", 100.0, 60.0)
                                     for i in range(7)))
        assert [r.verdict for r in got] == [Verdict.RESERVED] * 6 + [Verdict.DENIED]
        assert store.pipeline.pipelines == 1
        assert got[-1].retry_after_s == pytest.approx(10.0, abs=0.01)  # 10,000 at 1,000/s
    finally:
        await client.aclose()

"""Gateway decisions per second and decision latency on one core: parse + key lookup + bucket
reserve + admission (:meth:`gateway_ext.decision.GatewayCore.decide`), with the Redis bucket store
and, as the baseline in the same run, the memory store. Prints figures; never fails on a time.

``redis-async`` is the service's own path with Redis (:class:`gateway_ext.shared_lifecycle.SharedLifecycle`):
``prepare``, the awaited reservation on the asyncio client (bucket and the shared max_concurrency
count in one script, through the fail-open store), ``conclude``; ``redis`` is the synchronous store
the simulator uses.

Each decision is timed alone; the request is then finished (settle + release, untimed) so the
buckets and pools stay in a steady state. The clock is a counter advancing 10 ms per request. Two workloads: ``chat`` (conversations whose
history grows turn by turn, so the prompt-token memo finds most messages) and ``cold`` (every prompt
new: the simulated tokenizer's regex runs over all ~1,200 tokens).

    python benchmarks/bench_gateway_decisions.py [--requests N] [--redis-url URL] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

import redis
import redis.asyncio

from gateway_ext.decision import Admitted, GatewayCore, Refused
from gateway_ext.limits.admission import PoolAdmission, pool_capacity_tokens
from gateway_ext.limits.async_fallback_store import AsyncFallbackBucketStore
from gateway_ext.limits.bucket_store import BucketKey, BucketStore, Concurrency, MemoryBucketStore
from gateway_ext.limits.redis_buckets import AsyncRedisBucketStore, RedisBucketStore
from gateway_ext.limits.retry_budget import RetryBudget
from gateway_ext.metering.meter import UsageMeter
from gateway_ext.prompt_tokens import BytesEstimator
from modelfleet.config import PlatformConfig, load_config
from modelfleet.contract.headers import CONVERSATION_HEADER, PRIORITY_HEADER

REPO = Path(__file__).resolve().parents[1]
KEYS = ("mf-dev-search-0000000000000001", "mf-dev-support-000000000000002",
        "mf-dev-research-00000000000003")
TIERS = ("interactive", "standard", "standard")
CONVERSATIONS = 400
STEP_S = 0.01
"""Simulated seconds between requests: 100 requests/s, inside the three teams' token limits."""


def words(rng: random.Random, n: int) -> str:
    """``n`` words with some punctuation: about 1.2 simulated tokens per word."""
    return " ".join(f"word{rng.randrange(5000)}" + ("," if rng.random() < 0.2 else "")
                    for _ in range(n))


def request(i: int, messages: list[dict[str, str]]) -> tuple[dict[str, str], bytes]:
    """Headers and body of request ``i`` (teams in turn) with ``messages``."""
    team = i % 3
    body = json.dumps({"model": "chat-7b", "messages": messages, "max_tokens": 200,
                       "stream": True}).encode()
    headers = {"authorization": f"Bearer {KEYS[team]}", PRIORITY_HEADER: TIERS[team],
               CONVERSATION_HEADER: f"conv-{i % CONVERSATIONS}",
               "content-type": "application/json"}
    return headers, body


def chat_workload(n: int, seed: int = 1) -> list[tuple[dict[str, str], bytes]]:
    """``n`` turns of ``CONVERSATIONS`` chats: a system prompt, then the history grows by a user
    message (40-120 words) and an answer (100-200 words) per turn, and restarts past ~2,400
    prompt tokens (about 1,200 on average, the seed's figure)."""
    rng = random.Random(seed)
    system = [{"role": "system", "content": words(rng, 150)} for _ in range(3)]
    history: list[list[dict[str, str]]] = [[] for _ in range(CONVERSATIONS)]
    out = []
    for i in range(n):
        conv = history[i % CONVERSATIONS]
        if sum(len(m["content"]) for m in conv) > 2_400 * 6:  # ~6 characters per token here
            conv.clear()
        conv.append({"role": "user", "content": words(rng, rng.randrange(40, 120))})
        out.append(request(i, [system[i % 3], *conv]))
        conv.append({"role": "assistant", "content": words(rng, rng.randrange(100, 200))})
    return out


def cold_workload(n: int, seed: int = 2) -> list[tuple[dict[str, str], bytes]]:
    """``n`` unique one-message prompts of about 1,200 tokens: nothing to reuse."""
    rng = random.Random(seed)
    return [request(i, [{"role": "user", "content": words(rng, 1000)}]) for i in range(n)]


def make_core(config: PlatformConfig, store: BucketStore, estimator: str) -> GatewayCore:
    """A core over ``store`` with 12 replicas per pool."""
    pools = {v.key: PoolAdmission(pool_capacity_tokens(v.capacity.tokens_in_flight, 12))
             for v in config.versions}
    return GatewayCore(config, store, pools, RetryBudget(random.Random(0)), UsageMeter("bench"),
                       default_estimator=BytesEstimator() if estimator == "bytes" else None)


def run(config: PlatformConfig, store: BucketStore, requests: list[tuple[dict[str, str], bytes]],
        estimator: str = "chatml") -> dict[str, Any]:
    """Decide on every request with ``store``; returns throughput and latency figures."""
    core = make_core(config, store, estimator)
    now = time.time()
    latencies: list[float] = []
    outcomes: dict[str, int] = {}
    for headers, body in requests:
        now += STEP_S
        start = time.perf_counter()
        result = core.decide(headers, body, now, uuid.uuid4().hex)
        latencies.append(time.perf_counter() - start)
        if isinstance(result, Admitted):
            core.finish(result, result.request.prompt_tokens, 0, 120, now)
        _count(outcomes, result)
    return _figures(latencies, outcomes)


async def run_async(config: PlatformConfig, client: redis.asyncio.Redis, prefix: str,
                    requests: list[tuple[dict[str, str], bytes]], estimator: str = "chatml",
                    in_flight: int = 32) -> dict[str, Any]:
    """The service's path: ``prepare``, the awaited reservation with the shared open-request
    count (fail-open store on the asyncio client), ``conclude``; then settle (untimed). Timed one
    at a time (latency), then ``in_flight`` decisions at once on the loop (``loop_decisions_per_s``:
    wall-clock throughput of the event loop, settles included, with a second key prefix)."""
    caps = {Concurrency.GRANTED: 1 << 30, Concurrency.REFUSED: 0, Concurrency.LOCAL: None}

    def setup(tag: str) -> tuple[AsyncFallbackBucketStore, GatewayCore]:
        store = AsyncFallbackBucketStore(AsyncRedisBucketStore(client, prefix=prefix + tag),
                                         (redis.RedisError, OSError), time.monotonic)
        return store, make_core(config, store.fallback, estimator)

    async def one(store: AsyncFallbackBucketStore, core: GatewayCore, headers: dict[str, str],
                  body: bytes, now: float) -> tuple[float, Admitted | Refused]:
        start = time.perf_counter()
        charge = core.prepare(headers, body, now, uuid.uuid4().hex)
        result: Admitted | Refused
        if isinstance(charge, Refused):
            result = charge
        else:
            counted = await store.reserve(charge.key, charge.limit.tokens_per_minute,
                                          charge.request.reserve_tokens, charge.reservation_id,
                                          now, charge.ttl_s, charge.limit.max_concurrency)
            result = core.conclude(charge, counted.reservation, now, caps[counted.concurrency])
        elapsed = time.perf_counter() - start
        if isinstance(result, Admitted):
            used = result.request.prompt_tokens + 120
            settled = await store.settle(BucketKey(result.team, result.request.model),
                                         result.tokens_per_minute, result.reservation_id, used,
                                         now)
            core.complete(result, settled, result.request.prompt_tokens, 0, 120, now)
        return elapsed, result

    store, core = setup("")
    base = time.time()
    latencies: list[float] = []
    outcomes: dict[str, int] = {}
    for i, (headers, body) in enumerate(requests):
        elapsed, result = await one(store, core, headers, body, base + (i + 1) * STEP_S)
        latencies.append(elapsed)
        _count(outcomes, result)
    store, core = setup("-loop")
    work = iter(enumerate(requests))

    async def worker() -> None:
        for i, (headers, body) in work:
            await one(store, core, headers, body, base + (i + 1) * STEP_S)

    wall = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(in_flight)))
    wall = time.perf_counter() - wall
    await client.aclose()
    return {**_figures(latencies, outcomes), "loop_decisions_per_s": round(len(requests) / wall)}


def _count(outcomes: dict[str, int], result: Admitted | Refused) -> None:
    label = (str(result.outcome.decision) if isinstance(result, Admitted)
             else f"{result.error.status} {result.error.code}")
    outcomes[label] = outcomes.get(label, 0) + 1


def _figures(latencies: list[float], outcomes: dict[str, int]) -> dict[str, Any]:
    busy = sum(latencies)
    latencies.sort()
    return {
        "decisions": len(latencies),
        "decisions_per_s": round(len(latencies) / busy),
        "p50_ms": round(statistics.median(latencies) * 1000, 3),
        "p99_ms": round(latencies[int(len(latencies) * 0.99) - 1] * 1000, 3),
        "max_ms": round(latencies[-1] * 1000, 3),
        "outcomes": outcomes,
    }


def main() -> None:
    """Parse arguments, pin to one core, run each workload on memory then Redis, print figures."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=10_000, help="decisions per run")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--cpu", type=int, default=0, help="the core to pin this process to")
    parser.add_argument("--estimator", choices=("chatml", "bytes"), default="chatml",
                        help="prompt-token estimator: the simulated tokenizer (memoised per "
                             "message) or the tokenizer-free byte bound")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {args.cpu})
    config = load_config(REPO / "config").config
    client = redis.Redis.from_url(args.redis_url)
    prefix = f"mf-bench-{uuid.uuid4().hex[:8]}"
    results: dict[str, Any] = {"requests": args.requests, "cpu": args.cpu,
                               "estimator": args.estimator}
    run(config, MemoryBucketStore(), cold_workload(500))  # warm-up
    try:
        for name, make in (("chat", chat_workload), ("cold", cold_workload)):
            requests = make(args.requests)
            results[f"{name}/memory"] = run(config, MemoryBucketStore(), requests, args.estimator)
            try:
                client.ping()
                store = RedisBucketStore(client, prefix=f"{prefix}-{name}")
                results[f"{name}/redis"] = run(config, store, requests, args.estimator)
                results[f"{name}/redis-async"] = asyncio.run(run_async(
                    config, redis.asyncio.Redis.from_url(args.redis_url),
                    f"{prefix}-{name}-async", requests, args.estimator))
            except redis.RedisError as exc:
                results[f"{name}/redis"] = {"error": f"Redis at {args.redis_url}: {exc}"}
    finally:
        keys = list(client.scan_iter(match=f"{prefix}-*", count=1000))
        for i in range(0, len(keys), 1000):
            client.delete(*keys[i:i + 1000])
    if args.json:
        print(json.dumps(results))
        return
    print(f"gateway decisions on one core (cpu {args.cpu}), {args.requests} requests per run, "
          f"{args.estimator} estimator")
    for name, r in results.items():
        if not isinstance(r, dict):
            continue
        if "error" in r:
            print(f"  {name:17} {r['error']}")
            continue
        loop = r.get("loop_decisions_per_s")
        print(f"  {name:17} {r['decisions_per_s']:>7,} decisions/s   p50 {r['p50_ms']:.3f} ms   "
              f"p99 {r['p99_ms']:.3f} ms   max {r['max_ms']:.3f} ms   {r['outcomes']}"
              + (f"   event loop, 32 in flight: {loop:,} decisions/s" if loop else ""))
    print("  goal with Redis: >= 2,000 decisions/s, p99 <= 3 ms")


if __name__ == "__main__":
    main()

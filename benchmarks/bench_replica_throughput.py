"""Throughput of one simulated replica over real HTTP at its load-tested concurrency.

Starts ``python -m replica`` as a subprocess on a free loopback port, runs N concurrent streaming
clients (default: the preset's capacity streams, 83 for chat-7b) in a closed loop with the seed's
request shape (1,200-token prompts whose 800-token opening repeats for 5 turns of a conversation,
200 to 400 output tokens, 300 on average: equal lengths would keep the streams in lock step), and after a warm-up measures for a bounded time. Prints the measured output
tokens per second (model time), the configured capacity and their ratio (goal: within 5%), the
prefix-cache hit rate, and p50/p95 TTFT and inter-token latency (model seconds, client side).
Prints figures only; it never fails on a time.

    python benchmarks/bench_replica_throughput.py                       # chat-7b, 83 streams
    python benchmarks/bench_replica_throughput.py --preset reason-70b   # 20 streams
    python benchmarks/bench_replica_throughput.py --prefix-tokens 0     # no prefix-cache reuse
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field

import httpx

from modelfleet.contract.metrics import (
    VLLM_GENERATION_TOKENS,
    VLLM_PREFIX_CACHE_HITS,
    VLLM_PREFIX_CACHE_QUERIES,
)
from replica.params import preset
from replica.workload import closed_loop, seed_shape_messages


@dataclass
class Tally:
    """Client-side observations, in wall seconds."""

    tokens: int = 0
    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    requests: int = 0
    errors: int = 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def stream_loop(client: httpx.AsyncClient, stream: int, streams: int, args: argparse.Namespace,
                      window: list[float], tally: Tally, stop_at: float) -> None:
    request = stream % args.turns  # stagger conversation turns across streams
    # Spread the first requests over about one answer's time so the streams do not move in step.
    await asyncio.sleep(stream * 10.0 / streams / args.time_scale)
    while time.monotonic() < stop_at:
        out_tokens = args.output_tokens + random.Random(f"{stream}/{request}").randint(
            -args.output_spread, args.output_spread)
        body = json.dumps({
            "model": args.preset,
            "messages": seed_shape_messages(stream, request, prompt_tokens=args.prompt_tokens,
                                            prefix_tokens=args.prefix_tokens, turns_per_conversation=args.turns),
            "max_tokens": out_tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }).encode()
        request += 1
        sent = time.monotonic()
        last: float | None = None
        try:
            async with client.stream("POST", "/v1/chat/completions", content=body,
                                     headers={"content-type": "application/json"}) as resp:
                # Count events in raw reads rather than parsing lines: the client must stay far
                # below one core, or its own delays would show up as a slower replica.
                async for raw in resp.aiter_raw():
                    n = raw.count(b"data: {") - raw.count(b'"role"') - raw.count(b'"choices":[]')
                    if n <= 0:
                        continue
                    now = time.monotonic()
                    if window[0] <= now < window[1]:
                        tally.tokens += n
                        if last is None:
                            tally.ttft.append(now - sent)
                        else:
                            tally.itl.append(now - last)
                        tally.itl.extend([0.0] * (n - 1))  # tokens that arrived in the same read
                    last = now
            tally.requests += 1
        except httpx.HTTPError:
            tally.errors += 1


def pct(xs: list[float], q: float, scale: float) -> str:
    if not xs:
        return "n/a"
    xs = sorted(xs)
    return f"{xs[min(len(xs) - 1, int(q * len(xs)))] * scale * 1000:.0f} ms"


async def run(args: argparse.Namespace, base: str) -> None:
    params = preset(args.preset)
    streams = args.streams or params.capacity_streams
    limits = httpx.Limits(max_connections=streams + 8, max_keepalive_connections=streams + 8)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=httpx.Timeout(120.0)) as client:
        start = time.monotonic()
        warm_end = start + args.warmup / args.time_scale
        window = [warm_end, warm_end + args.duration]
        tally = Tally()
        tasks = [asyncio.create_task(stream_loop(client, i, streams, args, window, tally, window[1]))
                 for i in range(streams)]
        await asyncio.sleep(max(0.0, warm_end - time.monotonic()))
        m0 = (await client.get("/metrics")).text
        await asyncio.sleep(args.duration)
        m1 = (await client.get("/metrics")).text
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    model_s = args.duration * args.time_scale
    client_rate = tally.tokens / model_s
    server_rate = (metric(m1, VLLM_GENERATION_TOKENS) - metric(m0, VLLM_GENERATION_TOKENS)) / model_s
    queries = metric(m1, VLLM_PREFIX_CACHE_QUERIES) - metric(m0, VLLM_PREFIX_CACHE_QUERIES)
    hits = metric(m1, VLLM_PREFIX_CACHE_HITS) - metric(m0, VLLM_PREFIX_CACHE_HITS)
    cap = params.capacity_tokens_per_s
    print(json.dumps({"preset": args.preset, "streams": streams, "time_scale": args.time_scale,
                      "window_model_s": model_s}))
    print(f"measured output tokens/s (client, model time): {client_rate:8.0f}")
    print(f"measured output tokens/s (server counter):     {server_rate:8.0f}")
    print(f"configured capacity tokens/s:                  {cap:8.0f}  at {params.capacity_streams} streams")
    print(f"ratio measured / capacity:                     {client_rate / cap:8.3f}")
    print(f"prefix cache hit rate (tokens):                {hits / queries if queries else 0:8.3f}")
    print(f"TTFT p50 / p95 (model):                        {pct(tally.ttft, 0.5, args.time_scale)} / "
          f"{pct(tally.ttft, 0.95, args.time_scale)}")
    print(f"inter-token latency p50 / p95 (model):         {pct(tally.itl, 0.5, args.time_scale)} / "
          f"{pct(tally.itl, 0.95, args.time_scale)}")
    model = closed_loop(params, streams, duration_s=model_s, prompt_tokens=args.prompt_tokens,
                        prefix_tokens=args.prefix_tokens, turns_per_conversation=args.turns,
                        output_tokens=args.output_tokens, output_spread=args.output_spread)
    print(f"same load on the engine model alone (no HTTP): {model.output_tokens_per_s:8.0f} tokens/s, "
          f"TTFT p50 {model.ttft_p50_s * 1000:.0f} ms, ITL p50 {model.itl_p50_s * 1000:.0f} ms")
    if tally.itl:
        mean_itl = statistics.fmean(tally.itl) * args.time_scale
        print(f"per-stream rate (1 / mean ITL, model):         {1 / mean_itl:8.1f} tokens/s")
    print(f"requests completed / errors:                   {tally.requests} / {tally.errors}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="chat-7b", choices=["chat-7b", "reason-70b"])
    ap.add_argument("--streams", type=int, default=0, help="concurrent streams (default: the preset's)")
    ap.add_argument("--time-scale", type=float, default=2.0, help="model seconds per wall second")
    ap.add_argument("--warmup", type=float, default=24.0, help="model seconds before measuring")
    ap.add_argument("--duration", type=float, default=30.0, help="wall seconds of measurement")
    ap.add_argument("--prompt-tokens", type=int, default=1200)
    ap.add_argument("--prefix-tokens", type=int, default=800)
    ap.add_argument("--turns", type=int, default=5, help="requests per conversation (prefix reuse)")
    ap.add_argument("--output-tokens", type=int, default=300, help="mean output tokens per request")
    ap.add_argument("--output-spread", type=int, default=100,
                    help="output tokens vary uniformly by this much around the mean, so streams desynchronise")
    ap.add_argument("--url", default="", help="measure a replica already running at this base URL "
                    "(started with the same --time-scale) instead of starting one")
    args = ap.parse_args()
    if args.url:
        asyncio.run(run(args, args.url.rstrip("/")))
        return 0

    port = free_port()
    cmd = [sys.executable, "-m", "replica", "--port", str(port), "--preset", args.preset,
           "--time-scale", str(args.time_scale), "--log-level", "warning"]
    server = subprocess.Popen(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                print("replica did not start", file=sys.stderr)
                return 1
            time.sleep(0.1)
        asyncio.run(run(args, base))
    finally:
        server.terminate()
        server.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())

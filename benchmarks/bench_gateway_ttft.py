"""TTFT added by Envoy + gateway_ext: the same streamed requests sent to a replica directly and
through the local stack's Envoy (ext_authz check by gateway_ext, route, settle afterwards), in one
run, interleaved, at a bounded open-loop rate. Prints p50/p99 of both and the difference; never
fails on a time.

TTFT here is wall time from the request's first byte sent to the first SSE ``data:`` event
received (the replica holds its headers until the first token). The replica runs at a high time
scale so its own step time is small; both paths see the same replica, the same engine, the same
client. The client is a minimal HTTP/1.1 keep-alive client on asyncio streams, so that its own CPU
cost stays small next to what it measures (everything shares this machine's cores).

    python benchmarks/bench_gateway_ttft.py [--rate 200] [--direct-rate 50] [--duration 10]
        [--time-scale 100] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from modelfleet.local.harness import RunningStack, assert_all_stopped, start_stack, write_config


@dataclass
class Target:
    """One path to the replica: ``host:port`` and the headers it needs; results per request."""

    name: str
    host: str
    port: int
    headers: dict[str, str]
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = field(default_factory=list)
    ttfts: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    open: int = 0
    """Requests sent and not answered yet."""
    skipped: int = 0
    """Arrivals not sent because ``max_open`` requests were already waiting (overload)."""


def request_bytes(target: Target, i: int, max_tokens: int) -> bytes:
    """A streamed chat request to ``chat-7b@v13`` (distinct prompts, no shared prefix)."""
    body = json.dumps({"model": "chat-7b@v13", "stream": True, "max_tokens": max_tokens,
                       "messages": [{"role": "user", "content": f"benchmark question {i}"}]})
    head = {"host": f"{target.host}:{target.port}", "content-type": "application/json",
            "content-length": str(len(body)), **target.headers}
    lines = "".join(f"{k}: {v}\r\n" for k, v in head.items())
    return f"POST /v1/chat/completions HTTP/1.1\r\n{lines}\r\n{body}".encode()


async def connect(target: Target, data: bytes) -> tuple[
        asyncio.StreamReader, asyncio.StreamWriter, bytes, float]:
    """Send ``data`` on an idle keep-alive connection (a new one if none, or if the idle one was
    closed by the server meanwhile); returns the connection, the status line and the send time."""
    while target.idle:
        reader, writer = target.idle.pop()
        start = time.perf_counter()
        writer.write(data)
        try:
            line = await reader.readline()
        except OSError:
            line = b""
        if line:
            return reader, writer, line, start
        writer.close()
    reader, writer = await asyncio.open_connection(target.host, target.port)
    start = time.perf_counter()
    writer.write(data)
    return reader, writer, await reader.readline(), start


async def one(target: Target, i: int, max_tokens: int) -> None:
    """Send request ``i`` on a keep-alive connection; record its TTFT (seconds) or its error."""
    reader, writer, status_line, start = await connect(target, request_bytes(target, i, max_tokens))
    try:
        status = status_line.split(b" ", 2)[1].decode()
        headers: dict[bytes, bytes] = {}
        while (line := await reader.readline()) != b"\r\n":
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        first: float | None = None
        if headers.get(b"transfer-encoding") == b"chunked":
            while (size := int((await reader.readline()).split(b";")[0], 16)) > 0:
                chunk = await reader.readexactly(size + 2)
                if first is None and b"data:" in chunk:
                    first = time.perf_counter() - start
            await reader.readline()
        else:
            await reader.readexactly(int(headers.get(b"content-length", b"0")))
    except (OSError, ValueError, IndexError, asyncio.IncompleteReadError) as exc:
        writer.close()
        target.errors[type(exc).__name__] = target.errors.get(type(exc).__name__, 0) + 1
        return
    if status != "200" or first is None:
        target.errors[status] = target.errors.get(status, 0) + 1
    else:
        target.ttfts.append(first)
    if headers.get(b"connection") == b"close":
        writer.close()
    else:
        target.idle.append((reader, writer))


async def tracked(target: Target, i: int, max_tokens: int) -> None:
    target.open += 1
    try:
        await one(target, i, max_tokens)
    finally:
        target.open -= 1


async def arrivals(target: Target, rate: float, offset_s: float, duration_s: float,
                   warmup_s: float, max_tokens: int, max_open: int) -> None:
    """Open loop on one target: ``rate`` requests/s from ``offset_s`` for ``warmup_s`` (dropped)
    then ``duration_s`` seconds; an arrival finding ``max_open`` requests open is skipped."""
    tasks: set[asyncio.Task[None]] = set()
    start = time.perf_counter() + offset_s
    n, warm = 0, int(warmup_s * rate)
    while n < warm + int(duration_s * rate):
        delay = start + n / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
            continue
        if n == warm:
            target.ttfts.clear()
            target.errors.clear()
            target.skipped = 0
        if target.open >= max_open:
            target.skipped += 1
        else:
            task = asyncio.create_task(tracked(target, n, max_tokens))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        n += 1
    await asyncio.gather(*tasks)


async def load(targets: list[tuple[Target, float]], duration_s: float, warmup_s: float,
               max_tokens: int, max_open: int) -> None:
    """Every ``(target, rate)`` at once, arrivals interleaved (offset by half an interval)."""
    await asyncio.gather(*(
        arrivals(t, rate, i * 0.5 / rate, duration_s, warmup_s, max_tokens, max_open)
        for i, (t, rate) in enumerate(targets)))


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` in milliseconds."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def replica_port(stack: RunningStack) -> int:
    return next(int(p["port"]) for p in stack.facts["processes"]
                if p.get("model_version") == "chat-7b@v13")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start a stack (one chat-7b@v13 replica), run the load, stop the stack."""
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        config = write_config(cwd / "config", time_scale=args.time_scale,
                              replicas={"chat-7b@v13": 1, "chat-7b@v14": 0, "reason-70b@v1": 1})
        stack = start_stack(cwd, config)
        try:
            port = int(stack.base_url.split(":")[2].split("/")[0])
            targets = [
                Target("direct", "127.0.0.1", replica_port(stack), {}),
                Target("envoy+gateway", "127.0.0.1", port,
                       {"authorization": f"Bearer {stack.key('search')}"}),
            ]
            asyncio.run(load([(targets[0], args.direct_rate), (targets[1], args.rate)], args.duration,
                             args.warmup, args.max_tokens, args.max_open))
            seconds = args.duration
        finally:
            stack.stop()
            assert_all_stopped(stack)
    out: dict[str, Any] = {"cpus": os.cpu_count(), "rate": args.rate,
                           "direct_rate": args.direct_rate,
                           "duration_s": round(seconds, 2), "time_scale": args.time_scale}
    for t in targets:
        out[t.name] = {"requests": len(t.ttfts), "achieved_per_s": round(len(t.ttfts) / seconds, 1),
                       "errors": t.errors, "skipped": t.skipped,
                       "p50_ms": round(pct(t.ttfts, 0.5), 2),
                       "p99_ms": round(pct(t.ttfts, 0.99), 2),
                       "mean_ms": round(1000 * statistics.fmean(t.ttfts), 2) if t.ttfts else None}
    direct, gated = out["direct"], out["envoy+gateway"]
    out["added_p50_ms"] = round(gated["p50_ms"] - direct["p50_ms"], 2)
    out["added_p99_ms"] = round(gated["p99_ms"] - direct["p99_ms"], 2)
    return out


def main() -> None:
    """Parse the flags, run, print."""
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=200.0,
                    help="requests/s through Envoy + gateway_ext")
    ap.add_argument("--direct-rate", type=float, default=50.0,
                    help="requests/s sent to the replica directly, interleaved (default 50: the "
                    "baseline samples the same replica at the same moment; 200 + 200 saturates a "
                    "2-core machine)")
    ap.add_argument("--duration", type=float, default=10.0, help="measured seconds")
    ap.add_argument("--warmup", type=float, default=2.0, help="seconds dropped at the start")
    ap.add_argument("--time-scale", type=float, default=100.0, help="the replica's time scale")
    ap.add_argument("--max-tokens", type=int, default=4, help="output tokens per request")
    ap.add_argument("--max-open", type=int, default=200,
                    help="open requests per path beyond which arrivals are skipped (overload)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args()
    print("starting the local stack ...", flush=True)
    result = run(args)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{result['cpus']} CPUs, {result['rate']:g} requests/s through Envoy + gateway_ext and "
          f"{result['direct_rate']:g} direct, {result['duration_s']} s, replica time scale "
          f"{args.time_scale:g}")
    print(f"{'path':<15} {'done/s':>7} {'p50 ms':>8} {'p99 ms':>8} {'skipped':>8}  errors")
    for name in ("direct", "envoy+gateway"):
        r = result[name]
        print(f"{name:<15} {r['achieved_per_s']:>7} {r['p50_ms']:>8} {r['p99_ms']:>8} "
              f"{r['skipped']:>8}  {r['errors'] or '-'}")
    print(f"added by Envoy + gateway_ext: p50 {result['added_p50_ms']} ms, "
          f"p99 {result['added_p99_ms']} ms")


if __name__ == "__main__":
    main()

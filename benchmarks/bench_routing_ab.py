"""Routing A/B, live: round-robin vs least tokens in flight vs affinity with bounded load.

    python benchmarks/bench_routing_ab.py [--replicas 4] [--conversations 100] [--requests 400]
        [--time-scale 1.5] [--seed 0] [--policies round_robin,least_tokens,affinity] [--json]

Each policy gets a fresh `modelfleet up` (cold prefix caches) with ``--replicas`` simulated
chat-7b@v13 replicas (no canary, no shadow) and the gateway's ``MODELFLEET_GATEWAY_PICKING``
set to it; the same seeded workload is replayed against each through Envoy.

Workload (the Azure conversation trace has no conversations; this model adds them, seeded):
conversation *i* opens at trace row *r_i*'s arrival (times divided by ``--speedup``), at most
``--conversations`` open at once (later ones wait for a free slot). Its first prompt is a
system prompt of row *r_i*'s ContextTokens (capped at 3,000) unique to the conversation; each
turn's answer is exactly the next trace row's GeneratedTokens (capped at 400; ``ignore_eos``);
turns per conversation are 1 + geometric (continue with probability 0.75), at most 8 and while
the history stays under 7,000 tokens (the context is 8,192); a follow-up question is 32 to 160
tokens; between turns the user thinks an exponential 3 s (model seconds). Requests stop at
``--requests``.

Figures: prefix hit rate (cached / prompt tokens on turns >= 2, from the final events); p50/p95
TTFT measured by the replicas' middleware (model seconds, from ``modelfleet_replica_ttft_seconds``)
and by the client (wall ms, including Envoy and the gateway; also for turns >= 2 alone);
imbalance = highest tokens in flight / pool average, sampled from the control plane's router
state every 0.25 s while at least half of ``--conversations`` are open (mean and p95 over the
samples). A benchmark: it prints figures and never fails on them.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from modelfleet.contract.headers import CONVERSATION_HEADER
from modelfleet.local.harness import edit_yaml, start_stack, write_config

TRACE = Path("/work/shared/traces/azure_llm_2023_conv.csv")
POLICIES = ("round_robin", "least_tokens", "affinity")


@dataclass
class Conversation:
    """One planned conversation: its opening prompt size and each turn's answer size (tokens)."""

    cid: str
    start_s: float
    system_tokens: int
    answers: list[int]
    followups: list[int]


def plan(rows: list[tuple[float, int, int]], requests: int, seed: int, speedup: float) -> list[Conversation]:
    """Conversations over the trace rows until ``requests`` turns are planned (see the module)."""
    rng, i, total = random.Random(seed), 0, 0
    out: list[Conversation] = []
    while total < requests and i < len(rows):
        t0, context, _ = rows[i]
        system = min(3000, max(16, context))
        answers: list[int] = []
        followups: list[int] = []
        history = system
        while len(answers) < min(8, requests - total):
            answer = min(400, max(1, rows[(i + len(answers)) % len(rows)][2]))
            followup = rng.randint(32, 160)
            if answers and (history + followup + answer + 16 > 7000 or rng.random() >= 0.75):
                break
            answers.append(answer)
            followups.append(followup)
            history += followup + answer + 16
        out.append(Conversation(f"conv-{len(out)}", t0 / speedup, system, answers, followups))
        i, total = i + len(answers), total + len(answers)
    return out


def words(cid: str, tag: str, n: int) -> str:
    """``n`` tokens of text unique to ``cid`` (one simulated token per word)."""
    return " ".join(f"{cid.replace('-', '')}{tag}{k}" for k in range(n))


@dataclass
class Results:
    ttft_ms: list[float] = field(default_factory=list)
    ttft_later_ms: list[float] = field(default_factory=list)
    open: int = 0
    prompt_later: int = 0
    cached_later: int = 0
    prompt_all: int = 0
    cached_all: int = 0
    errors: int = 0
    imbalance: list[float] = field(default_factory=list)


async def turn(client: httpx.AsyncClient, url: str, key: str, conv: Conversation,
               messages: list[dict[str, str]], answer: int, res: Results, later: bool) -> str:
    body = {"model": "chat-7b", "messages": messages, "max_tokens": answer, "stream": True,
            "ignore_eos": True}
    headers = {"authorization": f"Bearer {key}", CONVERSATION_HEADER: conv.cid}
    t0, text, first = time.perf_counter(), [], None
    async with client.stream("POST", url, json=body, headers=headers) as r:
        if r.status_code != 200:
            res.errors += 1
            await r.aread()
            return ""
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("choices"):
                first = first or time.perf_counter()
                text.append(event["choices"][0]["delta"].get("content") or "")
            elif "usage" in event:
                u = event["usage"]
                res.prompt_all += u["prompt_tokens"]
                res.cached_all += u["cached_tokens"]
                if later:
                    res.prompt_later += u["prompt_tokens"]
                    res.cached_later += u["cached_tokens"]
    if first is not None:
        res.ttft_ms.append((first - t0) * 1000)
        if later:
            res.ttft_later_ms.append((first - t0) * 1000)
    return "".join(text)


async def replay(base_url: str, key: str, convs: list[Conversation], slots: int,
                 time_scale: float, res: Results) -> None:
    gate, t0 = asyncio.Semaphore(slots), time.monotonic()
    rng = random.Random(1)
    limits = httpx.Limits(max_connections=slots + 10, max_keepalive_connections=slots + 10)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        url = base_url + "/chat/completions"

        async def run(conv: Conversation) -> None:
            await asyncio.sleep(max(0.0, conv.start_s - (time.monotonic() - t0)))
            async with gate:
                res.open += 1
                messages = [{"role": "system", "content": words(conv.cid, "s", conv.system_tokens)}]
                for k, answer in enumerate(conv.answers):
                    messages.append({"role": "user", "content": words(conv.cid, f"q{k}x",
                                                                      conv.followups[k])})
                    text = await turn(client, url, key, conv, messages, answer, res, k > 0)
                    messages.append({"role": "assistant", "content": text})
                    if k + 1 < len(conv.answers):
                        await asyncio.sleep(rng.expovariate(1 / 3.0) / time_scale)
                res.open -= 1

        await asyncio.gather(*(run(c) for c in convs))


async def sample_imbalance(cp_url: str, res: Results, stop: asyncio.Event, min_open: int) -> None:
    async with httpx.AsyncClient(timeout=2) as client:
        while not stop.is_set():
            if res.open < min_open:
                await asyncio.sleep(0.25)
                continue
            try:
                state = (await client.get(cp_url + "/v1/router/state")).json()
                loads = [r["tokens_in_flight"] for r in state["pools"]["chat-7b@v13"]["replicas"]]
                if loads and sum(loads) > 0:
                    res.imbalance.append(max(loads) / (sum(loads) / len(loads)))
            except (httpx.HTTPError, KeyError, ValueError):
                pass
            await asyncio.sleep(0.25)


def replica_ttft(facts: dict[str, Any]) -> tuple[float, float]:
    """p50 and p95 TTFT (model seconds) from the replicas' middleware histograms, interpolated."""
    buckets: dict[float, float] = {}
    for p in facts["processes"]:
        if p.get("model_version") != "chat-7b@v13":
            continue
        for line in httpx.get(f"http://127.0.0.1:{p['port']}/metrics", timeout=5).text.splitlines():
            if line.startswith("modelfleet_replica_ttft_seconds_bucket") and 'traffic="served"' in line:
                le = line.split('le="')[1].split('"')[0]
                bound = float("inf") if le == "+Inf" else float(le)
                buckets[bound] = buckets.get(bound, 0.0) + float(line.rsplit(" ", 1)[1])
    ordered = sorted(buckets.items())
    total = ordered[-1][1] if ordered else 0.0

    def q(p: float) -> float:
        prev_b, prev_c = 0.0, 0.0
        for b, c in ordered:
            if c >= p * total and total:
                if b == float("inf"):
                    return prev_b
                return prev_b + (b - prev_b) * ((p * total - prev_c) / max(c - prev_c, 1e-9))
            prev_b, prev_c = b, c
        return float("nan")

    return q(0.5), q(0.95)


def no_canary(data: Any) -> None:
    """Every chat-7b request on the live version: the A/B compares replicas of one pool."""
    for model in data["models"]:
        model.pop("canary", None)


def run_policy(policy: str, args: argparse.Namespace, convs: list[Conversation]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"routing-ab-{policy}-") as tmp:
        cwd = Path(tmp)
        config = write_config(cwd / "config", replicas={"chat-7b@v13": args.replicas},
                              time_scale=args.time_scale)
        edit_yaml(config / "models.yaml", no_canary)
        stack = start_stack(cwd, config, env={"MODELFLEET_GATEWAY_PICKING": policy})
        res = Results()
        try:
            async def main() -> None:
                stop = asyncio.Event()
                sampler = asyncio.create_task(sample_imbalance(
                    stack.facts["control_plane"]["http_url"], res, stop, args.conversations // 2))
                await replay(stack.base_url, stack.key("search"), convs, args.conversations,
                             args.time_scale, res)
                stop.set()
                await sampler

            t0 = time.monotonic()
            asyncio.run(main())
            elapsed = time.monotonic() - t0
            p50, p95 = replica_ttft(stack.facts)
        finally:
            stack.stop()
    ttft, later = sorted(res.ttft_ms), sorted(res.ttft_later_ms)
    imb = sorted(res.imbalance)
    return {
        "policy": policy, "requests": len(ttft) + res.errors, "errors": res.errors,
        "elapsed_s": round(elapsed, 1),
        "prefix_hit_rate_turns_2plus": round(res.cached_later / max(1, res.prompt_later), 3),
        "prefix_hit_rate_all": round(res.cached_all / max(1, res.prompt_all), 3),
        "ttft_replica_p50_s": round(p50, 3), "ttft_replica_p95_s": round(p95, 3),
        "ttft_client_p50_ms": round(statistics.median(ttft), 1) if ttft else None,
        "ttft_client_p95_ms": round(ttft[int(0.95 * (len(ttft) - 1))], 1) if ttft else None,
        "ttft_client_p95_turns_2plus_ms":
            round(later[int(0.95 * (len(later) - 1))], 1) if later else None,
        "imbalance_mean": round(statistics.mean(imb), 2) if imb else None,
        "imbalance_p95": round(imb[int(0.95 * (len(imb) - 1))], 2) if imb else None,
    }


def read_trace(limit: int) -> list[tuple[float, int, int]]:
    from datetime import datetime

    rows = []
    with TRACE.open(newline="") as f:
        for r in csv.DictReader(f):
            t = datetime.fromisoformat(r["TIMESTAMP"][:26]).timestamp()
            rows.append((t, int(r["ContextTokens"]), int(r["GeneratedTokens"])))
            if len(rows) >= limit:
                break
    t0 = rows[0][0]
    return [(t - t0, c, g) for t, c, g in rows]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--conversations", type=int, default=100, help="open at once")
    ap.add_argument("--requests", type=int, default=400, help="turns per policy")
    ap.add_argument("--time-scale", type=float, default=1.5)
    ap.add_argument("--speedup", type=float, default=20.0, help="trace arrival times / this")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    convs = plan(read_trace(5 * args.requests), args.requests, args.seed, args.speedup)
    out = []
    for policy in args.policies.split(","):
        print(f"{policy}: {len(convs)} conversations, {args.requests} requests ...", file=sys.stderr,
              flush=True)
        out.append(run_policy(policy, args, convs))
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    cols = ["policy", "prefix_hit_rate_turns_2plus", "prefix_hit_rate_all", "ttft_replica_p50_s",
            "ttft_replica_p95_s", "ttft_client_p95_ms", "ttft_client_p95_turns_2plus_ms",
            "imbalance_mean", "imbalance_p95", "errors", "elapsed_s"]
    print(" | ".join(cols))
    for row in out:
        print(" | ".join(str(row[c]) for c in cols))
    return 0


if __name__ == "__main__":
    sys.exit(main())

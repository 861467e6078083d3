"""The gate's load test through the running platform (I/O): one step of an open loop at a fixed
arrival rate against ``model@version``, while the control plane's pool state is polled.

Every request is a streamed chat completion through Envoy with a team key, explicit
``model@version`` routing, ``max_tokens`` = ``output_tokens`` and ``ignore_eos`` (vLLM's
sampling extension), so each answer is exactly that long and the replicas' tokens in flight
(prompt + ``max_tokens`` - streamed) are the true prompt + remaining output. Prompts are replayed
in order from the given list. The pool of the version is read from
``GET /admin/pools/{model}/state`` every ``poll_s`` wall seconds. Steps run one after another;
each waits for its streams to end, so steps do not overlap. Figures: :mod:`modelfleet.release.rate`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import httpx

from modelfleet.release.rate import PoolSample, RateStep, StreamSample, Targets, arrivals, summarise


@dataclass(frozen=True)
class PlatformLoad:
    """Where and what to send. Durations in model seconds; ``time_scale`` model seconds per
    wall second (the local stack's ``--time-scale``)."""

    api: str
    """OpenAI base URL (``.../v1``)."""
    key: str
    target: str
    """``model@version``."""
    prompts: Sequence[Sequence[Mapping[str, str]]]
    admin_url: str
    admin_token: str | None
    output_tokens: int = 300
    step_s: float = 30.0
    warmup_s: float | None = None
    """Model seconds at the start of a step left out of throughput and pool load, while the
    load still rises (default: one stream's life at the target rate, ``output_tokens`` / 30
    tokens/s, at most half the step)."""
    time_scale: float = 1.0
    poisson: bool = True
    seed: int = 1
    poll_s: float = 0.25
    request_timeout_s: float = 120.0
    targets: Targets = field(default_factory=Targets)


async def _stream(client: httpx.AsyncClient, load: PlatformLoad, messages: Sequence[Mapping[str, str]],
                  at: float) -> StreamSample:
    await asyncio.sleep(max(0.0, at - time.monotonic()))
    sent = time.monotonic()
    body = {"model": load.target, "messages": list(messages), "max_tokens": load.output_tokens,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    times: list[float] = []
    try:
        async with client.stream("POST", f"{load.api.rstrip('/')}/chat/completions", json=body) as r:
            if r.status_code != 200:
                return StreamSample(sent, (), f"HTTP {r.status_code}")
            done = False
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    break
                chunk = json.loads(line[6:])
                if any((c.get("delta") or {}).get("content") for c in chunk.get("choices") or ()):
                    times.append(time.monotonic())
            return StreamSample(sent, tuple(times), None if done else "stream ended without [DONE]")
    except (httpx.HTTPError, ValueError) as exc:
        return StreamSample(sent, tuple(times), f"{exc.__class__.__name__}: {exc}")


async def _poll(client: httpx.AsyncClient, load: PlatformLoad, until: asyncio.Event,
                out: list[PoolSample]) -> None:
    model, _, version = load.target.partition("@")
    headers = {"Authorization": f"Bearer {load.admin_token}"} if load.admin_token else {}
    while not until.is_set():
        try:
            r = await client.get(f"{load.admin_url.rstrip('/')}/admin/pools/{model}/state",
                                 headers=headers, timeout=5.0)
            v = r.json()["versions"].get(version) if r.status_code == 200 else None
            if v:
                out.append(PoolSample(time.monotonic(), int(v["tokens_in_flight"]),
                                      int(v["running"]), int(v["routable"])))
        except (httpx.HTTPError, ValueError, KeyError):
            pass  # a missed sample; the step's mean uses the others
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(until.wait(), load.poll_s)


async def _step(load: PlatformLoad, rate_per_s: float, seed: int) -> RateStep:
    wall_s = load.step_s / load.time_scale
    offsets = arrivals(rate_per_s * load.time_scale, wall_s, poisson=load.poisson, seed=seed)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=load.request_timeout_s, limits=limits,
                                 headers={"Authorization": f"Bearer {load.key}"}) as client, \
            httpx.AsyncClient() as admin:
        t0 = time.monotonic()
        stop, pool = asyncio.Event(), list[PoolSample]()
        poller = asyncio.create_task(_poll(admin, load, stop, pool))
        tasks = [asyncio.create_task(_stream(client, load, load.prompts[k % len(load.prompts)], t0 + at))
                 for k, at in enumerate(offsets)]
        await asyncio.sleep(max(0.0, t0 + wall_s - time.monotonic()))
        stop.set()
        await poller
        samples = list(await asyncio.gather(*tasks))
    warmup_s = load.warmup_s
    if warmup_s is None:
        warmup_s = min(load.step_s / 2, load.output_tokens / load.targets.stream_tokens_per_s)
    window = (t0 + warmup_s / load.time_scale, t0 + wall_s)
    return summarise(rate_per_s, samples, pool, window, load.time_scale, load.targets)


def platform_runner(load: PlatformLoad,
                    progress: Callable[[RateStep], None] | None = None) -> Callable[[float], RateStep]:
    """``run(rate_per_s)``: one step at that arrival rate (requests per model second) through
    the platform; the k-th step is seeded ``seed + k``."""
    count = [0]

    def run(rate_per_s: float) -> RateStep:
        step = asyncio.run(_step(load, rate_per_s, load.seed + count[0]))
        count[0] += 1
        if progress is not None:
            progress(step)
        return step

    return run

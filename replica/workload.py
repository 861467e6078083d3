"""The seed's request shape as chat messages, for load tests, the benchmark and the simulator.

A stream runs conversations. Each request is a conversation's fixed opening of about
``prefix_tokens`` tokens (a system prompt standing for the history) plus a new user message, for
about ``prompt_tokens`` in all. A stream starts a new conversation every ``turns_per_conversation``
requests, so with the defaults (1,200-token prompts, an 800-token prefix, 5 turns) 4 requests in 5
find the 800-token prefix in the prefix cache: the seed's "800 of the 1,200 cached, found 80% of
the time". Pure and deterministic: the same arguments give the same words.

``closed_loop`` runs such streams against an engine on a manual clock: the load test, in model
time, that the calibration in ``replica.params`` promises to pass.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass

from modelfleet.contract.tokens import (
    GENERATION_PROMPT_TOKENS,
    MESSAGE_OVERHEAD_TOKENS,
    block_hashes,
    chat_prompt_ids,
)
from replica.clock import ManualClock
from replica.engine import Engine
from replica.engine_types import EngineRequest
from replica.params import EngineParams

_VOCAB = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango", "uniform", "victor", "whiskey", "xray", "yankee", "zulu", "north", "south", "east", "west", "red", "green", "blue", "amber", "river", "stone", "cloud", "field", "market", "ledger", "harbor", "signal", "engine"]


def _words(n: int, rng: random.Random) -> str:
    return " ".join(rng.choice(_VOCAB) for _ in range(max(0, n)))


def seed_shape_messages(
    stream: int,
    request: int,
    *,
    prompt_tokens: int = 1200,
    prefix_tokens: int = 800,
    turns_per_conversation: int = 5,
    salt: str = "",
) -> list[dict[str, str]]:
    """Messages of request number ``request`` (0, 1, ...) of stream ``stream``.

    The prompt through the chat template is exactly ``prompt_tokens`` tokens, of which the system
    message (template tokens included) is ``prefix_tokens``. With ``turns_per_conversation`` 1
    every request is a new conversation; ``prefix_tokens`` 0 drops the shared opening.
    """
    conversation = request // max(1, turns_per_conversation)
    conv_rng = random.Random(f"{salt}/{stream}/{conversation}")
    msg_rng = random.Random(f"{salt}/{stream}/{request}/user")
    messages: list[dict[str, str]] = []
    user_tokens = prompt_tokens - GENERATION_PROMPT_TOKENS - MESSAGE_OVERHEAD_TOKENS
    if prefix_tokens > 0:
        system_words = prefix_tokens - MESSAGE_OVERHEAD_TOKENS
        messages.append({"role": "system", "content": _words(system_words, conv_rng)})
        user_tokens -= prefix_tokens
    # A unique first word keeps two requests of one conversation from sharing more than the prefix.
    messages.append({"role": "user", "content": f"q{request} " + _words(user_tokens - 1, msg_rng)})
    return messages


@dataclass(frozen=True)
class LoadResult:
    """What a closed-loop load run measured, in model seconds."""

    output_tokens_per_s: float
    ttft_p50_s: float
    ttft_p95_s: float
    itl_p50_s: float
    itl_p95_s: float
    prefix_hit_rate: float
    """Share of looked-up context tokens the prefix cache held, over the measured window."""
    requests: int
    """Requests finished in the measured window."""


def closed_loop(
    params: EngineParams,
    streams: int,
    *,
    duration_s: float = 60.0,
    warmup_s: float = 20.0,
    prompt_tokens: int = 1200,
    prefix_tokens: int = 800,
    turns_per_conversation: int = 5,
    output_tokens: int = 300,
    output_spread: int = 100,
    stagger_s: float = 10.0,
) -> LoadResult:
    """Run ``streams`` closed-loop streams of the seed's shape on an engine with a manual clock.

    Each stream sends its next request the moment the previous answer ends. Output lengths vary
    uniformly by ``output_spread`` around ``output_tokens`` and the streams start spread over
    ``stagger_s`` seconds; with equal lengths and a common start they would move in lock step.
    Measures from ``warmup_s`` for ``duration_s`` model seconds. Pure: no sleeping, no I/O.
    """
    clock = ManualClock()
    engine = Engine(params, clock)
    arrivals: list[tuple[float, int, int]] = []  # (time, stream, request number)
    for s in range(streams):
        heapq.heappush(arrivals, (s * stagger_s / streams, s, s % max(1, turns_per_conversation)))
    start, end = warmup_s, warmup_s + duration_s
    tokens = finished = 0
    ttft: list[float] = []
    itl: list[float] = []
    q0 = h0 = 0
    while clock.now() < end:
        while arrivals and arrivals[0][0] <= clock.now():
            t, s, n = heapq.heappop(arrivals)
            messages = seed_shape_messages(s, n, prompt_tokens=prompt_tokens, prefix_tokens=prefix_tokens,
                                           turns_per_conversation=turns_per_conversation)
            ids = chat_prompt_ids((m["role"], m["content"]) for m in messages)
            out = output_tokens + random.Random(f"{s}/{n}").randint(-output_spread, output_spread)
            engine.add_request(EngineRequest(f"{s}/{n}", len(ids), max(1, out),
                                             block_hashes(ids, params.block_size)), t)
        if not engine.has_work:
            clock.set(arrivals[0][0])
            continue
        before = clock.now()
        result = engine.step()
        clock.set(result.end_s)
        if before < start <= result.end_s:
            stats = engine.stats()
            q0, h0 = stats.prefix_cache_queries, stats.prefix_cache_hits
        for o in result.outputs:
            if start <= result.end_s < end:
                tokens += 1
                (ttft if o.index == 0 else itl).append(o.interval_s)
                finished += o.finished
            if o.finished:
                s, n = (int(x) for x in o.request_id.split("/"))
                heapq.heappush(arrivals, (result.end_s, s, n + 1))
    stats = engine.stats()
    queries = stats.prefix_cache_queries - q0
    return LoadResult(
        output_tokens_per_s=tokens / duration_s,
        ttft_p50_s=_quantile(ttft, 0.5),
        ttft_p95_s=_quantile(ttft, 0.95),
        itl_p50_s=_quantile(itl, 0.5),
        itl_p95_s=_quantile(itl, 0.95),
        prefix_hit_rate=(stats.prefix_cache_hits - h0) / queries if queries else 0.0,
        requests=finished,
    )


def _quantile(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]

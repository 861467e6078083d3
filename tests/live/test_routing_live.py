"""Routing through `modelfleet up` (real Envoy, gateway_ext, simulated replicas with the middleware)
and the openai client: conversations stay on their replica and find their prefix cached, a slow
replica is skipped while it is above 125% of the pool's average and taken again after, the canary
split is sticky across a percent change, and shadow copies never reach a client."""

from __future__ import annotations

import asyncio
import signal
from collections import Counter
from collections.abc import Iterator
from functools import partial
from typing import TYPE_CHECKING

import openai
import pytest

from gateway_ext.routing.versions import conversation_key, split_point
from modelfleet.contract.headers import CONVERSATION_HEADER, UPSTREAM_REPLICA_HEADER
from modelfleet.contract.metrics import REPLICA_REQUESTS
from modelfleet.local.harness import RunningStack, assert_all_stopped, start_stack

if TYPE_CHECKING:
    import tests.live.routing_support as rs
else:  # pytest puts tests/live on sys.path
    import routing_support as rs

pytestmark = pytest.mark.live

REPLICAS = {"chat-7b@v13": 4, "chat-7b@v14": 1, "chat-7b@v15": 1, "reason-70b@v1": 1}
SHADOW_FRACTION = 0.2


@pytest.fixture(scope="module")
def routed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    """4 x chat-7b@v13, the canary v14 (10%), the shadow v15 (20% of v13's requests), 50x."""
    cwd = tmp_path_factory.mktemp("routing")
    config = rs.routing_config(cwd / "config", REPLICAS, 50.0, SHADOW_FRACTION)
    running = start_stack(cwd, config, "--debug")
    try:
        rs.wait_for(lambda: len(rs.routable(running)) == 4, 10, "4 routable v13 replicas")
        yield running
    finally:
        assert running.stop(signal.SIGINT) == 0, running.log.read_text()
        assert_all_stopped(running)


def system_prompt(cid: str) -> str:
    """A long opening of the conversation's own (about 250 tokens): the prefix worth caching."""
    return f"You are assistant {cid}. " + " ".join(f"rule {cid} {i} keep answers short." for i in range(40))


async def conversation(client: openai.AsyncOpenAI, cid: str, turns: int) -> list[rs.Turn]:
    """``turns`` turns of one conversation, each sending the whole history."""
    messages = [{"role": "system", "content": system_prompt(cid)}]
    out = []
    for t in range(turns):
        messages.append({"role": "user", "content": f"Question {t} about item {cid}?"})
        turn = await rs.stream_turn(client, cid, messages)
        out.append(turn)
        messages.append({"role": "assistant", "content": turn.text})
    return out


def test_conversations_stay_on_one_replica_and_hit_their_prefix_cache(routed: RunningStack) -> None:
    async def main() -> list[list[rs.Turn]]:
        client = rs.aclient(routed)
        jobs = [partial(conversation, client, f"affinity-{i}", 5) for i in range(200)]
        return await rs.gather_limited(jobs, 40)

    results = asyncio.run(main())
    errors = [t.error for turns in results for t in turns if t.error]
    assert errors == []
    moved = [i for i, turns in enumerate(results) if len({t.replica_id for t in turns}) != 1]
    assert moved == [], f"conversations that changed replica: {moved}"
    later = [t for turns in results for t in turns[1:]]
    hit = sum(t.cached_tokens for t in later) / sum(t.prompt_tokens for t in later)
    assert hit >= 0.75, f"prefix-cache hit rate on turns >= 2: {hit:.2f}"
    served = Counter(turns[0].replica_id for turns in results)
    assert len([r for r in served if r and r.startswith("chat-7b@v13")]) == 4  # spread over all


def test_a_slow_replica_is_skipped_while_above_the_bound_and_taken_again_after(
        routed: RunningStack) -> None:
    ids = rs.routable(routed)
    slow = ids[-1]
    homed = iter(rs.homed_on(ids, slow, "slow", 200))
    body = [{"role": "user", "content": "Describe the ocean in detail. " * 30}]

    def over() -> bool:
        pool = rs.routing_view(routed)["pools"]["chat-7b@v13"]["replicas"]
        return bool(next(r for r in pool if r["replica_id"] == slow)["over_bound"])

    async def main() -> tuple[list[tuple[bool, str | None, bool]], list[str | None]]:
        client = rs.aclient(routed)
        rs.engine(routed, slow, slowdown=200)  # its answers barely move: its load only climbs
        picks: list[tuple[bool, str | None, bool]] = []
        open_streams: list[asyncio.Task[rs.Turn]] = []
        while sum(1 for before, _, after in picks if before and after) < 8:
            assert len(picks) < 120, f"never over the bound: {picks}"
            before = over()
            raw = await client.chat.completions.with_raw_response.create(
                model="chat-7b@v13", messages=body, max_tokens=1500, stream=True,  # type: ignore[arg-type]
                extra_headers={CONVERSATION_HEADER: next(homed)})
            picks.append((before, raw.headers.get(UPSTREAM_REPLICA_HEADER), over()))
            stream = raw.parse()
            open_streams.append(asyncio.create_task(_drain(stream)))
            await asyncio.sleep(0.05)
        rs.engine(routed, slow, slowdown=1)
        await asyncio.gather(*open_streams)
        await asyncio.to_thread(rs.wait_for, lambda: not over(), 15, "slow replica back under the bound")
        again = [await rs.stream_turn(client, next(homed), body, max_tokens=4, model="chat-7b@v13")
                 for _ in range(5)]
        return picks, [t.replica_id for t in again]

    picks, after = asyncio.run(main())
    assert any(replica == slow for before, replica, _ in picks if not before)  # its home
    skipped = [replica for before, replica, now in picks if before and now]
    assert skipped and slow not in skipped, picks
    assert after == [slow] * 5


async def _drain(stream: object) -> rs.Turn:
    turn = rs.Turn()
    async for chunk in stream:  # type: ignore[attr-defined]
        turn.chunks += 1 if chunk.choices else 0
    return turn


def test_canary_split_is_sticky_when_the_percent_is_raised(routed: RunningStack) -> None:
    config = routed.cwd / "config"

    async def first_turns(prefix: str, n: int) -> dict[str, rs.Turn]:
        client = rs.aclient(routed)
        ids = [f"{prefix}-{i}" for i in range(n)]
        turns = await rs.gather_limited(
            [partial(rs.stream_turn, client, c, [{"role": "user", "content": f"hi {c}"}])
             for c in ids], 40)
        return dict(zip(ids, turns, strict=True))

    async def next_turns(first: dict[str, rs.Turn]) -> dict[str, rs.Turn]:
        client = rs.aclient(routed)
        turns = await rs.gather_limited(
            [partial(rs.stream_turn, client, c, [
                {"role": "user", "content": f"hi {c}"}, {"role": "assistant", "content": t.text},
                {"role": "user", "content": "and then?"}]) for c, t in first.items()], 40)
        return dict(zip(first, turns, strict=True))

    old = asyncio.run(first_turns("canary-a", 150))
    share_10 = sum(t.model_version == "v14" for t in old.values()) / len(old)
    rs.set_canary(config, 50)
    rs.wait_for(lambda: rs.routing_view(routed)["aliases"]["chat-7b"]["canary_percent"] == 50, 10,
             "the gateway sees the canary at 50%")
    old_again = asyncio.run(next_turns(old))
    new = asyncio.run(first_turns("canary-b", 150))
    new_again = asyncio.run(next_turns(new))
    rs.set_canary(config, 10)

    assert all(t.error is None for d in (old, old_again, new, new_again) for t in d.values())
    assert 0.04 <= share_10 <= 0.18, share_10
    share_50 = sum(t.model_version == "v14" for t in new.values()) / len(new)
    assert 0.38 <= share_50 <= 0.62, share_50
    would_move = [c for c, t in old.items() if t.model_version == "v13"
                  and split_point(conversation_key(rs.KEY_TEAM, "chat-7b", c)) < 0.5]
    assert would_move  # a plain hash split would have moved these to the canary
    for first, second in ((old, old_again), (new, new_again)):
        changed = [c for c in first if first[c].model_version != second[c].model_version]
        assert changed == [], f"conversations that changed version: {changed}"


def test_shadow_copies_are_about_the_fraction_and_never_reach_a_client(
        routed: RunningStack) -> None:
    shadow = "chat-7b@v15-0"
    before = rs.replica_metric(routed, shadow, REPLICA_REQUESTS, traffic="shadow")
    served_before = rs.replica_metric(routed, shadow, REPLICA_REQUESTS,
                                   traffic="served")

    async def main() -> list[rs.Turn]:
        client = rs.aclient(routed)
        return await rs.gather_limited(
            [partial(rs.stream_turn, client, f"shadow-{i}", [{"role": "user", "content": "hi"}],
                     max_tokens=4, model="chat-7b@v13") for i in range(300)], 40)

    turns = asyncio.run(main())
    assert all(t.error is None and t.model_version == "v13" for t in turns)
    assert all(t.replica_id and t.replica_id.startswith("chat-7b@v13-") for t in turns)
    def held() -> float:
        return sum(rs.replica_metric(routed, shadow, f"modelfleet_replica_{g}")
                   for g in ("running", "queue_depth"))

    rs.wait_for(lambda: held() == 0, 10, "the shadow copies to finish")
    copies = rs.replica_metric(routed, shadow, REPLICA_REQUESTS,
                               traffic="shadow") - before
    assert 300 * SHADOW_FRACTION * 0.6 <= copies <= 300 * SHADOW_FRACTION * 1.4, copies
    assert rs.replica_metric(routed, shadow, REPLICA_REQUESTS,
                          traffic="served") == served_before


def test_a_client_cannot_pick_its_replica(routed: RunningStack) -> None:
    canary = next(p for p in routed.facts["processes"] if p.get("replica_id") == "chat-7b@v14-0")

    async def main() -> rs.Turn:
        client = rs.aclient(routed)
        return await rs.stream_turn(
            client, "forged-1", [{"role": "user", "content": "hi"}], model="chat-7b@v13",
            extra_headers={CONVERSATION_HEADER: "forged-1",
                           "x-gateway-destination-endpoint": f"127.0.0.1:{canary['port']}"})

    turn = asyncio.run(main())
    assert turn.error is None and turn.replica_id and turn.replica_id.startswith("chat-7b@v13-")

"""Trace readers: a slice of the real Azure conversation trace, the conversations added to it,
and the Mooncake JSONL format on a small sample; the synthetic workload's shape."""

from __future__ import annotations

import itertools
import json
import statistics
from pathlib import Path

import pytest

from sim.traces.arrivals import Arrival, TeamMix, TeamShare, expand, runs_for, time_scaled
from sim.traces.azure import AZURE_CONV, ConversationModel, add_conversations, read_azure_csv
from sim.traces.mooncake import read_mooncake_jsonl
from sim.traces.sources import arrivals
from sim.traces.synthetic import CHAT, SEED, chat_arrivals

DATA = Path(__file__).parent / "data"
needs_azure = pytest.mark.skipif(not AZURE_CONV.exists(), reason="shared Azure trace not present")


@needs_azure
def test_azure_slice_reads_times_and_sizes() -> None:
    rows = read_azure_csv(AZURE_CONV, limit=500)
    assert len(rows) == 500
    assert rows[0].time_s == 0 and all(a.time_s <= b.time_s for a, b in itertools.pairwise(rows))
    # the file's first row: 2023-11-16 18:15:46.6805900,374,44; the second 4.3145790 s later
    assert (rows[0].prompt_tokens, rows[0].output_tokens) == (374, 44)
    assert rows[1].time_s == pytest.approx(4.314579, abs=1e-6)
    assert 500 < statistics.mean(a.prompt_tokens for a in rows) < 2500


def test_azure_reader_refuses_other_files(tmp_path: Path) -> None:
    bad = tmp_path / "x.csv"
    bad.write_text("a,b,c\n1,2,3\n")
    with pytest.raises(ValueError, match="not an Azure trace"):
        read_azure_csv(bad)
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,abc,3\n")
    with pytest.raises(ValueError, match=r"x.csv:2"):
        read_azure_csv(bad)


def _trace() -> list[Arrival]:
    return [Arrival(float(i), 200 + 300 * (i % 7), 50 + i % 13) for i in range(400)]


def test_added_conversations_reuse_the_history_as_a_prompt_prefix() -> None:
    out = list(add_conversations(_trace(), ConversationModel(turns=4, min_gap_s=2), seed=3))
    by_conv: dict[str, list[Arrival]] = {}
    for a in out:
        assert a.conversation_id is not None
        by_conv.setdefault(a.conversation_id, []).append(a)
    # a continuation must be longer than its history, so fewer than the 3 in 4 asked for continue
    assert 100 < len(by_conv) < 300
    continued = 0
    for turns in by_conv.values():
        assert turns[0].history_tokens == 0
        for prev, nxt in itertools.pairwise(turns):
            history = prev.prompt_tokens + prev.output_tokens
            assert nxt.history_tokens == history < nxt.prompt_tokens
            assert nxt.time_s - prev.time_s >= 2
            shared = history // 16
            assert expand(nxt.blocks)[:shared] == expand(prev.blocks)[:shared]
            continued += 1
    assert continued == 400 - len(by_conv) and continued > 100
    again = list(add_conversations(_trace(), ConversationModel(turns=4, min_gap_s=2), seed=3))
    assert again == out
    assert list(add_conversations(_trace(), ConversationModel(turns=4, min_gap_s=2), seed=4)) != out


def test_mooncake_sample_keys_history_and_blocks() -> None:
    rows = read_mooncake_jsonl(DATA / "mooncake_sample.jsonl")
    assert len(rows) == 34 and rows[0].time_s == 0 and rows[1].time_s == pytest.approx(0.7)
    raw = [line for line in (DATA / "mooncake_sample.jsonl").read_text().splitlines() if line]
    ids = [json.loads(line)["hash_ids"] for line in raw]
    # the sample's conversations: requests sharing their third hash id (after a 2-block system prompt)
    conversation = {i: tuple(h[2:3]) for i, h in enumerate(ids)}
    keys: dict[tuple[int, ...], set[str | None]] = {}
    for i, a in enumerate(rows):
        keys.setdefault(conversation[i], set()).add(a.conversation_id)
    assert len(keys) == 10 and all(len(k) == 1 for k in keys.values())
    assert len({next(iter(k)) for k in keys.values()}) == 10
    first, later = rows[0], next(r for i, r in enumerate(rows) if i and conversation[i] == conversation[0])
    assert first.history_tokens == 0 or first.history_tokens == 1024
    assert later.history_tokens >= 1536
    # a hash id is 32 engine blocks; the prompt's partial last block and the answer are the request's own
    assert len(expand(first.blocks)) == (first.prompt_tokens + first.output_tokens) // 16
    assert expand(first.blocks)[:32] == expand(rows[2].blocks)[:32]  # same system prompt (100, 101)


def test_mooncake_reader_refuses_bad_lines(tmp_path: Path) -> None:
    bad = tmp_path / "m.jsonl"
    bad.write_text('{"timestamp": 1, "input_length": 0, "output_length": 3, "hash_ids": []}\n')
    with pytest.raises(ValueError, match="positive"):
        read_mooncake_jsonl(bad)
    bad.write_text("not json\n")
    with pytest.raises(ValueError, match="invalid JSON"):
        read_mooncake_jsonl(bad)


def test_runs_for_keeps_shared_runs_inside_the_prompt() -> None:
    assert runs_for([(1000, 4)], 50, 100, 16, shared_tokens=40) == ((1000, 2), (52, 4))
    assert runs_for([(1000, 4)], 50, 40, 16) == ((1000, 2),)


def test_synthetic_presets_have_the_seeds_shape() -> None:
    for preset in (CHAT, SEED):
        xs = list(chat_arrivals(preset, 120.0, seed=5))
        assert len(xs) / 120 == pytest.approx(100, rel=0.1)
        assert statistics.mean(a.prompt_tokens for a in xs) == pytest.approx(1200, rel=0.06)
        assert statistics.mean(a.output_tokens for a in xs) == pytest.approx(300, rel=0.03)
        assert all(a.time_s < b.time_s for a, b in itertools.pairwise(xs))
    assert list(chat_arrivals(CHAT, 30.0, seed=5)) == list(chat_arrivals(CHAT, 30.0, seed=5))


def test_synthetic_history_grows_turn_by_turn() -> None:
    turns: dict[str, list[Arrival]] = {}
    for a in chat_arrivals(CHAT, 300.0, seed=2):
        turns.setdefault(a.conversation_id or "", []).append(a)
    full = [t for t in turns.values() if len(t) == CHAT.turns]
    assert full
    for t in full:
        for prev, nxt in itertools.pairwise(t):
            assert nxt.history_tokens == prev.prompt_tokens + prev.output_tokens
            assert nxt.time_s - prev.time_s >= CHAT.answer_overhead_s
            k = prev.prompt_tokens // 16
            assert expand(nxt.blocks)[:k] == expand(prev.blocks)[:k]
    # every conversation of a team opens with the team's system prompt
    heads = {(a.team, expand(a.blocks)[0]) for t in full for a in t}
    assert len(heads) == len({team for team, _ in heads})


def test_sources_scale_the_azure_trace_and_assign_teams() -> None:
    if not AZURE_CONV.exists():
        pytest.skip("shared Azure trace not present")
    mix = TeamMix((TeamShare("a", "interactive", 1), TeamShare("b", "batch", 1)))
    xs = list(arrivals(str(AZURE_CONV), 50.0, 20.0, seed=1, mix=mix))
    assert len(xs) / 20 == pytest.approx(50, rel=0.3)
    assert {a.team for a in xs} == {"a", "b"}
    assert all(a.conversation_id for a in xs)
    assert list(time_scaled(xs[:3], 2.0))[2].time_s == pytest.approx(xs[2].time_s / 2)
    with pytest.raises(ValueError, match="unknown trace"):
        arrivals("nope", None, 10.0, 1)

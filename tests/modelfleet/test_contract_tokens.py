"""Tokenizer, chat template, deterministic answers and engine parameters."""

from __future__ import annotations

import json

import pytest

from modelfleet.contract import tokens
from replica.generation import MAX_NATURAL_TOKENS, MIN_NATURAL_TOKENS, plan_output
from replica.params import CHAT_7B, GB, REASON_70B, EngineParams, params_from_json, preset
from replica.workload import seed_shape_messages


def test_tokenizer_counts_words_and_punctuation() -> None:
    assert tokens.pieces("Hello, world!") == ["Hello", ",", "world", "!"]
    assert tokens.count("Hello, world!") == 4
    assert tokens.count("") == 0
    assert tokens.encode("a b") == tokens.encode("a   b")
    assert tokens.encode("cache") == [tokens.token_id("cache")]


def test_chat_template_adds_a_few_tokens_per_message() -> None:
    one = tokens.chat_prompt_ids([("user", "How big is the cache?")])
    assert len(one) == tokens.count("How big is the cache?") + tokens.MESSAGE_OVERHEAD_TOKENS + \
        tokens.GENERATION_PROMPT_TOKENS
    two = tokens.chat_prompt_ids([("system", "Be brief."), ("user", "How big is the cache?")])
    assert len(two) == len(one) + 3 + tokens.MESSAGE_OVERHEAD_TOKENS


def test_block_hashes_chain_over_full_blocks() -> None:
    ids = list(range(50))
    h = tokens.block_hashes(ids, 16)
    assert len(h) == 3
    assert tokens.block_hashes(ids[:40], 16) == h[:2]
    changed = tokens.block_hashes([999, *ids[1:]], 16)
    assert all(a != b for a, b in zip(h, changed, strict=True))  # a change early changes every later hash


def test_seed_shape_prompts_have_the_seed_sizes() -> None:
    first = seed_shape_messages(0, 0)
    again = seed_shape_messages(0, 1)
    ids1 = tokens.chat_prompt_ids((m["role"], m["content"]) for m in first)
    ids2 = tokens.chat_prompt_ids((m["role"], m["content"]) for m in again)
    assert len(ids1) == len(ids2) == 1200
    assert ids1[:800] == ids2[:800] and ids1 != ids2  # the 800-token opening repeats
    new_conversation = seed_shape_messages(0, 5)
    assert new_conversation[0] != first[0]


PROMPT = tokens.chat_prompt_ids([("user", "Tell me about prefix caches.")])


def test_same_prompt_and_seed_give_the_same_answer() -> None:
    a = plan_output(PROMPT, max_tokens=1000, seed=7)
    assert a == plan_output(PROMPT, max_tokens=1000, seed=7)
    assert a.text != plan_output(PROMPT, max_tokens=1000, seed=8).text
    # Greedy decoding ignores the seed.
    assert plan_output(PROMPT, max_tokens=50, seed=1, temperature=0).text == \
        plan_output(PROMPT, max_tokens=50, seed=2, temperature=0).text


def test_natural_answers_end_with_the_end_token_within_the_documented_range() -> None:
    lengths = []
    for seed in range(40):
        plan = plan_output(PROMPT, max_tokens=4000, seed=seed)
        assert plan.finish_reason == "stop" and plan.stop_reason is None
        assert plan.token_ids[-1] == tokens.EOS_TOKEN_ID
        assert plan.text.endswith(".")
        assert tokens.count(plan.text) == plan.num_tokens - 1  # the end token has no text
        lengths.append(plan.num_tokens)
    assert min(lengths) >= MIN_NATURAL_TOKENS and max(lengths) <= MAX_NATURAL_TOKENS
    assert 200 < sum(lengths) / len(lengths) < 400


def test_max_tokens_ends_with_length_and_ignore_eos_fills_it() -> None:
    plan = plan_output(PROMPT, max_tokens=7, seed=1)
    assert (plan.num_tokens, plan.finish_reason) == (7, "length")
    assert tokens.count(plan.text) == 7
    full = plan_output(PROMPT, max_tokens=900, seed=1, ignore_eos=True)
    assert (full.num_tokens, full.finish_reason) == (900, "length")
    assert plan_output(PROMPT, max_tokens=900, seed=1, min_tokens=600).num_tokens >= 601


def test_deltas_rebuild_the_text() -> None:
    plan = plan_output(PROMPT, max_tokens=60, seed=3)
    assert "".join(plan.deltas) == plan.text
    assert len(plan.deltas) == plan.num_tokens


def test_stop_string_is_cut_and_never_half_streamed() -> None:
    base = plan_output(PROMPT, max_tokens=200, seed=3, ignore_eos=True)
    words = base.text.split()
    stop = f"{words[5]} {words[6]}"
    plan = plan_output(PROMPT, max_tokens=200, seed=3, stop=["zzz-never", stop], ignore_eos=True)
    assert plan.finish_reason == "stop" and plan.stop_reason == stop
    assert stop not in plan.text and base.text.startswith(plan.text)
    assert plan.num_tokens < 200
    # The streamed pieces add up to the cut text: the stop string's first word, generated a token
    # before the stop completed, was held back and never sent.
    assert "".join(plan.deltas) == plan.text


def test_presets_hold_the_seed_figures() -> None:
    assert CHAT_7B.weights_bytes == 14 * GB and CHAT_7B.kv_bytes_per_token == 131_072
    assert (CHAT_7B.capacity_tokens_per_s, CHAT_7B.capacity_streams) == (2500, 83)
    assert REASON_70B.kv_bytes_per_token == 80 * 8 * 128 * 2 * 2
    assert (REASON_70B.num_gpus, REASON_70B.capacity_tokens_per_s, REASON_70B.capacity_streams) == (2, 400, 20)
    # 0.9 x 80 GB - 14 GB of weights = 58 GB of KV cache: about 442,000 tokens.
    assert CHAT_7B.kv_capacity_tokens == 442_504
    assert REASON_70B.kv_capacity_tokens == int((0.9 * 160 * GB - 70 * GB) // 327_680)
    # The calibrated read rate stays under an A100's 2.0 TB/s.
    assert 1.0e12 < CHAT_7B.decode_bandwidth_bytes_per_s < 2.0e12
    assert preset("reason-70b") is REASON_70B
    with pytest.raises(ValueError):
        preset("gpt-5")


def test_params_from_plain_numbers_and_json_overrides() -> None:
    p = EngineParams(weights_bytes=16 * GB, kv_bytes_per_token=131_072, capacity_tokens_per_s=2000,
                     capacity_streams=64, gpu_memory_bytes=80 * GB)
    assert p.num_blocks == p.kv_capacity_tokens // 16
    q = params_from_json(json.dumps({"max_num_seqs": 128, "capacity_tokens_per_s": 2200}), p)
    assert (q.max_num_seqs, q.capacity_tokens_per_s, q.weights_bytes) == (128, 2200, p.weights_bytes)
    assert EngineParams(**p.to_dict()) == p
    with pytest.raises(ValueError, match="unknown"):
        params_from_json('{"max_num_seq": 1}')
    with pytest.raises(ValueError):
        params_from_json('{"max_num_seqs": "many"}')
    with pytest.raises(ValueError):
        params_from_json("[1]")


def test_impossible_params_are_refused() -> None:
    with pytest.raises(ValueError, match="KV cache"):
        CHAT_7B.with_overrides({"weights_bytes": 75 * GB})
    with pytest.raises(ValueError, match="unreachable"):
        # Prefilling 1,200 uncached tokens per 300 output tokens at 2,500 tokens/s takes all of
        # one GPU's 10,000 prompt tokens/s: the seed's capacity needs its prefix cache.
        CHAT_7B.with_overrides({"calibration_cached_tokens": 0})
    with pytest.raises(ValueError):
        CHAT_7B.with_overrides({"gpu_memory_utilization": 1.5})

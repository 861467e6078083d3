"""The engine model on a manual clock: batching, KV capacity, prefix cache, calibration."""

from __future__ import annotations

import dataclasses

import pytest

from modelfleet.contract.tokens import block_hashes, chat_prompt_ids
from replica.clock import ManualClock
from replica.engine import Engine
from replica.engine_types import EngineRequest, StepResult
from replica.params import CHAT_7B, REASON_70B, EngineParams
from replica.workload import closed_loop


def small_params(**overrides: object) -> EngineParams:
    """chat-7b with a KV cache of ``kv_tokens`` tokens (default 4,096: 256 blocks)."""
    kv_tokens = int(overrides.pop("kv_tokens", 4096))  # type: ignore[call-overload]
    p = CHAT_7B
    # Leave exactly kv_tokens of KV cache after the weights.
    gpu = int((p.weights_bytes + kv_tokens * p.kv_bytes_per_token) / p.gpu_memory_utilization) + 1
    return p.with_overrides({"gpu_memory_bytes": gpu, "max_model_len": min(2048, kv_tokens), **overrides})


def run_until_done(engine: Engine, clock: ManualClock, limit: int = 100_000) -> list[StepResult]:
    steps: list[StepResult] = []
    for _ in range(limit):
        if not engine.has_work:
            return steps
        r = engine.step()
        clock.set(r.end_s)
        steps.append(r)
    raise AssertionError("engine did not drain")


def req(rid: str, prompt: int, output: int, hashes: tuple[int, ...] = ()) -> EngineRequest:
    return EngineRequest(rid, prompt, output, hashes)


def test_step_time_grows_with_batch_and_context() -> None:
    p = CHAT_7B
    one = p.step_seconds(context_tokens=1350, prefill_tokens=0)
    many = p.step_seconds(context_tokens=83 * 1350, prefill_tokens=0)
    longer = p.step_seconds(context_tokens=83 * 4000, prefill_tokens=0)
    assert one < many < longer
    # A step reads the weights even for one sequence: 14 GB at the calibrated bandwidth.
    assert one > p.weights_bytes / p.decode_bandwidth_bytes_per_s
    # Prefill adds time at the prefill rate: 10,000 uncached tokens cost one second.
    assert p.step_seconds(1350, 10_000) - one == pytest.approx(1.0)


def test_engine_steps_get_longer_as_the_batch_grows() -> None:
    clock = ManualClock()
    engine = Engine(CHAT_7B, clock)
    durations = []
    for n in (1, 8, 64):
        for i in range(n):
            engine.add_request(req(f"{n}-{i}", 1000, 50))
        engine.step()  # prefill step
        clock.set(engine.step().start_s)
        durations.append(engine.step().duration_s)
        for i in range(n):
            engine.abort(f"{n}-{i}")
    assert durations[0] < durations[1] < durations[2]


def test_chat_7b_delivers_its_capacity_at_83_streams() -> None:
    result = closed_loop(CHAT_7B, 83, duration_s=60, warmup_s=20)
    assert result.output_tokens_per_s == pytest.approx(2500, rel=0.05)
    assert result.prefix_hit_rate == pytest.approx(640 / 1200, abs=0.03)


def test_reason_70b_delivers_its_capacity_at_20_streams() -> None:
    result = closed_loop(REASON_70B, 20, duration_s=120, warmup_s=30)
    assert result.output_tokens_per_s == pytest.approx(400, rel=0.05)


def test_fewer_streams_give_fewer_tokens_but_faster_streams() -> None:
    low = closed_loop(CHAT_7B, 20, duration_s=30, warmup_s=15)
    high = closed_loop(CHAT_7B, 83, duration_s=30, warmup_s=15)
    assert low.output_tokens_per_s < high.output_tokens_per_s
    assert low.itl_p50_s < high.itl_p50_s


def test_kv_capacity_limits_the_running_batch() -> None:
    p = small_params(kv_tokens=4096)  # 256 blocks
    clock = ManualClock()
    engine = Engine(p, clock)
    for i in range(10):
        engine.add_request(req(str(i), 1000, 100))  # 63 blocks each at admission
    engine.step()
    stats = engine.stats()
    assert stats.running == 4
    assert stats.waiting == 6
    assert stats.kv_usage > 0.95
    # Requests wait their turn and all finish.
    steps = run_until_done(engine, clock)
    assert sum(o.finished for s in steps for o in s.outputs) == 10
    assert engine.stats().kv_usage == 0.0


def test_max_num_seqs_limits_the_running_batch() -> None:
    clock = ManualClock()
    engine = Engine(CHAT_7B.with_overrides({"max_num_seqs": 3}), clock)
    for i in range(5):
        engine.add_request(req(str(i), 100, 10))
    engine.step()
    assert (engine.stats().running, engine.stats().waiting) == (3, 2)


def test_a_full_cache_preempts_the_newest_request_which_later_finishes() -> None:
    p = small_params(kv_tokens=1024)  # 64 blocks
    clock = ManualClock()
    engine = Engine(p, clock)
    engine.add_request(req("old", 480, 400))  # 31 blocks at admission, 55 at the end
    engine.add_request(req("new", 480, 400))
    steps = run_until_done(engine, clock)
    assert "new" in {rid for s in steps for rid in s.preempted}
    finished = [o.request_id for s in steps for o in s.outputs if o.finished]
    assert sorted(finished) == ["new", "old"]
    assert engine.stats().preemptions >= 1


def conversation(turns: int) -> list[tuple[str, str]]:
    """A system prompt, then ``turns`` user questions with the assistant's answers between them."""
    messages = [("system", "You are a helpful assistant. " * 40)]
    for t in range(turns):
        if t:
            messages.append(("assistant", f"Answer {t}: " + "caches keep things close. " * 15))
        messages.append(("user", f"Question number {t}: " + "tell me more about caches. " * 20))
    return messages


def serve_one(engine: Engine, clock: ManualClock, rid: str, ids: list[int], output: int = 20) -> tuple[int, float]:
    """(cached tokens, TTFT seconds) of one request on an idle engine."""
    engine.add_request(EngineRequest(rid, len(ids), output, block_hashes(ids, 16)))
    steps = run_until_done(engine, clock)
    cached = next(a.cached_tokens for s in steps for a in s.admitted if a.request_id == rid)
    ttft = next(o.interval_s for s in steps for o in s.outputs if o.request_id == rid and o.index == 0)
    return cached, ttft


def test_next_turn_of_a_conversation_hits_the_prefix_cache() -> None:
    clock = ManualClock()
    engine = Engine(CHAT_7B, clock)
    first = chat_prompt_ids(conversation(2))
    second = chat_prompt_ids(conversation(3))  # the same messages plus an answer and a question
    assert second[: len(first)] == first
    cached1, ttft1 = serve_one(engine, clock, "turn1", first)
    cached2, ttft2 = serve_one(engine, clock, "turn2", second)
    assert cached1 == 0
    assert cached2 >= (len(first) // 16) * 16
    assert ttft2 < ttft1
    stats = engine.stats()
    assert stats.prefix_cache_hits == cached2
    assert stats.prefix_cache_queries == len(first) + len(second)


def test_prefix_cache_can_be_disabled() -> None:
    clock = ManualClock()
    engine = Engine(CHAT_7B.with_overrides({"enable_prefix_caching": False}), clock)
    ids = chat_prompt_ids(conversation(1))
    serve_one(engine, clock, "a", ids)
    assert serve_one(engine, clock, "b", ids)[0] == 0


def test_an_identical_prompt_recomputes_its_last_token() -> None:
    clock = ManualClock()
    engine = Engine(CHAT_7B, clock)
    ids = list(range(320))  # exactly 20 blocks
    serve_one(engine, clock, "a", ids)
    assert serve_one(engine, clock, "b", ids)[0] == 304


def test_least_recently_used_prefix_is_evicted_first() -> None:
    p = small_params(kv_tokens=2048)  # 128 blocks
    clock = ManualClock()
    engine = Engine(p, clock)
    prompts = {name: [hash((name, i)) & 0xFFFF for i in range(800)] for name in "ABC"}  # 50 blocks each
    for name in "AB":
        serve_one(engine, clock, name, prompts[name], output=1)
    serve_one(engine, clock, "A again", prompts["A"], output=1)  # A is now more recent than B
    serve_one(engine, clock, "C", prompts["C"], output=1)  # needs 51 blocks: evicts B's, not A's
    assert serve_one(engine, clock, "A third", prompts["A"], output=1)[0] == 784
    assert serve_one(engine, clock, "B again", prompts["B"], output=1)[0] < 784


def test_blocks_in_use_are_never_evicted() -> None:
    p = small_params(kv_tokens=1024)  # 64 blocks
    clock = ManualClock()
    engine = Engine(p, clock)
    a = list(range(480))
    engine.add_request(EngineRequest("long", 480, 300, block_hashes(a, 16)))
    engine.step()
    engine.add_request(EngineRequest("other", 480, 5, block_hashes([x + 10_000 for x in a], 16)))
    run_until_done(engine, clock)
    # The running request's prompt blocks survived the other's allocation.
    assert serve_one(engine, clock, "again", a, output=1)[0] == 464


def test_tokens_in_flight_count_prompt_and_remaining_output() -> None:
    clock = ManualClock()
    engine = Engine(CHAT_7B.with_overrides({"max_num_seqs": 1}), clock)
    engine.add_request(req("a", 1200, 300))
    engine.add_request(req("b", 800, 100))
    assert engine.stats().tokens_in_flight == 1500 + 900
    engine.step()  # a admitted, first token
    assert engine.stats().tokens_in_flight == 1499 + 900
    for _ in range(9):
        engine.step()
    assert engine.stats().tokens_in_flight == 1490 + 900
    engine.abort("b")
    assert engine.stats().tokens_in_flight == 1490
    run_until_done(engine, clock)
    assert engine.stats().tokens_in_flight == 0


def test_abort_frees_the_kv_cache_and_leaves_the_batch() -> None:
    clock = ManualClock()
    engine = Engine(CHAT_7B, clock)
    engine.add_request(req("a", 1000, 500))
    engine.add_request(req("b", 1000, 500))
    engine.step()
    used = engine.stats().kv_usage
    assert engine.abort("a")
    stats = engine.stats()
    assert stats.running == 1 and stats.kv_usage < used
    assert not engine.abort("a")
    assert {o.request_id for o in engine.step().outputs} == {"b"}


def test_ttft_includes_queueing_and_first_token_comes_from_the_prefill_step() -> None:
    clock = ManualClock(100.0)
    engine = Engine(CHAT_7B, clock)
    engine.add_request(req("a", 1000, 3))
    r = engine.step()
    assert r.start_s == 100.0
    (out,) = r.outputs
    assert out.index == 0 and out.interval_s == pytest.approx(r.duration_s)
    assert r.prefill_tokens == 1000
    clock.set(r.end_s)
    r2 = engine.step()
    assert r2.outputs[0].interval_s == pytest.approx(r2.duration_s)
    clock.set(r2.end_s)
    r3 = engine.step()
    assert r3.outputs[0].finished
    assert r3.outputs[0].e2e_s == pytest.approx(r3.end_s - 100.0)


def test_steps_never_overlap_even_if_the_clock_is_not_advanced() -> None:
    clock = ManualClock()
    engine = Engine(CHAT_7B, clock)
    engine.add_request(req("a", 100, 5))
    r1 = engine.step()
    r2 = engine.step()
    assert r2.start_s == r1.end_s


def test_requests_that_can_never_fit_are_refused() -> None:
    engine = Engine(CHAT_7B, ManualClock())
    with pytest.raises(ValueError):
        engine.add_request(req("big", 8000, 500))
    engine.add_request(req("x", 10, 10))
    with pytest.raises(ValueError):
        engine.add_request(req("x", 10, 10))


def test_engine_params_are_plain_data() -> None:
    # Everything a simulator needs to rebuild the engine is in the dataclass fields.
    fields = {f.name for f in dataclasses.fields(EngineParams)}
    assert {"weights_bytes", "kv_bytes_per_token", "gpu_memory_bytes", "gpu_memory_utilization", "num_gpus",
            "prefill_tokens_per_s_per_gpu", "max_num_seqs", "block_size", "max_model_len",
            "capacity_tokens_per_s", "capacity_streams"} <= fields

"""The engine's fast path against the engine it replaced: same admissions, tokens, TTFTs, cached
tokens, preemptions and step times, with and without a record per token.

``_Reference`` is the engine before step counting (each running sequence updated every step),
kept only here, verbatim but for docstrings, as the definition the fast path must match.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from collections.abc import Callable

import pytest

from modelfleet.contract.tokens import block_hashes, chat_prompt_ids
from replica.clock import ManualClock
from replica.engine import Engine
from replica.engine_types import Admission, EngineRequest, EngineStats, StepResult, TokenOutput
from replica.kv_cache import BlockPool
from replica.params import CHAT_7B, EngineParams
from replica.workload import closed_loop, seed_shape_messages


class _RefSeq:
    __slots__ = ("arrival_s", "blocks", "cached_tokens", "generated", "last_token_s", "queued_since",
                 "registered", "req", "running")

    def __init__(self, req: EngineRequest, arrival_s: float) -> None:
        self.req, self.arrival_s, self.queued_since = req, arrival_s, arrival_s
        self.running = False
        self.blocks: list[int] = []
        self.generated = self.registered = 0
        self.cached_tokens: int | None = None
        self.last_token_s = arrival_s

    @property
    def length(self) -> int:
        return self.req.prompt_tokens + self.generated


class _Reference:
    def __init__(self, params: EngineParams, clock: ManualClock) -> None:
        self.params, self.clock = params, clock
        self.pool = BlockPool(params.num_blocks, params.enable_prefix_caching)
        self._bandwidth = params.decode_bandwidth_bytes_per_s
        self._waiting: deque[_RefSeq] = deque()
        self._running: list[_RefSeq] = []
        self._seqs: dict[str, _RefSeq] = {}
        self._busy_until = float("-inf")
        self._queries = self._hits = self._prompt = self._generated = 0
        self._preemptions = self._finished = 0

    def add_request(self, request: EngineRequest, arrival_s: float) -> None:
        seq = _RefSeq(request, arrival_s)
        self._seqs[request.request_id] = seq
        self._waiting.append(seq)

    def abort(self, request_id: str) -> bool:
        seq = self._seqs.pop(request_id, None)
        if seq is None:
            return False
        if seq.running:
            self._running.remove(seq)
            self.pool.release(seq.blocks)
            seq.blocks, seq.running = [], False
        else:
            self._waiting.remove(seq)
        return True

    @property
    def has_work(self) -> bool:
        return bool(self._seqs)

    def step(self) -> StepResult:
        start = max(self.clock.now(), self._busy_until)
        preempted = self._reserve_decode_slots(start)
        admitted = () if preempted else self._admit(start)
        batch = list(self._running)
        context = sum(s.length for s in batch)
        prefill = sum(a.prefill_tokens for a in admitted)
        end = start + (self.params.step_seconds(context, prefill, self._bandwidth) if batch else 0.0)
        outputs = [self._emit(s, end) for s in batch]
        self._busy_until = end
        return StepResult(start, end, context, prefill, admitted, tuple(outputs), preempted)

    def stats(self) -> EngineStats:
        in_flight = sum(s.req.prompt_tokens + s.req.output_tokens - s.generated for s in self._seqs.values())
        return EngineStats(len(self._running), len(self._waiting), self.pool.usage, in_flight, self._queries,
                           self._hits, self._prompt, self._generated, self._preemptions, self._finished)

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.params.block_size)

    def _reserve_decode_slots(self, now: float) -> tuple[str, ...]:
        preempted: list[str] = []
        for seq in list(self._running):
            if not seq.running or len(seq.blocks) >= self._blocks_for(seq.length + 1):
                continue
            while self.pool.num_free == 0:
                victim = self._running.pop()
                self.pool.release(victim.blocks)
                victim.blocks, victim.registered, victim.running = [], 0, False
                victim.queued_since = now
                self._waiting.appendleft(victim)
                self._preemptions += 1
                preempted.append(victim.req.request_id)
                if victim is seq:
                    break
            if seq.running:
                seq.blocks += self.pool.allocate(1)
        return tuple(preempted)

    def _admit(self, now: float) -> tuple[Admission, ...]:
        p, bs = self.params, self.params.block_size
        budget = p.max_num_batched_tokens - len(self._running)
        used = 0
        out: list[Admission] = []
        while self._waiting and len(self._running) < p.max_num_seqs:
            seq = self._waiting[0]
            length = seq.length
            hits = self.pool.cached_prefix(seq.req.block_hashes[: length // bs])
            if len(hits) * bs >= length:
                hits = hits[:-1]
            cached = len(hits) * bs
            need = self._blocks_for(length + 1) - len(hits)
            if out and used + length - cached > budget:
                break
            if self.pool.num_free - self.pool.count_free(hits) < need:
                break
            self.pool.acquire(hits)
            seq.blocks = hits + self.pool.allocate(need)
            seq.registered = len(hits)
            self._waiting.popleft()
            self._running.append(seq)
            seq.running = True
            first = seq.cached_tokens is None
            if first:
                seq.cached_tokens = cached
                self._prompt += seq.req.prompt_tokens
            self._queries += length
            self._hits += cached
            used += length - cached
            out.append(Admission(seq.req.request_id, cached, length - cached, now - seq.queued_since, first))
        return tuple(out)

    def _emit(self, seq: _RefSeq, end: float) -> TokenOutput:
        seq.generated += 1
        interval = end - (seq.arrival_s if seq.generated == 1 else seq.last_token_s)
        seq.last_token_s = end
        self._generated += 1
        self._register_full_blocks(seq)
        index = seq.generated - 1
        if seq.generated < seq.req.output_tokens:
            return TokenOutput(seq.req.request_id, index, False, interval)
        self._running.remove(seq)
        del self._seqs[seq.req.request_id]
        self.pool.release(seq.blocks)
        seq.blocks, seq.running = [], False
        self._finished += 1
        return TokenOutput(seq.req.request_id, index, True, interval, end - seq.arrival_s)

    def _register_full_blocks(self, seq: _RefSeq) -> None:
        hashes = seq.req.block_hashes
        full = min(seq.length // self.params.block_size, len(hashes), len(seq.blocks))
        for i in range(seq.registered, full):
            self.pool.register(seq.blocks[i], hashes[i])
        seq.registered = max(seq.registered, full)


Source = Callable[[float, list[str]], list[tuple[float, EngineRequest]]]
"""Called after each step with its end and the requests it finished; returns new arrivals."""


def drive(mode: str, params: EngineParams, first: list[tuple[float, EngineRequest]], source: Source,
          until_s: float, abort_every: int = 0) -> tuple[list[StepResult], list[EngineStats]]:
    """Steps of the reference engine (``ref``) or the engine with ``detail`` or ``fast`` steps,
    with the arrivals of ``source``; every ``abort_every`` steps the oldest request held is aborted."""
    clock = ManualClock()
    engine: Engine | _Reference = _Reference(params, clock) if mode == "ref" else Engine(params, clock)
    order = iter(range(1 << 30))  # ties in time keep their order
    pending = [(t, next(order), r) for t, r in first]
    heapq.heapify(pending)
    held: dict[str, None] = {}
    steps: list[StepResult] = []
    stats: list[EngineStats] = []
    while clock.now() < until_s and (pending or engine.has_work):
        while pending and pending[0][0] <= clock.now():
            t, _, req = heapq.heappop(pending)
            engine.add_request(req, t)
            held[req.request_id] = None
        if not engine.has_work:
            clock.set(pending[0][0])
            continue
        if abort_every and len(steps) % abort_every == abort_every - 1:
            assert engine.abort(next(iter(held)))
            del held[next(iter(held))]
        r = engine.step(detail=mode == "detail") if isinstance(engine, Engine) else engine.step()
        clock.set(r.end_s)
        done = [o.request_id for o in r.outputs if o.finished] if mode != "fast" else [f.request_id for f in r.finished]
        for rid in done:
            del held[rid]
        for t, req in source(r.end_s, done):
            heapq.heappush(pending, (t, next(order), req))
        steps.append(r)
        if len(steps) % 50 == 0:
            stats.append(engine.stats())
    stats.append(engine.stats())
    return steps, stats


def assert_same_runs(params: EngineParams, first: Callable[[], list[tuple[float, EngineRequest]]],
                     source: Callable[[], Source], until_s: float, abort_every: int = 0) -> list[StepResult]:
    ref, ref_stats = drive("ref", params, first(), source(), until_s, abort_every)
    detail, detail_stats = drive("detail", params, first(), source(), until_s, abort_every)
    fast, fast_stats = drive("fast", params, first(), source(), until_s, abort_every)
    assert len(ref) == len(detail) == len(fast)
    assert ref_stats == detail_stats == fast_stats
    for i, (r, d, f) in enumerate(zip(ref, detail, fast, strict=True)):
        old = (r.start_s, r.end_s, r.context_tokens, r.prefill_tokens, r.admitted, r.outputs, r.preempted)
        assert old == (d.start_s, d.end_s, d.context_tokens, d.prefill_tokens, d.admitted, d.outputs,
                       d.preempted), f"step {i}"
        assert f.outputs == ()
        assert f == StepResult(d.start_s, d.end_s, d.context_tokens, d.prefill_tokens, d.admitted, (), d.preempted,
                               d.tokens, d.first_tokens, d.finished), f"step {i}"
        # The summary says what the records say: one token per record, TTFTs, finishes.
        assert f.tokens == len(r.outputs)
        assert [(t.request_id, t.ttft_s) for t in f.first_tokens] == [
            (o.request_id, o.interval_s) for o in r.outputs if o.index == 0]
        assert [(x.request_id, x.output_tokens, x.e2e_s) for x in f.finished] == [
            (o.request_id, o.index + 1, o.e2e_s) for o in r.outputs if o.finished]
    return fast


def seed_shape_loop(params: EngineParams, streams: int) -> tuple[Callable[[], list[tuple[float, EngineRequest]]],
                                                                   Callable[[], Source]]:
    """``replica.workload.closed_loop``'s streams: the next request when the previous answer ends."""
    def request(s: int, n: int) -> EngineRequest:
        ids = chat_prompt_ids((m["role"], m["content"]) for m in seed_shape_messages(s, n))
        out = 300 + random.Random(f"{s}/{n}").randint(-100, 100)
        return EngineRequest(f"{s}/{n}", len(ids), out, block_hashes(ids, params.block_size))

    def first() -> list[tuple[float, EngineRequest]]:
        return [(s * 10.0 / streams, request(s, s % 5)) for s in range(streams)]

    def source() -> Source:
        def next_turns(end_s: float, done: list[str]) -> list[tuple[float, EngineRequest]]:
            return [(end_s, request(int(s), int(n) + 1)) for s, n in (rid.split("/") for rid in done)]
        return next_turns

    return first, source


def small_kv(kv_tokens: int, **overrides: object) -> EngineParams:
    p = CHAT_7B
    gpu = int((p.weights_bytes + kv_tokens * p.kv_bytes_per_token) / p.gpu_memory_utilization) + 1
    return p.with_overrides({"gpu_memory_bytes": gpu, "max_model_len": min(4096, kv_tokens), **overrides})


def test_closed_loop_at_capacity_matches_the_reference() -> None:
    first, source = seed_shape_loop(CHAT_7B, 83)
    steps = assert_same_runs(CHAT_7B, first, source, until_s=40.0)
    assert sum(len(s.finished) for s in steps) > 100
    assert sum(a.cached_tokens for s in steps for a in s.admitted) > 0


def test_closed_loop_on_a_small_cache_preempts_like_the_reference() -> None:
    params = small_kv(16_384)  # 1,024 blocks for 40 streams of about 1,350 tokens
    first, source = seed_shape_loop(params, 40)
    steps = assert_same_runs(params, first, source, until_s=40.0, abort_every=97)
    assert sum(len(s.preempted) for s in steps) > 10
    assert sum(not a.first for s in steps for a in s.admitted) > 10


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_open_loop_trace_matches_the_reference(seed: int) -> None:
    # Shared prefixes (some a whole number of blocks), one-token answers, a tight step budget and
    # batch, a cache small enough to evict and preempt, and aborts.
    params = small_kv(4096, max_num_seqs=24, max_num_batched_tokens=1024)
    rng = random.Random(seed)
    prefixes = [[rng.randrange(1 << 20) for _ in range(rng.choice([16, 48, 160, 200]))] for _ in range(6)]
    arrivals: list[tuple[float, EngineRequest]] = []
    t = 0.0
    for i in range(400):
        t += rng.expovariate(20.0)
        ids = rng.choice(prefixes) + [rng.randrange(1 << 20) for _ in range(rng.choice([0, 1, 15, 16, 17, 300]))]
        out = rng.choice([1, 2, 15, 16, 17, rng.randint(1, 400), rng.randint(400, 1000)])
        if len(ids) + out <= params.max_model_len:
            arrivals.append((t, EngineRequest(f"r{i}", len(ids), out, block_hashes(ids + [i] * out, 16))))

    def source() -> Source:
        return lambda end_s, done: []

    steps = assert_same_runs(params, lambda: list(arrivals), source, until_s=1e9, abort_every=61)
    assert sum(len(s.preempted) for s in steps) > 0
    assert sum(a.cached_tokens for s in steps for a in s.admitted) > 0


def test_closed_loop_figures_are_those_of_the_engine_before_step_counting() -> None:
    # Captured from the reference engine: closed_loop reads every token's record.
    r = closed_loop(CHAT_7B, 83, duration_s=30, warmup_s=10)
    assert (r.requests, r.prefix_hit_rate) == (234, 0.5338983050847458)
    assert r.output_tokens_per_s == pytest.approx(2614.4333333333334, rel=1e-12)
    assert (r.ttft_p50_s, r.ttft_p95_s) == pytest.approx((0.0579299285686794, 0.21768951475583975), rel=1e-12)
    assert (r.itl_p50_s, r.itl_p95_s) == pytest.approx((0.01775123292868841, 0.0979462910610156), rel=1e-12)

"""The continuous-batching engine model: who runs in each step and how long the step takes (pure).

One ``step()`` is one engine iteration, as in vLLM's V1 scheduler:

1. every running sequence gets a KV slot for the token it decodes; when no block is free the
   most recently admitted sequence is preempted (its blocks released, it goes back to the front
   of the queue and later recomputes, helped by the prefix cache);
2. waiting requests are admitted first come, first served while the batch has fewer than
   ``max_num_seqs`` sequences, the step's token budget allows, and the KV cache has blocks for
   the prompt minus its cached prefix; the first that does not fit stops admission;
3. the step lasts ``EngineParams.step_seconds`` of its KV reads and its uncached prefill
   tokens, and every sequence in the batch produces one token at its end (an admitted request
   its first token: prefill and first token come from the same step).

The engine reads the time from an injected clock, never sleeps and never touches I/O. Its driver
(the HTTP server, or a discrete-event simulator) calls ``step()``, waits until ``end_s``, and
delivers the step's tokens. All times are model seconds.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from replica.clock import Clock
from replica.kv_cache import BlockPool
from replica.params import EngineParams


@dataclass(frozen=True)
class EngineRequest:
    """What the engine needs to know about a request: sizes and the prefix-cache keys."""

    request_id: str
    prompt_tokens: int
    output_tokens: int
    """Tokens this request will generate (the answer was planned on arrival)."""
    block_hashes: tuple[int, ...] = ()
    """Chained hashes of the full blocks of prompt plus output tokens, in order."""


@dataclass(frozen=True)
class Admission:
    """A request entering the batch in a step."""

    request_id: str
    cached_tokens: int
    """Tokens of its context the prefix cache held."""
    prefill_tokens: int
    """Tokens computed in the step (context minus cached)."""
    queued_s: float
    """Seconds from arrival (or preemption) to admission."""
    first: bool
    """False when a preempted request comes back."""


@dataclass(frozen=True)
class TokenOutput:
    """One output token of one request, produced at the end of a step."""

    request_id: str
    index: int
    """0 for the first token."""
    finished: bool
    interval_s: float
    """Seconds since arrival for the first token (TTFT), since the previous token otherwise."""
    e2e_s: float | None = None
    """Seconds from arrival to this last token, set only when ``finished``."""


@dataclass(frozen=True)
class StepResult:
    """What one step did, in model seconds."""

    start_s: float
    end_s: float
    context_tokens: int
    """KV-cache tokens the step read, summed over the batch."""
    prefill_tokens: int
    admitted: tuple[Admission, ...] = ()
    outputs: tuple[TokenOutput, ...] = ()
    preempted: tuple[str, ...] = ()

    @property
    def duration_s(self) -> float:
        """Length of the step in seconds."""
        return self.end_s - self.start_s


@dataclass(frozen=True)
class EngineStats:
    """The engine's gauges and cumulative counters at one moment."""

    running: int
    waiting: int
    kv_usage: float
    """Share (0..1) of KV blocks in use."""
    tokens_in_flight: int
    """Prompt plus remaining output tokens of every request held, running or waiting."""
    prefix_cache_queries: int
    """Context tokens looked up in the prefix cache, summed over admissions."""
    prefix_cache_hits: int
    """Of those, tokens found."""
    prompt_tokens: int
    generation_tokens: int
    preemptions: int
    finished: int


class _Seq:
    __slots__ = (
        "arrival_s", "blocks", "cached_tokens", "generated", "last_token_s", "queued_since",
        "registered", "req", "running",
    )

    def __init__(self, req: EngineRequest, arrival_s: float) -> None:
        self.req = req
        self.arrival_s = arrival_s
        self.queued_since = arrival_s
        self.running = False
        self.blocks: list[int] = []
        self.generated = 0
        self.registered = 0  # leading blocks whose hash is in the prefix cache
        self.cached_tokens: int | None = None  # at first admission
        self.last_token_s = arrival_s

    @property
    def length(self) -> int:
        return self.req.prompt_tokens + self.generated


class Engine:
    """One replica's scheduler and KV cache, stepped by a driver on an injected clock."""

    def __init__(self, params: EngineParams, clock: Clock) -> None:
        self.params = params
        self.clock = clock
        self.pool = BlockPool(params.num_blocks, params.enable_prefix_caching)
        self._bandwidth = params.decode_bandwidth_bytes_per_s
        self._waiting: deque[_Seq] = deque()
        self._running: list[_Seq] = []
        self._seqs: dict[str, _Seq] = {}
        self._busy_until = float("-inf")
        self._queries = self._hits = self._prompt = self._generated = 0
        self._preemptions = self._finished = 0

    def add_request(self, request: EngineRequest, arrival_s: float | None = None) -> None:
        """Queue ``request``, which arrived at ``arrival_s`` model seconds (default: now).

        Raises ``ValueError`` if it can never run.
        """
        p = self.params
        if request.request_id in self._seqs:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        if request.prompt_tokens < 1 or request.output_tokens < 1:
            raise ValueError("a request needs at least one prompt token and one output token")
        total = request.prompt_tokens + request.output_tokens
        if total > p.max_model_len or self._blocks_for(total) > p.num_blocks:
            raise ValueError(f"{total} tokens exceed max_model_len {p.max_model_len} or the KV cache")
        seq = _Seq(request, self.clock.now() if arrival_s is None else arrival_s)
        self._seqs[request.request_id] = seq
        self._waiting.append(seq)

    def abort(self, request_id: str) -> bool:
        """Drop a request (client gone): free its KV blocks. False if it is not held."""
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
        """True while any request is running or waiting."""
        return bool(self._seqs)

    def step(self) -> StepResult:
        """Run one iteration starting now (or when the previous one ends, if later)."""
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
        """Gauges and counters now."""
        in_flight = sum(s.req.prompt_tokens + s.req.output_tokens - s.generated for s in self._seqs.values())
        return EngineStats(
            running=len(self._running),
            waiting=len(self._waiting),
            kv_usage=self.pool.usage,
            tokens_in_flight=in_flight,
            prefix_cache_queries=self._queries,
            prefix_cache_hits=self._hits,
            prompt_tokens=self._prompt,
            generation_tokens=self._generated,
            preemptions=self._preemptions,
            finished=self._finished,
        )

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
                hits = hits[:-1]  # the last token must be computed to produce the next one
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

    def _emit(self, seq: _Seq, end: float) -> TokenOutput:
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

    def _register_full_blocks(self, seq: _Seq) -> None:
        hashes = seq.req.block_hashes
        full = min(seq.length // self.params.block_size, len(hashes), len(seq.blocks))
        for i in range(seq.registered, full):
            self.pool.register(seq.blocks[i], hashes[i])
        seq.registered = max(seq.registered, full)

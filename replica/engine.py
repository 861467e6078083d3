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

Cost: a sequence in the batch gains one token per step, so its length is derived from the step
counter instead of being updated. Only what happens at a known future step is scheduled: its
finish, and every ``block_size`` tokens a block boundary (the full block joins the prefix cache,
the next token needs a new block). A step with ``detail=False`` thus costs O(1 + admissions +
finishes + batch / block_size); ``detail=True`` adds one ``TokenOutput`` per sequence.
"""

from __future__ import annotations

from collections import deque

from replica.clock import Clock
from replica.engine_types import (
    Admission,
    EngineRequest,
    EngineStats,
    Finish,
    FirstToken,
    StepResult,
    TokenOutput,
)
from replica.kv_cache import BlockPool
from replica.params import EngineParams

__all__ = [
    "Admission", "Engine", "EngineRequest", "EngineStats", "Finish", "FirstToken", "StepResult",
    "TokenOutput",
]

# Step number -> (admission number, sequence); stale (skipped) once the sequence is readmitted or gone.
_Due = dict[int, list[tuple[int, "_Seq"]]]


class _Seq:
    __slots__ = (
        "adm", "arrival_s", "blocks", "cached_tokens", "generated", "last_token_s", "length0",
        "offset", "queued_since", "registered", "req", "running", "stop",
    )

    def __init__(self, req: EngineRequest, arrival_s: float) -> None:
        self.req = req
        self.arrival_s = arrival_s
        self.queued_since = arrival_s
        self.running = False
        self.adm = 0  # admission number: order in the batch; renewed at every admission
        self.blocks: list[int] = []
        self.generated = 0  # while waiting; while running it is offset + the engine's step count
        self.offset = 0
        # while running: its length after the engine's step n is length0 + n, and every step
        # before ``stop`` is at or before its finishing step (both set at admission)
        self.length0 = self.stop = 0
        self.registered = 0  # leading blocks in the prefix cache at admission
        self.cached_tokens: int | None = None  # at first admission
        self.last_token_s = arrival_s  # when waiting after a preemption: its last token's time


class Engine:
    """One replica's scheduler and KV cache, stepped by a driver on an injected clock."""

    def __init__(self, params: EngineParams, clock: Clock) -> None:
        self.params = params
        self.clock = clock
        self.pool = BlockPool(params.num_blocks, params.enable_prefix_caching)
        self._bandwidth = params.decode_bandwidth_bytes_per_s
        self._waiting: deque[_Seq] = deque()
        self._running: dict[_Seq, None] = {}  # in admission order
        self._seqs: dict[str, _Seq] = {}
        self._busy_until = float("-inf")
        self._last_end = float("-inf")  # end of the last step that produced tokens
        self._steps = 0  # steps that produced tokens
        self._admissions = 0
        self._context = 0  # KV tokens of the running batch
        self._held = self._held_generated = 0  # prompt + output, and generated, of every request held
        self._finish_at: _Due = {}
        self._boundary_at: _Due = {}  # steps at whose end a sequence's length fills a block
        self._need_slot: list[tuple[int, _Seq]] = []  # the last step's boundaries: need a block now
        self._new: list[_Seq] = []
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
        self._held += total

    def abort(self, request_id: str) -> bool:
        """Drop a request (client gone): free its KV blocks. False if it is not held."""
        seq = self._seqs.pop(request_id, None)
        if seq is None:
            return False
        if seq.running:
            generated = seq.offset + self._steps
            del self._running[seq]
            self._context -= seq.req.prompt_tokens + generated
            self.pool.release(seq.blocks)
            seq.blocks, seq.running = [], False
        else:
            generated = seq.generated
            self._waiting.remove(seq)
        self._held -= seq.req.prompt_tokens + seq.req.output_tokens
        self._held_generated -= generated
        return True

    @property
    def has_work(self) -> bool:
        """True while any request is running or waiting."""
        return bool(self._seqs)

    def step(self, detail: bool = True) -> StepResult:
        """Run one iteration starting now (or when the previous one ends, if later).

        ``detail=False`` leaves ``outputs`` empty (no record per token): for drivers that need
        only first tokens, finishes and token counts, such as the simulator.
        """
        start = max(self.clock.now(), self._busy_until)
        self._new = []
        preempted = self._reserve_decode_slots(start)
        admitted = () if preempted else self._admit(start)
        batch = len(self._running)
        if not batch:
            self._busy_until = start
            return StepResult(start, start, 0, 0, (), (), preempted)
        context = self._context
        prefill = sum(a.prefill_tokens for a in admitted) if admitted else 0
        end = start + self.params.step_seconds(context, prefill, self._bandwidth)
        outputs = self._outputs(end) if detail else ()
        n = self._steps
        first = tuple(FirstToken(s.req.request_id, end - s.arrival_s)
                      for s in self._new if s.offset + n == 0) if self._new else ()
        self._steps = n + 1
        self._context += batch
        self._held_generated += batch
        self._generated += batch
        self._register_boundaries()
        finished = self._finish(end) if n in self._finish_at else ()
        self._busy_until = self._last_end = end
        return StepResult(start, end, context, prefill, admitted, outputs, preempted, batch, first, finished)

    def stats(self) -> EngineStats:
        """Gauges and counters now."""
        return EngineStats(
            running=len(self._running),
            waiting=len(self._waiting),
            kv_usage=self.pool.usage,
            tokens_in_flight=self._held - self._held_generated,
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
        # Only a sequence whose length just filled its last block needs a new one (admission
        # allocates for the context plus the first token; each later block is one boundary).
        need = self._need_slot
        if not need:
            return ()
        self._need_slot = []
        pool = self.pool
        if len(need) <= pool.num_free:  # a block for each: nobody is preempted
            allocate_one = pool.allocate_one
            for adm, seq in need:
                if seq.adm == adm and seq.running:
                    seq.blocks.append(allocate_one())
            return ()
        preempted: list[str] = []
        for adm, seq in need:
            if seq.adm != adm or not seq.running:
                continue
            while pool.num_free == 0:
                victim, _ = self._running.popitem()  # the most recently admitted
                self._preempt(victim, now)
                preempted.append(victim.req.request_id)
                if victim is seq:
                    break
            if seq.running:
                seq.blocks.append(pool.allocate_one())
        return tuple(preempted)

    def _preempt(self, seq: _Seq, now: float) -> None:
        seq.generated = seq.offset + self._steps
        self._context -= seq.req.prompt_tokens + seq.generated
        self.pool.release(seq.blocks)
        seq.blocks, seq.running = [], False
        seq.queued_since, seq.last_token_s = now, self._last_end
        self._waiting.appendleft(seq)
        self._preemptions += 1

    def _admit(self, now: float) -> tuple[Admission, ...]:
        if not self._waiting:
            return ()
        p, bs, n = self.params, self.params.block_size, self._steps
        budget = p.max_num_batched_tokens - len(self._running)
        used = 0
        out: list[Admission] = []
        while self._waiting and len(self._running) < p.max_num_seqs:
            seq = self._waiting[0]
            length = seq.req.prompt_tokens + seq.generated
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
            self._admissions += 1
            seq.adm, seq.offset, seq.running = self._admissions, seq.generated - n, True
            seq.length0 = seq.req.prompt_tokens + seq.offset + 1
            seq.stop = seq.req.output_tokens - seq.offset
            self._running[seq] = None
            self._new.append(seq)
            self._context += length
            finish = n + seq.req.output_tokens - seq.generated - 1
            self._finish_at.setdefault(finish, []).append((seq.adm, seq))
            first = seq.cached_tokens is None
            if first:
                seq.cached_tokens = cached
                self._prompt += seq.req.prompt_tokens
            self._queries += length
            self._hits += cached
            used += length - cached
            out.append(Admission(seq.req.request_id, cached, length - cached, now - seq.queued_since, first))
        return tuple(out)

    def _outputs(self, end: float) -> tuple[TokenOutput, ...]:
        """One record per sequence in the batch, before the step counter moves on."""
        n, new = self._steps, set(self._new)
        out: list[TokenOutput] = []
        for seq in self._running:
            index = seq.offset + n
            if seq in new:
                interval = end - (seq.arrival_s if index == 0 else seq.last_token_s)
            else:
                interval = end - self._last_end
            if index + 1 < seq.req.output_tokens:
                out.append(TokenOutput(seq.req.request_id, index, False, interval))
            else:
                out.append(TokenOutput(seq.req.request_id, index, True, interval, end - seq.arrival_s))
        return tuple(out)

    def _register_boundaries(self) -> None:
        """After a step's tokens: full blocks join the prefix cache, in batch order.

        A step's list of due boundaries is in admission order already: entries are appended in
        step order, and within a step the rescheduled ones (in order) before the newly admitted.
        """
        n = self._steps - 1
        due = self._boundary_at.pop(n, None)
        new = self._new
        if due is None and not new:
            return
        bs, pool = self.params.block_size, self.pool
        live: list[tuple[int, _Seq]] = []
        if due:
            register, boundary_at = pool.register, self._boundary_at
            step = n + bs
            entries = boundary_at.get(step)
            for entry in due:
                adm, seq = entry
                if seq.adm != adm or not seq.running:
                    continue  # stale: readmitted, finished or gone
                live.append(entry)
                hashes = seq.req.block_hashes
                i = (seq.length0 + n) // bs - 1
                if i < len(hashes):
                    register(seq.blocks[i], hashes[i])
                if step < seq.stop:  # at or before its finishing step
                    if entries is None:
                        entries = boundary_at[step] = [entry]
                    else:
                        entries.append(entry)
        for seq in new:
            length = seq.length0 + n
            hashes = seq.req.block_hashes
            pool.register_run(seq.blocks, hashes, seq.registered, min(length // bs, len(hashes)))
            if length % bs == 0:
                live.append((seq.adm, seq))
            self._schedule_boundary(seq, n + (-length % bs or bs))
        self._need_slot = live

    def _schedule_boundary(self, seq: _Seq, step: int) -> None:
        if step < seq.stop:  # at or before its finishing step
            self._boundary_at.setdefault(step, []).append((seq.adm, seq))

    def _finish(self, end: float) -> tuple[Finish, ...]:
        due = self._finish_at.pop(self._steps - 1, None)
        if not due:
            return ()
        out: list[Finish] = []
        for adm, seq in due:  # in admission order: appended as admitted
            if seq.adm != adm or not seq.running:
                continue
            req = seq.req
            del self._running[seq]
            del self._seqs[req.request_id]
            self.pool.release(seq.blocks)
            seq.blocks, seq.running = [], False
            self._context -= req.prompt_tokens + req.output_tokens
            self._held -= req.prompt_tokens + req.output_tokens
            self._held_generated -= req.output_tokens
            self._finished += 1
            out.append(Finish(req.request_id, req.output_tokens, end - seq.arrival_s))
        return tuple(out)

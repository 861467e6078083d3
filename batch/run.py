"""One claimed batch, run by a worker to a final status (I/O: the store, files, the gateway).

``validating``: read the input, store every line (malformed ones as failed, with their error
line) and move to ``in_progress`` in one transaction. ``in_progress``: send pending lines in
file order through the gateway, at most the :class:`~batch.policy.Pacer`'s window
at once, pausing on 429/503 for their Retry-After; each result is written to the database
while its line is still pending. Every ``poll_interval_s``: renew the lease with the progress
(risk, tier, pause, throttled), re-read the status (a cancel), check the deadline. At the end:
the output file is built from the stored results and written atomically, then the final status
is set; a crash anywhere repeats only idempotent steps.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

from batch.client import Attempt, output_of, send_line
from batch.context import RunContext
from batch.files import BatchFileError
from batch.lines import FileError, parse_input
from batch.models import BatchRecord, BatchStatus, LineState
from batch.pacing import RunPace
from batch.policy import Verdict, backoff_s, classify, retry_after_s
from batch.store import LineResult, PendingLine

log = logging.getLogger(__name__)
T = TypeVar("T")
PAGE_LINES = 500
"""Pending lines read from the database at a time."""


class BatchRun:
    """Runs ``record`` (leased to ``ctx.settings.worker_id``) until it ends or the lease is lost."""

    def __init__(self, ctx: RunContext, record: BatchRecord) -> None:
        self.ctx, self.rec = ctx, record
        self.store, self.worker = ctx.store, ctx.settings.worker_id
        self.pace = RunPace(ctx, record)
        self.unreachable = 0
        """Answers in a row that never connected to the API (the backoff grows with them)."""

    async def _io(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` in a thread, renewing the lease every poll interval while it
        runs."""
        task = asyncio.ensure_future(asyncio.to_thread(fn, *args, **kwargs))
        while True:
            done, _ = await asyncio.wait({task}, timeout=self.ctx.settings.poll_interval_s)
            if done:
                return task.result()
            await asyncio.to_thread(self.store.renew, self.rec.batch_id, self.worker,
                                    self.ctx.clock(), self.ctx.settings.lease_s)

    async def _move(self, src: BatchStatus, dst: BatchStatus, **values: Any) -> bool:
        moved = await self._io(self.store.transition, self.rec.batch_id, (src,), dst,
                               self.ctx.clock(), self.worker, **values)
        if moved:
            self.rec.status = dst
            log.info("batch %s: %s -> %s", self.rec.batch_id, src, dst)
            if dst in (BatchStatus.COMPLETED, BatchStatus.FAILED, BatchStatus.EXPIRED,
                       BatchStatus.CANCELLED):
                self.ctx.metrics.batches.labels(team=self.rec.team, status=str(dst)).inc()
        return moved

    async def _reread(self) -> BatchStatus:
        fresh = await self._io(self.store.get, self.rec.batch_id)
        self.rec.status = fresh.status if fresh is not None else BatchStatus.FAILED
        return self.rec.status

    async def run(self) -> None:
        """Advance the batch as far as it goes; returns when it is final or no longer ours."""
        try:
            sending = (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS)
            if self.rec.status in sending and self.rec.team not in self.ctx.keys:
                error = {"code": "team_key_unavailable", "message": "The batch service has no "
                         f"key for team '{self.rec.team}'.", "param": None, "line": None}
                await self._move(self.rec.status, BatchStatus.FAILED, errors=[error])
                return
            if self.rec.status is BatchStatus.VALIDATING:
                await self._validate()
            if self.rec.status is BatchStatus.IN_PROGRESS:
                end = await self._process()
                if end is None:
                    return
                if end is BatchStatus.FINALIZING and not await self._move(
                        BatchStatus.IN_PROGRESS, BatchStatus.FINALIZING):
                    await self._reread()
                elif end is not BatchStatus.FINALIZING:
                    await self._close(end)
            if self.rec.status is BatchStatus.FINALIZING:
                await self._write_and_move(BatchStatus.FINALIZING, BatchStatus.COMPLETED)
            elif self.rec.status is BatchStatus.CANCELLING:
                await self._close(BatchStatus.CANCELLING)
        finally:
            self.pace.finish()

    async def _validate(self) -> None:
        rec, settings = self.rec, self.ctx.settings
        try:
            data = await self._io(self.ctx.files.read, rec.input_uri, settings.max_input_bytes,
                                  rec.team)
            parsed = await asyncio.to_thread(parse_input, data, rec.model, settings.max_lines)
        except BatchFileError as exc:
            parsed = FileError(exc.code, exc.message)
        if isinstance(parsed, FileError):
            error = {"code": parsed.code, "message": parsed.message, "param": "input_uri",
                     "line": None}
            await self._move(BatchStatus.VALIDATING, BatchStatus.FAILED, errors=[error])
            return
        failed = sum(1 for p in parsed if p.error is not None)
        if await self._io(self.store.start, rec.batch_id, self.worker, parsed, self.ctx.clock()):
            rec.status = BatchStatus.IN_PROGRESS
            self.ctx.metrics.lines.labels(team=rec.team, model=rec.model,
                                          outcome="failed").inc(failed)
            log.info("batch %s: %d lines (%d malformed)", rec.batch_id, len(parsed), failed)
        else:
            await self._reread()

    async def _close(self, end: BatchStatus) -> None:
        """Expire or cancel: the lines still pending get an error line, then output, status."""
        expired = end is BatchStatus.EXPIRED
        state = LineState.EXPIRED if expired else LineState.CANCELLED
        code = "batch_expired" if expired else "batch_cancelled"
        why = "deadline passed" if expired else "batch was cancelled"
        closed = await self._io(self.store.close_pending, self.rec.batch_id, state, code,
                                f"The {why} before this line ran.", self.ctx.clock())
        self.ctx.metrics.lines.labels(team=self.rec.team, model=self.rec.model,
                                      outcome=str(state)).inc(closed)
        src = BatchStatus.IN_PROGRESS if expired else BatchStatus.CANCELLING
        await self._write_and_move(src, BatchStatus.EXPIRED if expired else BatchStatus.CANCELLED)

    async def _write_and_move(self, src: BatchStatus, dst: BatchStatus) -> None:
        lines = await self._io(self.store.output, self.rec.batch_id)
        try:
            await self._io(self.ctx.files.write_lines, self.rec.output_uri, lines,
                           self.rec.team)
        except BatchFileError as exc:
            log.error("batch %s: output not written: %s", self.rec.batch_id, exc.message)
            error = {"code": exc.code, "message": exc.message, "param": "output_uri", "line": None}
            await self._move(src, BatchStatus.FAILED, errors=[error])
            return
        await self._move(src, dst, output_written_at=self.ctx.clock())

    async def _process(self) -> BatchStatus | None:
        """Send the pending lines; returns FINALIZING (all answered), EXPIRED, CANCELLING, or
        None when the lease was lost."""
        rec, ctx, pace = self.rec, self.ctx, self.pace
        counts = await self._io(self.store.counts, rec.batch_id)
        if counts.pending == 0:  # a restart after the last result or after the expiry began
            return BatchStatus.EXPIRED if counts.incomplete else BatchStatus.FINALIZING
        pace.start(counts.pending)
        queue: deque[PendingLine] = deque()
        retry: list[tuple[float, int, PendingLine]] = []
        tasks: dict[asyncio.Task[Attempt], PendingLine] = {}
        after, exhausted, next_tick = 0, False, 0.0
        try:
            while True:
                now = ctx.clock()
                if now >= next_tick:
                    status = await pace.tick(now)
                    if status is None or status is BatchStatus.CANCELLING:
                        return status
                    next_tick = now + ctx.settings.poll_interval_s
                if now >= rec.deadline:
                    return BatchStatus.EXPIRED
                if not queue and not exhausted:
                    page = await self._io(self.store.pending, rec.batch_id, after, PAGE_LINES)
                    exhausted = not page
                    after = page[-1].line_no if page else after
                    queue.extend(page)
                while retry and retry[0][0] <= now:
                    queue.appendleft(heapq.heappop(retry)[2])
                for _ in range(pace.pacer.free_slots(len(tasks), now)):
                    if not queue:
                        break
                    line = queue.popleft()
                    tasks[asyncio.ensure_future(send_line(
                        ctx.client, ctx.keys[rec.team], pace.tier, line.body))] = line
                    pace.sent()
                if not (tasks or queue or retry) and exhausted:
                    return BatchStatus.FINALIZING
                wake = min([next_tick, rec.deadline]
                           + ([pace.pacer.paused_until] if pace.pacer.paused(now) else [])
                           + ([retry[0][0]] if retry else []))
                timeout = max(0.005, wake - now)
                if tasks:
                    done, _ = await asyncio.wait(tasks, timeout=timeout,
                                                 return_when=asyncio.FIRST_COMPLETED)
                else:
                    done = set()
                    await asyncio.sleep(timeout)
                results: list[LineResult] = []
                for task in done:
                    line = tasks.pop(task)
                    result = self._judge(line, task.result(), ctx.clock(), queue, retry)
                    if result is not None:
                        results.append(result)
                if results:
                    await self._io(self.store.record, rec.batch_id, results, ctx.clock())
                    pace.ended(results)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _judge(self, line: PendingLine, attempt: Attempt, now: float,
               queue: deque[PendingLine], retry: list[tuple[float, int, PendingLine]]
               ) -> LineResult | None:
        """The line's result, or None after putting it back (throttled: first in the queue;
        transient: in ``retry`` after a backoff)."""
        verdict = classify(attempt.status_code, attempt.connected)
        self.unreachable = self.unreachable + 1 if verdict is Verdict.UNREACHABLE else 0
        if verdict in (Verdict.THROTTLED, Verdict.UNREACHABLE):
            wait = (retry_after_s(attempt.headers, now) if verdict is Verdict.THROTTLED
                    else backoff_s(self.unreachable, self.ctx.rng, base_s=1.0))
            self.pace.throttled(now, str(attempt.status_code or verdict), wait)
            queue.appendleft(line)
            return None
        attempts = line.attempts + 1
        if verdict is Verdict.TRANSIENT and attempts < self.ctx.settings.max_attempts:
            wait = backoff_s(attempts, self.ctx.rng)
            heapq.heappush(retry, (now + wait, line.line_no, replace(line, attempts=attempts)))
            return None
        self.pace.pacer.on_success()
        state = LineState.DONE if verdict is Verdict.DONE else LineState.FAILED
        return LineResult(line.line_no, state, output_of(self.rec.batch_id, line, attempt,
                                                         attempts), attempts)

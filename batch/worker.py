"""The batch worker: claims active batches from the database and runs up to
``max_active_batches`` of them at once (:class:`~batch.run.BatchRun` each).

Any number of workers may share one database: a batch is leased to one worker at a time
(:meth:`~batch.store.BatchStore.claim`). A worker that stops (SIGTERM) cancels its
requests in flight (their lines stay pending) and gives its leases back, so another worker, or
itself restarted, resumes at once; a worker that is killed leaves its leases to run out
(``lease_s``). A run that fails (the database went away) is logged and its batch claimed again
at the next poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from batch.context import RunContext
from batch.run import BatchRun

log = logging.getLogger(__name__)


class BatchWorker:
    """Claims and runs batches with ``ctx`` until :meth:`run`'s ``stop`` is set."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self.active: dict[str, asyncio.Task[None]] = {}

    def _reap(self) -> None:
        for batch_id, task in list(self.active.items()):
            if task.done():
                del self.active[batch_id]
                if not task.cancelled() and task.exception() is not None:
                    log.error("batch %s: run failed, will be claimed again", batch_id,
                              exc_info=task.exception())

    async def _claim_more(self) -> None:
        settings = self.ctx.settings
        while len(self.active) < settings.max_active_batches:
            record = await asyncio.to_thread(self.ctx.store.claim, settings.worker_id,
                                             self.ctx.clock(), settings.lease_s,
                                             tuple(self.active))
            if record is None:
                return
            log.info("batch %s: claimed (%s, team %s)", record.batch_id, record.status,
                     record.team)
            self.active[record.batch_id] = asyncio.create_task(
                BatchRun(self.ctx, record).run(), name=f"batch-{record.batch_id}")

    async def run(self, stop: asyncio.Event) -> None:
        """Poll for batches every ``poll_interval_s`` seconds until ``stop`` is set, then
        cancel the runs and give their leases back."""
        try:
            while not stop.is_set():
                self._reap()
                try:
                    await self._claim_more()
                except Exception:  # the database may be down for a while: try again later
                    log.exception("claiming batches failed")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.ctx.settings.poll_interval_s)
        finally:
            await self.shutdown()

    async def shutdown(self) -> None:
        """Cancel every run and release its lease."""
        for task in self.active.values():
            task.cancel()
        await asyncio.gather(*self.active.values(), return_exceptions=True)
        for batch_id in self.active:
            try:
                await asyncio.to_thread(self.ctx.store.release, batch_id,
                                        self.ctx.settings.worker_id)
            except Exception:
                log.exception("batch %s: lease not released (it will run out)", batch_id)
        self.active.clear()

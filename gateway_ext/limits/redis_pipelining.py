"""Auto-pipelining of Lua script calls on an asyncio Redis client.

Under load many decisions are in flight on one event loop at once; each would pay one round trip
and redis-py's per-command overhead. :class:`ScriptPipeline` gathers the script calls issued in
the same turn of the event loop and sends them as one non-transactional pipeline: one round trip,
one connection checkout. Every script still runs atomically on the server, in the order issued;
a lone call goes out as a plain ``EVALSHA``, so an idle gateway's latency is unchanged.

Errors stay per call: a script error fails only its caller; a connection error fails every call
of the batch (the callers' fail-open stores handle it as before). A server without the script
(``NOSCRIPT``, e.g. after a restart or failover) gets it loaded and the call retried once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

MAX_BATCH = 256
"""Calls per pipeline at most (a larger burst goes out as several pipelines)."""


@dataclass(slots=True)
class _Call:
    script: AsyncScript
    keys: Sequence[Any]
    args: Sequence[Any]
    future: asyncio.Future[Any]


class ScriptPipeline:
    """Sends the script calls of one event-loop turn on ``client`` as one pipeline."""

    def __init__(self, client: redis.asyncio.Redis, max_batch: int = MAX_BATCH) -> None:
        self.client = client
        self.max_batch = max_batch
        self._pending: list[_Call] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self.pipelines = 0
        """Pipelines sent (batches of two calls or more), for tests and benchmarks."""

    async def call(self, script: AsyncScript, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """``script(keys, args)``'s reply, sent with the other calls of this loop turn."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._pending.append(_Call(script, keys, args, future))
        if len(self._pending) == 1:
            loop.call_soon(self._flush)
        return await future

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        for start in range(0, len(pending), self.max_batch):
            task = asyncio.get_running_loop().create_task(
                self._send(pending[start:start + self.max_batch]))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send(self, batch: list[_Call]) -> None:
        try:
            if len(batch) == 1:
                c = batch[0]
                replies: list[Any] = [await _run(c.script, c.keys, c.args, self.client)]
            else:
                self.pipelines += 1
                replies = await self._pipeline(batch)
        except BaseException as exc:  # the whole batch failed (connection lost, cancelled)
            for c in batch:
                if not c.future.done():
                    c.future.set_exception(exc if isinstance(exc, Exception)
                                           else asyncio.CancelledError())
            if not isinstance(exc, Exception):
                raise
            return
        for c, reply in zip(batch, replies, strict=True):
            if c.future.done():  # its caller went away; the script ran all the same
                continue
            if isinstance(reply, Exception):
                c.future.set_exception(reply)
            else:
                c.future.set_result(reply)

    async def _pipeline(self, batch: list[_Call]) -> list[Any]:
        pipe = self.client.pipeline(transaction=False)
        for c in batch:
            pipe.evalsha(c.script.sha, len(c.keys), *c.keys, *c.args)
        replies: list[Any] = await pipe.execute(raise_on_error=False)
        for i, (c, reply) in enumerate(zip(batch, replies, strict=True)):
            if isinstance(reply, NoScriptError):  # not loaded on this server: load, retry once
                replies[i] = await _run(c.script, c.keys, c.args, self.client)
        return replies


async def _run(script: AsyncScript, keys: Sequence[Any], args: Sequence[Any],
               client: redis.asyncio.Redis) -> Any:
    """One call, returning a script error instead of raising it (as the pipeline does)."""
    try:
        return await script(keys=keys, args=args, client=client)
    except redis.exceptions.ResponseError as exc:
        return exc

"""Runs the pure engine against the wall clock for the HTTP server (the asyncio edge).

Model time and wall time: model seconds = wall seconds since start x ``time_scale``. The driver
keeps the engine on its own model timeline: it runs a step, sleeps until the wall clock reaches
the step's end, then hands the step's tokens to the waiting requests. A late wake-up (the event
loop was busy) is caught up by starting the next step where the last one ended, so small delays
do not cost simulated throughput; a stall longer than ``max_lag_s`` wall seconds is dropped
rather than replayed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from replica.clock import ManualClock
from replica.engine import Engine
from replica.engine_types import EngineRequest, StepResult, TokenOutput

log = logging.getLogger(__name__)


class EngineDead(RuntimeError):
    """The engine failed (as vLLM's ``EngineDeadError``): no request can be served any more."""


class RequestHandle:
    """One request's view of the engine: its tokens arrive on ``queue``; ``None`` means it ended
    without finishing (engine stopped or failed)."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.queue: asyncio.Queue[TokenOutput | None] = asyncio.Queue()
        self.cached_tokens = 0
        """Prompt tokens the prefix cache held when the request was first admitted."""


class EngineDriver:
    """Steps ``engine`` in real time scaled by ``time_scale`` and routes its tokens."""

    def __init__(
        self,
        engine: Engine,
        clock: ManualClock,
        time_scale: float = 1.0,
        on_step: Callable[[StepResult], None] | None = None,
        wall: Callable[[], float] = time.monotonic,
        max_lag_s: float = 0.05,
    ) -> None:
        if time_scale <= 0:
            raise ValueError(f"time_scale must be positive, got {time_scale}")
        self.engine = engine
        self.clock = clock
        self.time_scale = time_scale
        self._on_step = on_step
        self._wall = wall
        self._wall0 = wall() - clock.now() / time_scale
        self._max_lag_s = max_lag_s
        self._max_lag = max_lag_s * time_scale
        self._handles: dict[str, RequestHandle] = {}
        self._wake = asyncio.Event()
        self._stopping = False
        self.dead = False
        """Set by :meth:`fail`: the engine is gone, every request ends without its answer."""

    def model_now(self) -> float:
        """Model seconds corresponding to the wall clock now."""
        return (self._wall() - self._wall0) * self.time_scale

    def submit(self, request: EngineRequest) -> RequestHandle:
        """Queue ``request`` on the engine; raises ``ValueError`` if the engine refuses it and
        :class:`EngineDead` after :meth:`fail`."""
        if self.dead:
            raise EngineDead("The engine has failed; this replica cannot serve requests.")
        if not self.engine.has_work:
            self.clock.set(max(self.clock.now(), self.model_now()))
        # While the loop sleeps through a step the engine clock already reads the step's end.
        self.engine.add_request(request, min(self.clock.now(), self.model_now()))
        handle = RequestHandle(request.request_id)
        self._handles[request.request_id] = handle
        self._wake.set()
        return handle

    def abort(self, request_id: str) -> None:
        """Forget a request whose client left; frees its KV cache. No-op once it has finished."""
        if self._handles.pop(request_id, None) is not None:
            self.engine.abort(request_id)

    def stop(self) -> None:
        """Ask ``run`` to return after the current step; unfinished requests get ``None``."""
        self._stopping = True
        self._wake.set()

    def fail(self) -> None:
        """Simulate an engine failure (a GPU error): every request held ends now without its
        answer, new ones are refused with :class:`EngineDead`."""
        self.dead = True
        for handle in self._handles.values():
            handle.queue.put_nowait(None)
        self._handles.clear()
        self.stop()

    def set_time_scale(self, time_scale: float) -> None:
        """Run at ``time_scale`` model seconds per wall second from now on (a slower or faster
        GPU), keeping the model time already elapsed."""
        if time_scale <= 0:
            raise ValueError(f"time_scale must be positive, got {time_scale}")
        now = self.model_now()
        self.time_scale = time_scale
        self._wall0 = self._wall() - now / time_scale
        self._max_lag = self._max_lag_s * time_scale
        self._wake.set()

    async def run(self) -> None:
        """The engine loop: step, sleep until the step ends, deliver its tokens."""
        try:
            while not self._stopping:
                if not self.engine.has_work:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                now = self.model_now()
                if now - self.clock.now() > self._max_lag:
                    self.clock.set(now)
                result = self.engine.step()
                self.clock.set(result.end_s)
                await asyncio.sleep(max(0.0, (result.end_s - self.model_now()) / self.time_scale))
                self._deliver(result)
        except Exception:
            log.exception("engine loop failed")
            raise
        finally:
            for handle in self._handles.values():
                handle.queue.put_nowait(None)
            self._handles.clear()

    def _deliver(self, result: StepResult) -> None:
        for adm in result.admitted:
            handle = self._handles.get(adm.request_id)
            if handle is not None and adm.first:
                handle.cached_tokens = adm.cached_tokens
        for out in result.outputs:
            handle = self._handles.get(out.request_id)
            if handle is None:
                continue
            handle.queue.put_nowait(out)
            if out.finished:
                del self._handles[out.request_id]
        if self._on_step is not None:
            self._on_step(result)

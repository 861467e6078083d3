"""The replica's heartbeat: once a second, its load and state to the control plane.

The body is :class:`modelfleet.contract.heartbeat.Heartbeat` (``POST /v1/heartbeats``). Load
figures (tokens in flight, queue depth, running) come from the middleware's own accounting
(:mod:`replica_middleware.inflight`); KV-cache usage and the cumulative prefix-cache counters are read from
the engine's own ``/metrics`` in process (vLLM's names: ``vllm:kv_cache_usage_perc`` (or the
older ``vllm:gpu_cache_usage_perc``), ``vllm:prefix_cache_queries_total``,
``vllm:prefix_cache_hits_total``; summed over engines, usage averaged). A failed beat is logged
and the next one goes out on time: the control plane's three-missed-beats rule, not the replica,
decides when it leaves the ring. :meth:`Heartbeater.kick` sends one at once (draining).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from modelfleet.contract.heartbeat import Heartbeat, ReplicaPhase
from modelfleet.contract.metrics import (
    VLLM_KV_CACHE_USAGE_NAMES,
    VLLM_PREFIX_CACHE_HITS,
    VLLM_PREFIX_CACHE_QUERIES,
    VLLM_WAITING,
)
from replica_middleware.inflight import Load
from replica_middleware.settings import MiddlewareSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineFigures:
    """From the engine's metrics: KV-cache usage (0..1), cumulative prefix-cache tokens and the
    requests waiting in the engine's queue (None when the engine does not export it)."""

    kv_cache_usage: float = 0.0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    requests_waiting: int | None = None


def parse_engine_metrics(text: str) -> EngineFigures:
    """The :class:`EngineFigures` in a Prometheus text exposition (missing ones read 0)."""
    usage: list[float] = []
    queries = hits = 0.0
    waiting: float | None = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in VLLM_KV_CACHE_USAGE_NAMES:
                usage.append(sample.value)
            elif sample.name == VLLM_WAITING:
                waiting = (waiting or 0.0) + sample.value
            elif sample.name == VLLM_PREFIX_CACHE_QUERIES:
                queries += sample.value
            elif sample.name == VLLM_PREFIX_CACHE_HITS:
                hits += sample.value
    kv = min(1.0, max(0.0, sum(usage) / len(usage))) if usage else 0.0
    queries_i = int(queries)
    return EngineFigures(kv, queries_i, min(int(hits), queries_i),
                         None if waiting is None else max(0, int(waiting)))


def beat_body(settings: MiddlewareSettings, state: ReplicaPhase, load: Load,
              engine: EngineFigures, sent_at: float) -> dict[str, Any]:
    """The JSON of one heartbeat (``sent_at``: Unix seconds)."""
    return asdict(Heartbeat(
        replica_id=settings.replica_id, model=settings.model, version=settings.version,
        host=settings.host, port=settings.port, region=settings.region or "unknown",
        state=state, tokens_in_flight=load.tokens_in_flight,
        # the engine's own queue when it says (vllm:num_requests_waiting, what KEDA's queue
        # trigger reads): the middleware cannot see a non-streamed request's first token, so
        # its count holds those as waiting until they end
        queue_depth=load.queue_depth if engine.requests_waiting is None
        else engine.requests_waiting,
        running=load.running, kv_cache_usage=engine.kv_cache_usage,
        prefix_cache_queries=engine.prefix_cache_queries,
        prefix_cache_hits=engine.prefix_cache_hits, sent_at=sent_at))


Post = Callable[[dict[str, Any]], Awaitable[None]]
"""Sends one beat body (raises on failure)."""


class Heartbeater:
    """Beats every ``settings.beat_interval_s`` seconds: ``state()`` (``serving`` or
    ``draining``), ``load()``, ``engine()`` figures, sent by ``post``."""

    def __init__(self, settings: MiddlewareSettings, post: Post, state: Callable[[], ReplicaPhase],
                 load: Callable[[], Load], engine: Callable[[], Awaitable[EngineFigures]],
                 wall: Callable[[], float] = time.time) -> None:
        self.settings, self._post, self._state = settings, post, state
        self._load, self._engine, self._wall = load, engine, wall
        self._kick = asyncio.Event()
        self._last = EngineFigures()
        self.sent = 0
        self.failed = 0
        self.last_error: str | None = None

    def kick(self) -> None:
        """Send the next beat now (from the event loop's thread)."""
        self._kick.set()

    async def beat_once(self) -> bool:
        """Send one beat; True if the control plane took it. Never raises."""
        try:
            self._last = await self._engine()
        except Exception as exc:  # keep the last figures: the counters only grow
            log.debug("engine metrics unreadable: %s", exc)
        body = beat_body(self.settings, self._state(), self._load(), self._last, self._wall())
        try:
            await self._post(body)
        except Exception as exc:  # the control plane may be down: keep serving, keep beating
            self.failed += 1
            if self.last_error is None or self.failed % 30 == 1:
                log.warning("heartbeat to the control plane failed (%d so far): %s",
                            self.failed, exc)
            self.last_error = f"{type(exc).__name__}: {exc}"
            return False
        self.sent += 1
        if self.last_error is not None:
            log.info("heartbeats reach the control plane again")
        self.last_error = None
        return True

    async def run(self) -> None:
        """Beat until cancelled."""
        while True:
            self._kick.clear()
            await self.beat_once()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), self.settings.beat_interval_s)

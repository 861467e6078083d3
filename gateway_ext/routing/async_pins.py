"""Conversation pins on the asyncio Redis client: no pin blocks the gateway's event loop.

The awaited counterparts of :mod:`gateway_ext.routing.pins`, for
:class:`~gateway_ext.shared_lifecycle.SharedLifecycle`:

* :class:`AsyncRedisPinStore`: the same Lua script (:data:`~gateway_ext.routing.pins.RESOLVE_SCRIPT`)
  and key layout as :class:`~gateway_ext.routing.pins.RedisPinStore` (sync and async processes agree on
  every pin), sent through a :class:`~gateway_ext.limits.redis_pipelining.ScriptPipeline` so the pins of
  one event-loop turn share a round trip with each other and with the bucket reservations.
* :class:`AsyncFallbackPinStore`: Redis, and this process's memory for ``retry_s`` seconds after a
  Redis failure (the semantics of :class:`~gateway_ext.routing.pins.FallbackPinStore`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from typing import Protocol

import redis.asyncio

from gateway_ext.limits.redis_pipelining import ScriptPipeline
from gateway_ext.routing.pins import (
    DEFAULT_TTL_S,
    RESOLVE_SCRIPT,
    PinStore,
    legacy_pin_key,
    pin_key,
    pin_window,
    resolve_args,
    resolve_reply,
)


class AsyncPinStore(Protocol):
    """Where conversation pins live, awaited."""

    async def resolve(self, team: str, model: str, conversation_id: str, candidate: str,
                      valid: Collection[str]) -> tuple[str, bool]:
        """As :meth:`gateway_ext.routing.pins.PinStore.resolve`."""
        ...


class AsyncRedisPinStore:
    """Pins shared by every gateway process through Redis, on the asyncio ``client``; script calls
    go through ``pipeline`` (a new one on ``client`` when not given)."""

    def __init__(self, client: redis.asyncio.Redis, prefix: str = "mf",
                 ttl_s: float = DEFAULT_TTL_S, read_legacy: bool = True,
                 pipeline: ScriptPipeline | None = None) -> None:
        self.client, self.prefix, self.ttl_s = client, prefix, ttl_s
        self.read_legacy = read_legacy
        self.pipeline = pipeline if pipeline is not None else ScriptPipeline(client)
        self._script = client.register_script(RESOLVE_SCRIPT)

    def key(self, team: str, model: str, conversation_id: str) -> str:
        """The Redis key of a pin (as :meth:`gateway_ext.routing.pins.RedisPinStore.key`)."""
        return pin_key(self.prefix, team, model, conversation_id)

    async def resolve(self, team: str, model: str, conversation_id: str, candidate: str,
                      valid: Collection[str]) -> tuple[str, bool]:
        """See :meth:`gateway_ext.routing.pins.PinStore.resolve`; raises ``redis.RedisError`` (or
        ``OSError``) when Redis fails."""
        keys = [self.key(team, model, conversation_id)]
        if self.read_legacy:
            keys.append(legacy_pin_key(self.prefix, model, conversation_id))
        return resolve_reply(await self.pipeline.call(
            self._script, keys, resolve_args(candidate, self.ttl_s, valid)))


class AsyncFallbackPinStore:
    """``primary`` (Redis, awaited), falling back to ``fallback`` (memory) for ``retry_s`` seconds
    (``clock`` in seconds) after a failure of one of ``errors``; ``on_fallback`` is called at each
    failure."""

    def __init__(self, primary: AsyncPinStore, fallback: PinStore,
                 errors: tuple[type[BaseException], ...], retry_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic,
                 on_fallback: Callable[[], None] | None = None) -> None:
        self.primary, self.fallback, self.errors = primary, fallback, errors
        self.window = pin_window(clock, retry_s, on_fallback)

    @property
    def degraded(self) -> bool:
        """True while pins are kept in this process only."""
        return self.window.degraded

    async def resolve(self, team: str, model: str, conversation_id: str, candidate: str,
                      valid: Collection[str]) -> tuple[str, bool]:
        """See :meth:`gateway_ext.routing.pins.PinStore.resolve`."""
        if not self.degraded:
            try:
                return await self.primary.resolve(team, model, conversation_id, candidate, valid)
            except self.errors as exc:
                self.window.failed("resolve", exc)
        return self.fallback.resolve(team, model, conversation_id, candidate, valid)

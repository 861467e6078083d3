"""Conversation pins: conversation -> the version it started on, bounded and expiring.

A conversation is (team, model, conversation id): two teams that happen to use the same id
never share a pin. One operation, :meth:`PinStore.resolve`: keep the existing pin if it is
still valid (and refresh its TTL), else write the candidate; both stores apply
:func:`gateway_ext.routing.versions.settle_pin`.

* :class:`MemoryPinStore`: one process's map, least recently used first out past
  ``max_entries``, each pin forgotten ``ttl_s`` seconds after its conversation's last turn
  (clock injected).
* :class:`RedisPinStore`: every gateway process agrees; one Lua script per turn (read, compare,
  write or refresh, atomically), keys ``<prefix>:tpin:{<model>}:<team>:<conversation id>``
  with a ``PX`` TTL that slides with each turn. Migration: pins written before pins were per
  team (``<prefix>:pin:{<model>}:<conversation id>``, same hash slot) are still read when a
  conversation has no pin under the new key, and copied there; they are never written again and
  expire within one TTL, after which ``read_legacy=False`` saves the extra read.
* :mod:`gateway_ext.routing.async_pins`: the same script and keys on the asyncio client (the service's
  :class:`~gateway_ext.shared_lifecycle.SharedLifecycle` awaits pins; they never block its event loop).
* :class:`FallbackPinStore`: Redis, and this process's memory for ``retry_s`` seconds after a
  Redis failure (a conversation whose pin lives only in Redis is split again meanwhile: it
  keeps its version unless the canary percent changed since it started).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Collection
from typing import Protocol

import redis

from gateway_ext.limits.fail_open import FailOpenWindow
from gateway_ext.routing.versions import settle_pin

DEFAULT_TTL_S = 3600.0
"""A conversation idle this long (seconds) starts afresh: a new split, a new pin."""
DEFAULT_MAX_ENTRIES = 1_000_000
"""Pins one process keeps in memory (about 150 bytes each)."""

RESOLVE_SCRIPT = """
local pinned = redis.call('GET', KEYS[1])
if not pinned and #KEYS > 1 then
  pinned = redis.call('GET', KEYS[2])
end
if pinned then
  for i = 3, #ARGV do
    if ARGV[i] == pinned then
      redis.call('SET', KEYS[1], pinned, 'PX', ARGV[2])
      return {pinned, 0}
    end
  end
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return {ARGV[1], 1}
"""
"""KEYS: pin key[, legacy pin key]. ARGV: candidate, ttl ms, valid versions... Returns
{version, written}."""


class PinStore(Protocol):
    """Where conversation pins live."""

    def resolve(self, team: str, model: str, conversation_id: str, candidate: str,
                valid: Collection[str]) -> tuple[str, bool]:
        """``(version, new_pin)``: the pin of ``team``'s conversation on ``model`` if it is one of
        ``valid`` (its TTL refreshed), else ``candidate``, now pinned."""
        ...


class MemoryPinStore:
    """Pins of one process: at most ``max_entries``, each ``ttl_s`` seconds past its last use;
    ``clock`` in seconds."""

    def __init__(self, ttl_s: float = DEFAULT_TTL_S, max_entries: int = DEFAULT_MAX_ENTRIES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s, self.max_entries, self.clock = ttl_s, max_entries, clock
        self._pins: OrderedDict[tuple[str, str, str], tuple[str, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._pins)

    def resolve(self, team: str, model: str, conversation_id: str, candidate: str,
                valid: Collection[str]) -> tuple[str, bool]:
        """See :meth:`PinStore.resolve`."""
        now = self.clock()
        key = (team, model, conversation_id)
        found = self._pins.get(key)
        existing = found[0] if found is not None and found[1] > now else None
        version, written = settle_pin(existing, candidate, valid)
        self._pins[key] = (version, now + self.ttl_s)
        self._pins.move_to_end(key)
        self._trim(now)
        return version, written

    def _trim(self, now: float) -> None:
        while len(self._pins) > self.max_entries:
            self._pins.popitem(last=False)
        while self._pins:  # least recently used first: expired ones sit at the front
            key, (_, expires) = next(iter(self._pins.items()))
            if expires > now:
                break
            del self._pins[key]


def pin_key(prefix: str, team: str, model: str, conversation_id: str) -> str:
    """The Redis key of a pin (hash tag on the model; team names hold no ``:``)."""
    return f"{prefix}:tpin:{{{model}}}:{team}:{conversation_id}"


def legacy_pin_key(prefix: str, model: str, conversation_id: str) -> str:
    """Where pins were kept before they were per team (read only, see the module)."""
    return f"{prefix}:pin:{{{model}}}:{conversation_id}"


def resolve_args(candidate: str, ttl_s: float, valid: Collection[str]) -> list[str | int]:
    """ARGV of :data:`RESOLVE_SCRIPT`: candidate, TTL in milliseconds (at least 1), valid versions."""
    return [candidate, max(1, round(ttl_s * 1000)), *valid]


def resolve_reply(reply: list[bytes | str | int]) -> tuple[str, bool]:
    """``(version, new_pin)`` from :data:`RESOLVE_SCRIPT`'s reply."""
    version, written = reply
    text = version.decode() if isinstance(version, bytes) else str(version)
    return text, bool(written)


class RedisPinStore:
    """Pins shared by every gateway process through Redis (see :data:`RESOLVE_SCRIPT`) on the sync
    client; the asyncio service uses :class:`gateway_ext.routing.async_pins.AsyncRedisPinStore`."""

    def __init__(self, client: redis.Redis, prefix: str = "mf",
                 ttl_s: float = DEFAULT_TTL_S, read_legacy: bool = True) -> None:
        self.client, self.prefix, self.ttl_s = client, prefix, ttl_s
        self.read_legacy = read_legacy
        self._script = client.register_script(RESOLVE_SCRIPT)

    def key(self, team: str, model: str, conversation_id: str) -> str:
        """The Redis key of a pin (hash tag on the model; team names hold no ``:``)."""
        return pin_key(self.prefix, team, model, conversation_id)

    def legacy_key(self, model: str, conversation_id: str) -> str:
        """Where pins were kept before they were per team (read only, see the module)."""
        return legacy_pin_key(self.prefix, model, conversation_id)

    def resolve(self, team: str, model: str, conversation_id: str, candidate: str,
                valid: Collection[str]) -> tuple[str, bool]:
        """See :meth:`PinStore.resolve`; raises ``redis.RedisError`` when Redis fails."""
        keys = [self.key(team, model, conversation_id)]
        if self.read_legacy:
            keys.append(self.legacy_key(model, conversation_id))
        return resolve_reply(self._script(keys=keys,
                                          args=resolve_args(candidate, self.ttl_s, valid)))


def pin_window(clock: Callable[[], float], retry_s: float,
               on_fallback: Callable[[], None] | None) -> FailOpenWindow:
    """The fail-open window of a pin store (``on_fallback()`` at each failure, if given)."""
    notify = on_fallback
    return FailOpenWindow("pins kept in this process", clock, retry_s,
                          (lambda _op: notify()) if notify is not None else (lambda _op: None))


class FallbackPinStore:
    """``primary`` (Redis), falling back to ``fallback`` (memory) for ``retry_s`` seconds after a
    failure of one of ``errors``; ``on_fallback`` is called at each failure."""

    def __init__(self, primary: PinStore, fallback: PinStore,
                 errors: tuple[type[BaseException], ...], retry_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic,
                 on_fallback: Callable[[], None] | None = None) -> None:
        self.primary, self.fallback, self.errors = primary, fallback, errors
        self.window = pin_window(clock, retry_s, on_fallback)

    @property
    def degraded(self) -> bool:
        """True while pins are kept in this process only."""
        return self.window.degraded

    def resolve(self, team: str, model: str, conversation_id: str, candidate: str,
                valid: Collection[str]) -> tuple[str, bool]:
        """See :meth:`PinStore.resolve`."""
        if not self.degraded:
            try:
                return self.primary.resolve(team, model, conversation_id, candidate, valid)
            except self.errors as exc:
                self.window.failed("resolve", exc)
        return self.fallback.resolve(team, model, conversation_id, candidate, valid)

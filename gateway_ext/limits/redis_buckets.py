"""Token buckets in Redis: every gateway_ext process of a region shares one bucket per team x model.

Each operation is one Lua script run atomically by Redis (``EVALSHA``), implementing exactly the
integer maths of :mod:`gateway_ext.limits.buckets` (the tests run one table through both). The clock is
an argument (``now`` in milliseconds), never Redis ``TIME``, so tests drive a fake clock and the
simulator can reuse the script.

Keys (``{...}`` is a Redis Cluster hash tag, so a bucket and its reservations share a slot)::

    <prefix>:bucket:{<team>:<model>}          "<level>:<updated>"  level in 1/60000 token, ms
    <prefix>:resv:{<team>:<model>}:<id>       "<tokens>:<expires>:<settled>"  tokens, ms, 0/1
    <prefix>:open:{<team>:<model>}            ZSET of open reservation ids scored by expiry (ms)

Plain strings rather than hashes: one ``SET ... PX`` per write instead of ``HSET`` + ``PEXPIRE``.

The ``open`` set is the team's ``max_concurrency`` count shared by every gateway process: a reserve
given a limit drops expired members, refuses (``max_concurrency``, nothing charged) when the set is
full, else adds the reservation with the bucket charge in the same script; every settle removes it
(idempotent), so a settle landing on any process frees the slot at once.

Reservation expiry is logical (``expires`` against the ``now`` argument); Redis key TTLs only
collect garbage: a reservation key lives ``ttl + gc_grace`` real milliseconds, a bucket key until it
would be full again plus ``gc_grace`` (a missing bucket reads as full, which it then is).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis
import redis.asyncio

from gateway_ext.limits.bucket_store import (
    BucketKey,
    Concurrency,
    CountedReservation,
    Settlement,
    SettleVerdict,
)
from gateway_ext.limits.buckets import BucketState, Reservation, Verdict, check_limit, to_ms
from gateway_ext.limits.redis_pipelining import ScriptPipeline

DEFAULT_PREFIX = "mf"
GC_GRACE_MS = 600_000
"""Real milliseconds a key outlives its logical life before Redis deletes it."""

_PRELUDE = """
local UNITS = 60000
local function fdiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end
local function cdiv(a, b) return -fdiv(-a, b) end
local function int(x) return string.format('%d', x) end
local function refill(level, updated, rate, now)
  local cap = rate * UNITS
  if level == nil then return cap, now end
  local elapsed = now - updated
  if elapsed <= 0 then return math.min(level, cap), updated end
  local need = cap - level
  if need <= 0 or elapsed >= cdiv(need, rate) then return cap, now end
  return level + elapsed * rate, now
end
local function tokens(level) if level < 0 then return 0 end return fdiv(level, UNITS) end
local function reset(level, rate)
  local need = rate * UNITS - level
  if need > 0 then return cdiv(need, rate) end
  return 0
end
local function load(key)
  local b = redis.call('GET', key)
  if not b then return nil, nil end
  local level, updated = string.match(b, '^(-?%d+):(-?%d+)$')
  return tonumber(level), tonumber(updated)
end
local function save(key, level, updated, rate, gc)
  redis.call('SET', key, int(level) .. ':' .. int(updated), 'PX', int(reset(level, rate) + gc))
end
local now, rate, gc = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local level, updated = load(KEYS[1])
local lv, up = refill(level, updated, rate, now)
"""

RESERVE_SCRIPT = _PRELUDE + """
-- ARGV[4] cost (tokens), ARGV[5] ttl (ms), ARGV[6] max open reservations (-1: not counted),
-- ARGV[7] reservation id
local cost, ttl, cap = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
if redis.call('EXISTS', KEYS[2]) == 1 then
  return {'reserved', tokens(lv), 0, reset(lv, rate)}
end
if cost > rate then return {'too_large', tokens(lv), 0, reset(lv, rate)} end
local units = cost * UNITS
if lv >= units then
  if cap >= 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
    if redis.call('ZCARD', KEYS[3]) >= cap then
      return {'max_concurrency', tokens(lv), 0, reset(lv, rate)}
    end
    redis.call('ZADD', KEYS[3], int(now + ttl), ARGV[7])
    redis.call('PEXPIRE', KEYS[3], int(ttl + gc))
  end
  lv = lv - units
  save(KEYS[1], lv, up, rate, gc)
  redis.call('SET', KEYS[2], int(cost) .. ':' .. int(now + ttl) .. ':0', 'PX', int(ttl + gc))
  return {'reserved', tokens(lv), 0, reset(lv, rate)}
end
return {'denied', tokens(lv), cdiv(units - lv, rate), reset(lv, rate)}
"""

SETTLE_SCRIPT = _PRELUDE + """
-- ARGV[4] used (tokens), ARGV[5] reservation id
local used = tonumber(ARGV[4])
redis.call('ZREM', KEYS[3], ARGV[5])
local r = redis.call('GET', KEYS[2])
if not r then return {'unknown', 0, tokens(lv)} end
local reserved, expires, settled = string.match(r, '^(%d+):(-?%d+):([01])$')
reserved = tonumber(reserved)
if settled == '1' then return {'duplicate', reserved, tokens(lv)} end
if now >= tonumber(expires) then return {'expired', reserved, tokens(lv)} end
lv = math.min(rate * UNITS, lv + (reserved - used) * UNITS)
save(KEYS[1], lv, up, rate, gc)
redis.call('SET', KEYS[2], string.sub(r, 1, -2) .. '1', 'KEEPTTL')
return {'settled', reserved, tokens(lv)}
"""


def bucket_redis_key(prefix: str, key: BucketKey) -> str:
    """The Redis key of ``key``'s bucket."""
    return f"{prefix}:bucket:{{{key.team}:{key.model}}}"


def reservation_redis_key(prefix: str, key: BucketKey, reservation_id: str) -> str:
    """The Redis key of reservation ``reservation_id`` on ``key``'s bucket."""
    return f"{prefix}:resv:{{{key.team}:{key.model}}}:{reservation_id}"


def open_redis_key(prefix: str, key: BucketKey) -> str:
    """The Redis key of the set of ``key``'s open reservations (its ``max_concurrency`` count)."""
    return f"{prefix}:open:{{{key.team}:{key.model}}}"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _reservation(reply: Sequence[Any], tokens_per_minute: int) -> Reservation:
    return Reservation(Verdict(_text(reply[0])), tokens_per_minute, int(reply[1]), int(reply[2]),
                       int(reply[3]))


def _counted(reply: Sequence[Any], tokens_per_minute: int) -> CountedReservation:
    verdict = _text(reply[0])
    if verdict == "max_concurrency":  # nothing charged: the bucket as it is
        return CountedReservation(Reservation(Verdict.RESERVED, tokens_per_minute, int(reply[1]),
                                              0, int(reply[3])), Concurrency.REFUSED)
    return CountedReservation(_reservation(reply, tokens_per_minute), Concurrency.GRANTED)


def _settlement(reply: Sequence[Any]) -> Settlement:
    return Settlement(SettleVerdict(_text(reply[0])), int(reply[1]), int(reply[2]))


def _state(reply: Any) -> BucketState | None:
    if reply is None:
        return None
    level, updated = _text(reply).split(":")
    return BucketState(int(level), int(updated))


class _RedisStoreBase:
    """What both Redis stores share: the key layout and the registered scripts."""

    def __init__(self, client: redis.Redis | redis.asyncio.Redis, prefix: str = DEFAULT_PREFIX,
                 gc_grace_ms: int = GC_GRACE_MS) -> None:
        self.prefix = prefix
        self.gc_grace_ms = gc_grace_ms
        # sync or async script objects: each subclass calls (or awaits) them
        self._reserve: Any = client.register_script(RESERVE_SCRIPT)
        self._settle: Any = client.register_script(SETTLE_SCRIPT)

    def _keys(self, key: BucketKey, reservation_id: str) -> list[str]:
        return [bucket_redis_key(self.prefix, key),
                reservation_redis_key(self.prefix, key, reservation_id),
                open_redis_key(self.prefix, key)]

    def _reserve_args(self, tokens_per_minute: int, cost: int, reservation_id: str, now: float,
                      ttl_s: float, max_open: int) -> list[Any]:
        check_limit(tokens_per_minute)
        return [to_ms(now), tokens_per_minute, self.gc_grace_ms, cost, to_ms(ttl_s), max_open,
                reservation_id]

    def _settle_args(self, tokens_per_minute: int, reservation_id: str, used: int,
                     now: float) -> list[Any]:
        check_limit(tokens_per_minute)
        return [to_ms(now), tokens_per_minute, self.gc_grace_ms, used, reservation_id]


class RedisBucketStore(_RedisStoreBase):
    """The :class:`~gateway_ext.limits.bucket_store.BucketStore` on a synchronous Redis client."""

    def __init__(self, client: redis.Redis, prefix: str = DEFAULT_PREFIX,
                 gc_grace_ms: int = GC_GRACE_MS) -> None:
        super().__init__(client, prefix, gc_grace_ms)
        self.client = client

    def reserve(self, key: BucketKey, tokens_per_minute: int, cost: int, reservation_id: str,
                now: float, ttl_s: float) -> Reservation:
        """See :meth:`~gateway_ext.limits.bucket_store.BucketStore.reserve`."""
        args = self._reserve_args(tokens_per_minute, cost, reservation_id, now, ttl_s, -1)
        reply = self._reserve(keys=self._keys(key, reservation_id), args=args)
        return _reservation(reply, tokens_per_minute)

    def settle(self, key: BucketKey, tokens_per_minute: int, reservation_id: str, used: int,
               now: float) -> Settlement:
        """See :meth:`~gateway_ext.limits.bucket_store.BucketStore.settle`."""
        args = self._settle_args(tokens_per_minute, reservation_id, used, now)
        return _settlement(self._settle(keys=self._keys(key, reservation_id), args=args))

    def bucket_state(self, key: BucketKey) -> BucketState | None:
        """See :meth:`~gateway_ext.limits.bucket_store.BucketStore.bucket_state`."""
        return _state(self.client.get(bucket_redis_key(self.prefix, key)))


class AsyncRedisBucketStore(_RedisStoreBase):
    """The same store on an asyncio Redis client, for the FastAPI service (same script, same keys);
    the calls in flight at once share round trips (:mod:`gateway_ext.limits.redis_pipelining`)."""

    def __init__(self, client: redis.asyncio.Redis, prefix: str = DEFAULT_PREFIX,
                 gc_grace_ms: int = GC_GRACE_MS) -> None:
        super().__init__(client, prefix, gc_grace_ms)
        self.client = client
        self.pipeline = ScriptPipeline(client)
        """Script calls of one event-loop turn go out as one pipeline (one round trip)."""

    async def reserve(self, key: BucketKey, tokens_per_minute: int, cost: int,
                      reservation_id: str, now: float, ttl_s: float) -> Reservation:
        """As :meth:`RedisBucketStore.reserve`, awaited."""
        args = self._reserve_args(tokens_per_minute, cost, reservation_id, now, ttl_s, -1)
        reply = await self.pipeline.call(self._reserve, self._keys(key, reservation_id), args)
        return _reservation(reply, tokens_per_minute)

    async def reserve_counted(self, key: BucketKey, tokens_per_minute: int, cost: int,
                              reservation_id: str, now: float, ttl_s: float,
                              max_concurrency: int) -> CountedReservation:
        """:meth:`reserve`, and in the same script take one of ``key``'s ``max_concurrency``
        open-request slots (refused: nothing charged); the slot is freed by any settle of
        ``reservation_id`` or when the reservation expires."""
        args = self._reserve_args(tokens_per_minute, cost, reservation_id, now, ttl_s,
                                  max(0, max_concurrency))
        reply = await self.pipeline.call(self._reserve, self._keys(key, reservation_id), args)
        return _counted(reply, tokens_per_minute)

    async def settle(self, key: BucketKey, tokens_per_minute: int, reservation_id: str,
                     used: int, now: float) -> Settlement:
        """As :meth:`RedisBucketStore.settle`, awaited."""
        args = self._settle_args(tokens_per_minute, reservation_id, used, now)
        return _settlement(await self.pipeline.call(self._settle, self._keys(key, reservation_id),
                                                    args))

    async def bucket_state(self, key: BucketKey) -> BucketState | None:
        """As :meth:`RedisBucketStore.bucket_state`, awaited."""
        return _state(await self.client.get(bucket_redis_key(self.prefix, key)))

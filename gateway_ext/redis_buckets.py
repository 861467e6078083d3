"""Token buckets in Redis: every gateway_ext process of a region shares one bucket per team x model.

Each operation is one Lua script run atomically by Redis (``EVALSHA``), implementing exactly the
integer maths of :mod:`gateway_ext.buckets` (the tests run one table through both). The clock is
an argument (``now`` in milliseconds), never Redis ``TIME``, so tests drive a fake clock and the
simulator can reuse the script.

Keys (``{...}`` is a Redis Cluster hash tag, so a bucket and its reservations share a slot)::

    <prefix>:bucket:{<team>:<model>}          "<level>:<updated>"  level in 1/60000 token, ms
    <prefix>:resv:{<team>:<model>}:<id>       "<tokens>:<expires>:<settled>"  tokens, ms, 0/1

Plain strings rather than hashes: one ``SET ... PX`` per write instead of ``HSET`` + ``PEXPIRE``.

Reservation expiry is logical (``expires`` against the ``now`` argument); Redis key TTLs only
collect garbage: a reservation key lives ``ttl + gc_grace`` real milliseconds, a bucket key until it
would be full again plus ``gc_grace`` (a missing bucket reads as full, which it then is).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis
import redis.asyncio

from gateway_ext.bucket_store import BucketKey, Settlement, SettleVerdict
from gateway_ext.buckets import BucketState, Reservation, Verdict, check_limit, to_ms

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
-- ARGV[4] cost (tokens), ARGV[5] ttl (ms)
local cost, ttl = tonumber(ARGV[4]), tonumber(ARGV[5])
if redis.call('EXISTS', KEYS[2]) == 1 then
  return {'reserved', tokens(lv), 0, reset(lv, rate)}
end
if cost > rate then return {'too_large', tokens(lv), 0, reset(lv, rate)} end
local units = cost * UNITS
if lv >= units then
  lv = lv - units
  save(KEYS[1], lv, up, rate, gc)
  redis.call('SET', KEYS[2], int(cost) .. ':' .. int(now + ttl) .. ':0', 'PX', int(ttl + gc))
  return {'reserved', tokens(lv), 0, reset(lv, rate)}
end
return {'denied', tokens(lv), cdiv(units - lv, rate), reset(lv, rate)}
"""

SETTLE_SCRIPT = _PRELUDE + """
-- ARGV[4] used (tokens)
local used = tonumber(ARGV[4])
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


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _reservation(reply: Sequence[Any], tokens_per_minute: int) -> Reservation:
    return Reservation(Verdict(_text(reply[0])), tokens_per_minute, int(reply[1]), int(reply[2]),
                       int(reply[3]))


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
                reservation_redis_key(self.prefix, key, reservation_id)]


class RedisBucketStore(_RedisStoreBase):
    """The :class:`~gateway_ext.bucket_store.BucketStore` on a synchronous Redis client."""

    def __init__(self, client: redis.Redis, prefix: str = DEFAULT_PREFIX,
                 gc_grace_ms: int = GC_GRACE_MS) -> None:
        super().__init__(client, prefix, gc_grace_ms)
        self.client = client

    def reserve(self, key: BucketKey, tokens_per_minute: int, cost: int, reservation_id: str,
                now: float, ttl_s: float) -> Reservation:
        """See :meth:`~gateway_ext.bucket_store.BucketStore.reserve`."""
        check_limit(tokens_per_minute)
        args = [to_ms(now), tokens_per_minute, self.gc_grace_ms, cost, to_ms(ttl_s)]
        reply = self._reserve(keys=self._keys(key, reservation_id), args=args)
        return _reservation(reply, tokens_per_minute)

    def settle(self, key: BucketKey, tokens_per_minute: int, reservation_id: str, used: int,
               now: float) -> Settlement:
        """See :meth:`~gateway_ext.bucket_store.BucketStore.settle`."""
        check_limit(tokens_per_minute)
        args = [to_ms(now), tokens_per_minute, self.gc_grace_ms, used]
        return _settlement(self._settle(keys=self._keys(key, reservation_id), args=args))

    def bucket_state(self, key: BucketKey) -> BucketState | None:
        """See :meth:`~gateway_ext.bucket_store.BucketStore.bucket_state`."""
        return _state(self.client.get(bucket_redis_key(self.prefix, key)))


class AsyncRedisBucketStore(_RedisStoreBase):
    """The same store on an asyncio Redis client, for the FastAPI service (same script, same keys)."""

    def __init__(self, client: redis.asyncio.Redis, prefix: str = DEFAULT_PREFIX,
                 gc_grace_ms: int = GC_GRACE_MS) -> None:
        super().__init__(client, prefix, gc_grace_ms)
        self.client = client

    async def reserve(self, key: BucketKey, tokens_per_minute: int, cost: int,
                      reservation_id: str, now: float, ttl_s: float) -> Reservation:
        """As :meth:`RedisBucketStore.reserve`, awaited."""
        check_limit(tokens_per_minute)
        args = [to_ms(now), tokens_per_minute, self.gc_grace_ms, cost, to_ms(ttl_s)]
        reply = await self._reserve(keys=self._keys(key, reservation_id), args=args)
        return _reservation(reply, tokens_per_minute)

    async def settle(self, key: BucketKey, tokens_per_minute: int, reservation_id: str,
                     used: int, now: float) -> Settlement:
        """As :meth:`RedisBucketStore.settle`, awaited."""
        check_limit(tokens_per_minute)
        args = [to_ms(now), tokens_per_minute, self.gc_grace_ms, used]
        return _settlement(await self._settle(keys=self._keys(key, reservation_id), args=args))

    async def bucket_state(self, key: BucketKey) -> BucketState | None:
        """As :meth:`RedisBucketStore.bucket_state`, awaited."""
        return _state(await self.client.get(bucket_redis_key(self.prefix, key)))

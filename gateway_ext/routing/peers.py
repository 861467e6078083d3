"""What the gateway processes of a region share besides buckets: who is alive (so each admits
against its share of every pool's capacity) and a channel announcing reservations settled by a
process that did not admit them (so the admitting one frees the pool slot at once).

Redis keys, under the configured prefix::

    <prefix>:gateways     ZSET gateway id -> last heartbeat (ms, wall clock)
    <prefix>:released     pub/sub channel: a reservation id settled by another process

Each process heartbeats every ``heartbeat_s`` seconds: one pipelined round trip adds itself,
drops members silent for ``peer_ttl_s`` seconds and counts the rest (itself included). While
Redis is unreachable the last count stays (a process never assumes it is alone: that would admit
N x the pool); a process that stops leaves the set at once, one that dies ages out.

:func:`gateway_share` is the pure share maths.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import redis
import redis.asyncio

log = logging.getLogger(__name__)

REDIS_ERRORS = (redis.RedisError, OSError)


def gateway_share(capacity_tokens: int, live_gateways: int) -> int:
    """This process's share of a pool of ``capacity_tokens`` tokens in flight admitted to by
    ``live_gateways`` processes (itself included; below 1 counts as 1): the floor of an equal
    split, so the shares never add up to more than the pool, but at least 1 token of a non-empty
    pool (an idle share still runs one request) and 0 of an empty one."""
    if capacity_tokens <= 0:
        return 0
    return max(1, capacity_tokens // max(1, live_gateways))


def _raise_if_cancelled() -> None:
    """Re-raise a cancel of the current task that a Redis call swallowed (redis-py's read timeout
    can turn a cancel landing with it into a return), so the loops stop at shutdown."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def heartbeat_key(prefix: str) -> str:
    """The set of live gateway processes."""
    return f"{prefix}:gateways"


def released_channel(prefix: str) -> str:
    """The channel of reservations settled by a process that did not admit them."""
    return f"{prefix}:released"


class GatewayPeers:
    """This process (``gateway_id``) among its region's gateways, on an asyncio Redis client;
    ``clock`` is wall-clock seconds (shared with the other processes)."""

    def __init__(self, client: redis.asyncio.Redis, prefix: str, gateway_id: str,
                 clock: Callable[[], float], heartbeat_s: float = 1.0,
                 peer_ttl_s: float = 3.0) -> None:
        self.client = client
        self.prefix = prefix
        self.gateway_id = gateway_id
        self.clock = clock
        self.heartbeat_s = heartbeat_s
        self.peer_ttl_s = peer_ttl_s
        self.live = 1
        """Live gateway processes at the last heartbeat (1 until one succeeds)."""
        self.subscribed = False
        """Whether this process listens to the release channel now (releases announced while
        it does not are lost to it: those slots are freed when they expire)."""

    async def beat(self) -> int:
        """Heartbeat once; returns the live processes (raises on a Redis failure)."""
        now_ms = int(self.clock() * 1000)
        key = heartbeat_key(self.prefix)
        pipe = self.client.pipeline(transaction=True)
        pipe.zadd(key, {self.gateway_id: now_ms})
        pipe.zremrangebyscore(key, "-inf", now_ms - int(self.peer_ttl_s * 1000))
        pipe.zcard(key)
        pipe.pexpire(key, int(self.peer_ttl_s * 1000) * 10)
        replies = await pipe.execute()
        self.live = max(1, int(replies[2]))
        return self.live

    async def run_heartbeat(self, on_live: Callable[[int], None]) -> None:
        """Heartbeat every ``heartbeat_s`` seconds, calling ``on_live(count)`` after each one that
        succeeds, until cancelled; a failed one keeps the last count."""
        failing = False
        while True:
            try:
                on_live(await self.beat())
                failing = False
            except REDIS_ERRORS as exc:
                _raise_if_cancelled()
                if not failing:
                    log.warning("gateway heartbeat failed (%s): keeping %d live gateways",
                                exc.__class__.__name__, self.live)
                failing = True
            _raise_if_cancelled()
            await asyncio.sleep(self.heartbeat_s)

    async def leave(self) -> None:
        """Leave the live set (at shutdown), so the others take the capacity at once."""
        try:
            await self.client.zrem(heartbeat_key(self.prefix), self.gateway_id)
        except REDIS_ERRORS as exc:
            log.warning("could not leave the gateway set (%s)", exc.__class__.__name__)

    async def announce_release(self, reservation_id: str) -> None:
        """Tell every process that ``reservation_id`` was settled here (best effort)."""
        try:
            await self.client.publish(released_channel(self.prefix), reservation_id)
        except REDIS_ERRORS as exc:
            log.warning("could not announce a settle (%s): the admitting process frees the "
                        "slot when it expires", exc.__class__.__name__)

    async def run_releases(self, on_release: Callable[[str], None],
                           retry_s: float = 1.0) -> None:
        """Call ``on_release(reservation_id)`` for every release announced by any process
        (this one included), until cancelled; resubscribes ``retry_s`` seconds after a failure
        (announcements made meanwhile are lost: those slots expire)."""
        while True:
            pubsub = self.client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(released_channel(self.prefix))
                self.subscribed = True
                while True:
                    message = await pubsub.get_message(ignore_subscribe_messages=True,
                                                       timeout=1.0)
                    _raise_if_cancelled()
                    if message is not None and message.get("type") == "message":
                        data = message["data"]
                        on_release(data.decode() if isinstance(data, bytes) else str(data))
            except REDIS_ERRORS as exc:
                log.warning("release channel lost (%s): resubscribing in %.1f s",
                            exc.__class__.__name__, retry_s)
            finally:
                self.subscribed = False
                with contextlib.suppress(redis.RedisError, OSError):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]
            await asyncio.sleep(retry_s)

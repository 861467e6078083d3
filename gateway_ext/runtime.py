"""Everything the service runs on, built from :class:`~gateway_ext.settings.Settings` in named
steps: config -> bucket store -> pools -> pin store -> router -> core -> lifecycle, plus the usage
flusher and the metrics registry. Nothing global: the app factory
(:func:`gateway_ext.service.create_app`) receives it and starts the router feed and
:meth:`Runtime.background`.

With Redis the lifecycle is a :class:`~gateway_ext.shared_lifecycle.SharedLifecycle`: buckets, the
``max_concurrency`` count and the conversation pins on the asyncio client (fail open to memory),
pool capacity split between the live gateway processes (heartbeat) and settles of other
processes' reservations announced.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import socket
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import redis
import redis.asyncio
from prometheus_client import CollectorRegistry
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry
from sqlalchemy.exc import SQLAlchemyError

from gateway_ext.decision import GatewayCore
from gateway_ext.lifecycle import RequestLifecycle
from gateway_ext.limits.async_fallback_store import AsyncFallbackBucketStore
from gateway_ext.limits.bucket_store import BucketKey, BucketStore, MemoryBucketStore
from gateway_ext.limits.buckets import BucketState
from gateway_ext.limits.fallback_store import FallbackBucketStore
from gateway_ext.limits.pools import make_pools, pool_capacities, replicas_per_version
from gateway_ext.limits.redis_buckets import AsyncRedisBucketStore, RedisBucketStore
from gateway_ext.limits.redis_pipelining import ScriptPipeline
from gateway_ext.limits.retry_budget import RetryBudget
from gateway_ext.metering.meter import UsageMeter, UsageRow
from gateway_ext.metering.spool import FlushResult, UsageFlusher, UsageSpool
from gateway_ext.metering.store import UsageStore
from gateway_ext.metrics import GatewayMetrics, make_metrics
from gateway_ext.routing.async_pins import AsyncFallbackPinStore, AsyncRedisPinStore
from gateway_ext.routing.peers import GatewayPeers
from gateway_ext.routing.pins import FallbackPinStore, MemoryPinStore, PinStore, RedisPinStore
from gateway_ext.routing.router import Picking, Router, RoutingPolicy
from gateway_ext.settings import Settings
from gateway_ext.shared_lifecycle import SharedLifecycle
from modelfleet.config import PlatformConfig, load_config

log = logging.getLogger(__name__)


@dataclass
class Runtime:
    """The lifecycle, the usage flusher and the metrics registry of one gateway process."""

    settings: Settings
    config: PlatformConfig
    lifecycle: RequestLifecycle
    flusher: UsageFlusher
    usage_store: UsageStore
    registry: CollectorRegistry
    router: Router
    closers: list[Callable[[], None]] = field(default_factory=list)
    tables_ready: bool = False
    peers: GatewayPeers | None = None
    """This process among the region's gateways (with Redis)."""

    def background(self) -> list[Coroutine[Any, Any, None]]:
        """The loops the service runs while it serves: with Redis, the heartbeat (live gateways
        -> capacity shares) and the release channel (other processes' settles)."""
        lifecycle, peers = self.lifecycle, self.peers
        if peers is None or not isinstance(lifecycle, SharedLifecycle):
            return []
        return [peers.run_heartbeat(lifecycle.set_live_gateways),
                peers.run_releases(lifecycle.release_foreign, self.settings.redis_retry_s)]

    def store_degraded(self) -> bool:
        """True while the buckets fail open to this process's memory."""
        lifecycle = self.lifecycle
        store: object = lifecycle.astore if isinstance(lifecycle, SharedLifecycle) else lifecycle.core.store
        return bool(getattr(store, "degraded", False))

    def release_channel(self) -> str | None:
        """``subscribed`` or ``down`` with Redis; None without (one process, nothing to hear)."""
        if self.peers is None:
            return None
        return "subscribed" if self.peers.subscribed else "down"

    def live_gateways(self) -> int:
        """Gateway processes sharing the pools (1 without Redis)."""
        return self.lifecycle.live_gateways if isinstance(self.lifecycle, SharedLifecycle) else 1

    async def bucket_state(self, key: BucketKey) -> BucketState | None:
        """A bucket's stored state (awaited on Redis)."""
        if isinstance(self.lifecycle, SharedLifecycle):
            return await self.lifecycle.astore.bucket_state(key)
        return self.lifecycle.core.store.bucket_state(key)

    async def aclose(self) -> None:
        """Leave the live gateways and close the asyncio Redis client (at shutdown)."""
        if self.peers is not None:
            await self.peers.leave()
            await self.peers.client.aclose()

    async def flush(self) -> FlushResult:
        """Drain the meter (on the loop), then spool and write it from a worker thread."""
        rows = self.lifecycle.core.meter.drain()
        return await asyncio.to_thread(self._write, time.time(), rows)

    def _write(self, now: float, rows: list[UsageRow]) -> FlushResult:
        if not self.tables_ready:
            try:
                self.usage_store.create_tables()
                self.tables_ready = True
            except (SQLAlchemyError, OSError) as exc:
                log.warning("usage database unreachable, rows stay spooled: %s",
                            exc.__class__.__name__)
        return self.flusher.flush(now, rows)

    def close(self) -> None:
        """Close the database pool and the Redis client."""
        for close in self.closers:
            close()
        self.usage_store.dispose()


def make_store(settings: Settings, metrics: GatewayMetrics
               ) -> tuple[BucketStore, list[Callable[[], None]], redis.Redis | None]:
    """Memory buckets, or Redis buckets that fail open to memory (see
    :mod:`gateway_ext.limits.fallback_store`); returns the store, what closes it and the Redis client."""
    if settings.redis_url is None:
        return MemoryBucketStore(), [], None
    client = redis.Redis.from_url(
        settings.redis_url, socket_timeout=settings.redis_timeout_s,
        socket_connect_timeout=settings.redis_timeout_s, retry=Retry(NoBackoff(), 0))
    primary = RedisBucketStore(client, prefix=settings.redis_prefix)
    store = FallbackBucketStore(
        primary, (redis.RedisError, OSError), time.monotonic, settings.redis_retry_s,
        on_fallback=lambda op: metrics.store_fallbacks.labels(op=op).inc())
    return store, [client.close], client


def make_shared(settings: Settings, metrics: GatewayMetrics, clock: Callable[[], float]
                ) -> tuple[AsyncFallbackBucketStore, GatewayPeers, AsyncFallbackPinStore]:
    """The awaited Redis buckets (failing open to memory), this process's place among the
    region's gateways and the awaited conversation pins (:func:`make_async_pins`), on one asyncio
    client (``clock``: wall-clock seconds)."""
    assert settings.redis_url is not None
    client = redis.asyncio.Redis.from_url(
        settings.redis_url, socket_timeout=settings.redis_timeout_s,
        socket_connect_timeout=settings.redis_timeout_s, retry=AsyncRetry(NoBackoff(), 0))
    buckets = AsyncRedisBucketStore(client, prefix=settings.redis_prefix)
    store = AsyncFallbackBucketStore(
        buckets, (redis.RedisError, OSError), time.monotonic, settings.redis_retry_s,
        on_fallback=lambda op: metrics.store_fallbacks.labels(op=op).inc())
    gateway_id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    peers = GatewayPeers(client, settings.redis_prefix, gateway_id, clock,
                         settings.heartbeat_s, settings.peer_ttl_s)
    return store, peers, make_async_pins(settings, client, buckets.pipeline)


def make_async_pins(settings: Settings, client: redis.asyncio.Redis,
                    pipeline: ScriptPipeline | None = None) -> AsyncFallbackPinStore:
    """Conversation pins in Redis on the asyncio ``client`` (script calls sharing ``pipeline``'s
    round trips with the buckets), with this process's memory while Redis is down."""
    memory = MemoryPinStore(settings.pin_ttl_s, settings.pin_max_entries)
    primary = AsyncRedisPinStore(client, settings.redis_prefix, settings.pin_ttl_s,
                                 pipeline=pipeline)
    return AsyncFallbackPinStore(primary, memory, (redis.RedisError, OSError),
                                 settings.redis_retry_s)


def make_pins(settings: Settings, client: redis.Redis | None) -> PinStore:
    """Conversation pins on the sync path: in this process, or in Redis (shared by every gateway
    process) with this process's memory while Redis is down. The service's shared lifecycle awaits
    :func:`make_async_pins` instead."""
    memory = MemoryPinStore(settings.pin_ttl_s, settings.pin_max_entries)
    if client is None:
        return memory
    primary = RedisPinStore(client, settings.redis_prefix, settings.pin_ttl_s)
    return FallbackPinStore(primary, memory, (redis.RedisError, OSError), settings.redis_retry_s)


def make_router(settings: Settings, config: PlatformConfig, pools: list[str],
                client: redis.Redis | None, metrics: GatewayMetrics,
                rng: random.Random) -> Router:
    """The router over ``pools`` (version pins, replica picks), counting picks and pins."""
    policy = RoutingPolicy(Picking(settings.picking), settings.pick_bound,
                           settings.pick_floor_fraction)
    return Router(config, make_pins(settings, client), pools, policy, rng,
                  on_pick=lambda pool, reason: metrics.picks.labels(pool, reason).inc(),
                  on_pin=lambda outcome: metrics.pins.labels(outcome).inc())


def build_runtime(settings: Settings, config: PlatformConfig | None = None,
                  clock: Callable[[], float] = time.time) -> Runtime:
    """The runtime for ``settings`` (``config`` defaults to ``settings.config_dir``, read now;
    raises :class:`~modelfleet.config.ConfigError`). ``clock`` is wall-clock seconds."""
    config = config if config is not None else load_config(settings.config_dir).config
    rng = random.Random(settings.seed)
    registry = CollectorRegistry()
    metrics = make_metrics(registry)
    store, closers, client = make_store(settings, metrics)
    replicas = replicas_per_version(config, settings.replicas)
    pools = make_pools(config, pool_capacities(config, replicas), settings.max_queue,
                       settings.queue_timeouts_s)
    router = make_router(settings, config, list(pools), client, metrics, rng)
    meter = UsageMeter(settings.region or config.local.region)
    core = GatewayCore(config, store, pools, RetryBudget(rng), meter,
                       choose_team_version=router.choose_version,
                       max_body_bytes=settings.max_body_bytes)
    hooks: dict[str, Any] = {
        "on_start": lambda admitted, _now: router.route(admitted, router.clock()),
        "on_end": router.release}
    peers: GatewayPeers | None = None
    if settings.redis_url is None:
        lifecycle = RequestLifecycle(core, metrics, clock, **hooks)
    else:
        astore, peers, router.async_pins = make_shared(settings, metrics, clock)
        core.store = astore.fallback  # every hot path awaits astore; no sync Redis call
        lifecycle = SharedLifecycle(core, metrics, clock, astore, peers,
                          choose_version=router.choose_version_async, **hooks)
    for key in pools:
        metrics.observe_pool(key, pools[key].view())
    usage_store = UsageStore(settings.usage_db_url, settings.usage_table_prefix)
    flusher = UsageFlusher(meter, usage_store, UsageSpool(settings.spool))
    return Runtime(settings, config, lifecycle, flusher, usage_store, registry, router, closers,
                   peers=peers)

"""Router-state publication: built from pool state (pure), versioned, long-polled, saved to a file.

A change of who serves what (a replica in or out of the ring, an alias or canary change) is
published at once; a change of load figures alone at most once per ``load_interval_s`` (1 s),
so ``state_version`` does not move with every heartbeat. Long polls (``wait_past``) wake on
each publication. The state file is rewritten by the control plane's timer task (every ~250 ms)
when the version moved: at most four writes a second, each atomic.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

from envoy_control.resources.build import served_version_keys
from envoy_control.state.pool_state import PoolState

from modelfleet.config import PlatformConfig
from modelfleet.contract.router_state import write_router_state
from modelfleet.contract.router_state_types import (
    ModelAlias,
    PoolRoute,
    RoutableReplica,
    RouterState,
)
from modelfleet.contract.router_teams import TeamLimitRoute, TeamRoute


def build_router_state(
    config: PlatformConfig,
    pools: Mapping[str, PoolState],
    snapshot_version: str,
    beat_interval_s: float,
) -> RouterState:
    """The router state for ``config`` and ``pools`` (unstamped: version 0, no instance).

    Every served ``model@version`` is listed, with its routable replicas only (possibly none),
    and every team's effective limits (the config's with the admin overrides in effect).
    """
    routes = []
    for key in served_version_keys(config):
        model, _, version = key.partition("@")
        declared = config.version(model, version)
        pool = pools.get(key)
        members = pool.members if pool is not None else ()
        replicas = tuple(
            RoutableReplica(
                replica_id=m.replica_id,
                host=m.host,
                port=m.port,
                region=m.region,
                tokens_in_flight=m.tokens_in_flight,
                queue_depth=m.queue_depth,
                running=m.running,
                kv_cache_usage=m.kv_cache_usage,
                beating=m.last_beat_age_s is not None,
                beat_age_s=m.last_beat_age_s,
            )
            for m in members
            if m.routable
        )
        capacity = declared.capacity.tokens_in_flight if declared is not None else None
        routes.append(PoolRoute(model, version, capacity, replicas))
    aliases = tuple(
        ModelAlias(
            model=m.name,
            live=m.live,
            canary=m.canary.version if m.canary else None,
            canary_percent=m.canary.percent if m.canary else 0.0,
            shadow=m.shadow.version if m.shadow else None,
            shadow_fraction=m.shadow.fraction if m.shadow else 0.0,
        )
        for m in config.models
    )
    return RouterState(
        state_version=0,
        instance_id="",
        snapshot_version=snapshot_version,
        published_at=0.0,
        beat_interval_s=beat_interval_s,
        pools=tuple(sorted(routes, key=lambda p: p.key)),
        aliases=tuple(sorted(aliases, key=lambda a: a.model)),
        teams=team_routes(config),
    )


def team_routes(config: PlatformConfig) -> tuple[TeamRoute, ...]:
    """Every team's limits in ``config``, sorted by team and model."""
    return tuple(
        TeamRoute(t.name, tuple(
            TeamLimitRoute(lim.model, lim.tokens_per_minute, lim.max_concurrency,
                           lim.guaranteed_share, tuple(lim.tiers))
            for lim in sorted(t.limits, key=lambda x: x.model)))
        for t in sorted(config.teams, key=lambda t: t.name)
    )


class RouterPublisher:
    """The published router state, its version counter and the long polls waiting on it.

    ``clock`` is monotonic seconds (load throttling), ``wall_clock`` Unix seconds
    (``published_at``). Use from one asyncio loop: ``offer`` wakes waiters of that loop.
    """

    def __init__(
        self,
        *,
        load_interval_s: float = 1.0,
        first_version: int = 1,
        instance_id: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.load_interval_s = load_interval_s
        self.instance_id = instance_id or secrets.token_hex(6)
        self._next = first_version
        self._clock, self._wall_clock = clock, wall_clock
        self._current: RouterState | None = None
        self._published_at = 0.0
        self._saved_version: int | None = None
        self._waiters: list[asyncio.Future[None]] = []

    @property
    def current(self) -> RouterState | None:
        """The last published state (None before the first)."""
        return self._current

    def offer(self, candidate: RouterState) -> bool:
        """Publish ``candidate`` if it differs: at once for a routing change, for loads alone
        only once ``load_interval_s`` has passed since the last publication. True if published.
        """
        now = self._clock()
        current = self._current
        if current is not None:
            if current.unstamped() == candidate.unstamped():
                return False
            same_routing = current.routing() == candidate.routing()
            if same_routing and now - self._published_at < self.load_interval_s:
                return False
        self._current = replace(
            candidate,
            state_version=self._next,
            instance_id=self.instance_id,
            published_at=round(self._wall_clock(), 3),
        )
        self._next += 1
        self._published_at = now
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
        return True

    async def wait_past(self, after: int | None, timeout_s: float) -> RouterState | None:
        """The current state once its version differs from ``after``, or after ``timeout_s``
        seconds. Returns at once when it already differs (also when ``after`` is ahead: the
        caller saw an earlier control-plane instance) or when ``after`` is None."""
        current = self._current
        if current is None or after is None or current.state_version != after:
            return current
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await asyncio.wait({waiter}, timeout=timeout_s)
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
            waiter.cancel()
        return self._current

    @property
    def waiting(self) -> int:
        """Long polls waiting now."""
        return len(self._waiters)

    async def save(self, path: Path) -> bool:
        """Write the current state to ``path`` (atomically, in a thread) if its version changed
        since the last save; True if written. Raises OSError (the next call tries again)."""
        state = self._current
        if state is None or state.state_version == self._saved_version:
            return False
        await asyncio.to_thread(write_router_state, path, state)
        self._saved_version = state.state_version
        return True

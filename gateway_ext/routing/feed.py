"""The control plane's router state into the gateway (asyncio edge): long poll, file, capacity.

:class:`RouterFeed` long-polls ``GET /v1/router/state`` (``RouterStatePoller``, ``wait_s`` 1 s:
a healthy control plane answers at least every second, and within milliseconds of a change),
hands each newer state to the :class:`~gateway_ext.routing.router.Router` and sets every pool's
admission capacity (``RequestLifecycle.set_capacity``: routable replicas x the version's load-tested tokens
in flight per replica; canary replicas are their own pool's capacity, on top of the live one),
and puts the state's team limits (config + admin overrides) into the decisions
(:mod:`gateway_ext.limits.team_limits`): a ``PUT /admin/teams/{team}/limits`` applies without a restart.
A version of a known model that the state serves but this gateway's config does not declare
(registered through the admin API later) gets an admission pool once it has routable replicas
(:func:`gateway_ext.limits.pools.with_state_pool`), so its canary or alias needs no gateway restart.

At start it takes the state file (the control plane's ``--state-file``, or this gateway's own
copy with ``write_file``) if there is one, so a gateway restarted while the control plane is
down routes and admits on the last state instead of the config's guess. While the control plane
is unreachable the last state stays in force (Envoy, likewise, keeps its last configuration);
when it comes back (a new ``instance_id``) its state is taken as it is.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from gateway_ext.lifecycle import RequestLifecycle
from gateway_ext.limits.pools import with_state_pool
from gateway_ext.limits.team_limits import with_team_limits
from gateway_ext.routing.poller import Fetch, RouterStatePoller, http_fetch
from gateway_ext.routing.router import Router
from modelfleet.contract.router_state import load_router_state, write_router_state
from modelfleet.contract.router_state_types import RouterState, RouterStateError

log = logging.getLogger(__name__)


def read_state_file(path: Path | None) -> RouterState | None:
    """The saved state at ``path``; None when there is none or it is unreadable (logged)."""
    if path is None:
        return None
    try:
        return load_router_state(path)
    except (RouterStateError, OSError) as exc:
        log.warning("router state file %s ignored: %s", path, exc)
        return None


class RouterFeed:
    """Keeps ``router`` and the ``lifecycle``'s pool capacities on the control plane's state."""

    def __init__(self, router: Router, lifecycle: RequestLifecycle, fetch: Fetch | None, *,
                 state_file: Path | None = None, write_file: bool = False,
                 wait_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.router, self.lifecycle, self.clock = router, lifecycle, clock
        self.state_file, self.write_file = state_file, write_file
        self._capacity: dict[str, int] = {}
        self._writes: set[asyncio.Task[None]] = set()
        initial = read_state_file(state_file)
        if initial is not None:
            log.info("routing from %s: state %d of control plane %s", state_file,
                     initial.state_version, initial.instance_id)
            self._apply(initial, "file")
        self.poller = None if fetch is None else RouterStatePoller(
            fetch, initial=initial, wait_s=wait_s, clock=clock, on_change=self._taken)

    @classmethod
    def over_http(cls, router: Router, lifecycle: RequestLifecycle, client: httpx.AsyncClient,
                  control_plane_url: str | None, **kwargs: object) -> RouterFeed:
        """A feed polling ``control_plane_url`` with ``client`` (None: the file alone)."""
        fetch = http_fetch(client, control_plane_url.rstrip("/")) if control_plane_url else None
        return cls(router, lifecycle, fetch, **kwargs)  # type: ignore[arg-type]

    def _taken(self, state: RouterState) -> None:
        self._apply(state, "control-plane")
        if self.write_file and self.state_file is not None:
            task = asyncio.get_running_loop().create_task(self._save(state))
            self._writes.add(task)
            task.add_done_callback(self._writes.discard)

    def _apply(self, state: RouterState, source: str) -> None:
        core = self.lifecycle.core
        config = with_team_limits(core.config, state.teams)
        if config is not core.config:
            log.info("team limits from %s: state %d", source, state.state_version)
            core.use_config(config)
        capacities = self.router.apply_state(state, self.clock(), source)
        for pool, capacity in capacities.items():
            if pool not in self.lifecycle.core.pools and capacity > 0:
                self._add_pool(pool)
            if self._capacity.get(pool) != capacity and pool in self.lifecycle.core.pools:
                self.lifecycle.set_capacity(pool, capacity)
                self._capacity[pool] = capacity

    def _add_pool(self, key: str) -> None:
        """An admission pool for a version only the state serves (registered through the admin
        API after this gateway started), once it has routable replicas."""
        core = self.lifecycle.core
        pools = with_state_pool(core.pools, core.config, key, 0)
        if pools is not None:
            core.pools = pools
            self.router.serve(key)
            log.info("pool %s added from the router state", key)

    async def _save(self, state: RouterState) -> None:
        assert self.state_file is not None
        try:
            await asyncio.to_thread(write_router_state, self.state_file, state)
        except OSError as exc:
            log.warning("router state not saved to %s: %s", self.state_file, exc)

    def staleness_s(self) -> float | None:
        """Seconds since the control plane last answered (None: never)."""
        return None if self.poller is None else self.poller.staleness_s()

    async def run(self) -> None:
        """Poll until cancelled (returns at once without a control plane)."""
        if self.poller is not None:
            await self.poller.run()

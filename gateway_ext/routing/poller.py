"""The gateway side of router-state publication: long-poll the control plane, keep the last state.

    from gateway_ext.routing.poller import RouterStatePoller, http_fetch
    from modelfleet.contract.router_state import load_router_state

    poller = RouterStatePoller(http_fetch(client, cp_url), initial=load_router_state(path))
    task = asyncio.create_task(poller.run())   # poller.state: the newest state, or the file's

Everything but :func:`http_fetch` is I/O-free: the fetch function, clock and sleep are injected.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from modelfleet.contract.router_state import parse_router_state
from modelfleet.contract.router_state_types import RouterState

log = logging.getLogger(__name__)


def is_newer(current: RouterState | None, candidate: RouterState) -> bool:
    """Whether a gateway holding ``current`` should take ``candidate``: a later version of the
    same control plane, or any state from another control-plane instance (it restarted)."""
    if current is None or candidate.instance_id != current.instance_id:
        return True
    return candidate.state_version > current.state_version


Fetch = Callable[[int | None, float], Awaitable[Any]]
"""``fetch(after, wait_s)``: the decoded JSON of ``GET /v1/router/state?after=&wait_s=``."""


def http_fetch(client: httpx.AsyncClient, base_url: str) -> Fetch:
    """A :data:`Fetch` over ``client`` against the control plane at ``base_url``."""

    async def fetch(after: int | None, wait_s: float) -> Any:
        params: dict[str, float] = {"wait_s": wait_s}
        if after is not None:
            params["after"] = after
        r = await client.get(f"{base_url}/v1/router/state", params=params, timeout=wait_s + 5)
        r.raise_for_status()
        return r.json()

    return fetch


class RouterStatePoller:
    """Keeps ``state`` current by long-polling ``fetch``; on errors keeps the last state.

    ``wait_s`` (seconds) bounds each long poll, so a healthy control plane answers at least that
    often; after a failed fetch the poller waits ``retry_s`` seconds. ``clock`` (seconds) and
    ``sleep`` are injected for tests; ``on_change`` is called with each state taken.
    """

    def __init__(
        self,
        fetch: Fetch,
        *,
        initial: RouterState | None = None,
        wait_s: float = 1.0,
        retry_s: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        on_change: Callable[[RouterState], None] | None = None,
    ) -> None:
        self.state = initial
        self.last_ok_at: float | None = None
        self.last_error: str | None = None
        self._fetch, self._wait_s, self._retry_s = fetch, wait_s, retry_s
        self._clock, self._sleep, self._on_change = clock, sleep, on_change

    def staleness_s(self) -> float | None:
        """Seconds since the control plane last answered; None if it never did."""
        return None if self.last_ok_at is None else self._clock() - self.last_ok_at

    async def poll_once(self) -> bool:
        """One long poll; True when it brought a newer state. Never raises on fetch errors."""
        after = self.state.state_version if self.state is not None else None
        try:
            candidate = parse_router_state(await self._fetch(after, self._wait_s))
        except Exception as exc:  # a gateway keeps routing on the last state, whatever failed
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.warning("router state fetch failed, keeping version %s: %s", after, exc)
            return False
        self.last_ok_at, self.last_error = self._clock(), None
        if not is_newer(self.state, candidate):
            return False
        self.state = candidate
        if self._on_change is not None:
            self._on_change(candidate)
        return True

    async def run(self) -> None:
        """Poll until cancelled."""
        while True:
            await self.poll_once()
            if self.last_error is not None:
                await self._sleep(self._retry_s)

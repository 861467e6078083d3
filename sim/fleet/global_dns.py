"""Two regions (or more) behind global DNS routing, as Route53 latency records with health
checks (components/aws/global_routing.py): each client resolves the API name to its nearest
region; when that region's health check fails, DNS answers with another one.

Health checks run every ``interval_s`` (10 s) and mark a region unhealthy after ``failures``
(3) failed checks in a row; a lost region fails every check from the moment it is lost, so it
is unhealthy from the third check at or after the loss (at most ``interval_s x failures`` after
it). Clients cache the DNS answer for ``ttl_s`` (60 s): each client (conversation) refreshes at
its own phase in the TTL, and moves to the survivor at its first refresh after the region is
marked unhealthy. Until then its requests, and its retries, fail with a connection error.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gateway_ext.routing.versions import split_point
from modelfleet.config.schema import PlatformConfig
from sim.fleet.clients import Clients, RetryPolicy
from sim.fleet.loop import TICK, Loop
from sim.fleet.measures import RequestRow
from sim.fleet.region import Fleet, Progress
from sim.fleet.types import FleetSpec
from sim.traces.arrivals import Arrival


@dataclass(frozen=True)
class GlobalRouting:
    """Health-check interval and failure threshold, DNS TTL (seconds); the IaC's values."""

    interval_s: float = 10.0
    failures: int = 3
    ttl_s: float = 60.0

    def unhealthy_at(self, lost_s: float) -> float:
        """When a region lost at ``lost_s`` seconds is marked unhealthy (seconds)."""
        first = math.ceil(lost_s / self.interval_s) * self.interval_s
        return first + (self.failures - 1) * self.interval_s

    def last_refresh(self, phase: float, t: float) -> float:
        """The last DNS refresh at or before ``t`` of a client whose phase is ``phase`` in [0, 1)
        of the TTL (seconds)."""
        offset = phase * self.ttl_s
        return offset + math.floor((t - offset) / self.ttl_s) * self.ttl_s

    def worst_case_s(self, lost_s: float) -> float:
        """Seconds after the loss by which every client has moved: unhealthy plus one TTL."""
        return self.unhealthy_at(lost_s) + self.ttl_s - lost_s


class Router:
    """Which region each client's DNS answer names at a time."""

    def __init__(self, regions: Sequence[str], routing: GlobalRouting) -> None:
        self.regions, self.routing = tuple(regions), routing
        self.unhealthy: dict[str, float] = {}

    def home(self, a: Arrival) -> tuple[str, float]:
        """The client's nearest region and its DNS phase, from its id (a stable hash)."""
        key = a.conversation_id or f"t{a.time_s!r}"
        point = split_point(key)
        index = min(len(self.regions) - 1, int(point * len(self.regions)))
        return self.regions[index], split_point(key + "/dns")

    def route(self, a: Arrival, t: float) -> str:
        """The region a request of ``a``'s client goes to at ``t`` seconds."""
        home, phase = self.home(a)
        since = self.unhealthy.get(home)
        if since is None or self.routing.last_refresh(phase, t) < since:
            return home
        healthy = [r for r in self.regions if r not in self.unhealthy]
        return healthy[self.regions.index(home) % len(healthy)] if healthy else home


@dataclass
class RegionsRun:
    """The regions after the run, their shared clients and the router."""

    fleets: dict[str, Fleet]
    clients: Clients
    router: Router

    @property
    def rows(self) -> list[RequestRow]:
        """One row per request that first arrived in the window (every region)."""
        return self.clients.rows


def run_regions(specs: Sequence[FleetSpec], config: PlatformConfig, arrivals: Iterable[Arrival],
                routing: GlobalRouting, lose: tuple[str, float] | None = None,
                retry: RetryPolicy | None = None, progress: Progress | None = None) -> RegionsRun:
    """Simulate one fleet per spec (distinct ``region`` names, the same window) behind
    ``routing``; ``lose``: ``(region, seconds)`` loses that region then."""
    loop = Loop()
    router = Router([s.region for s in specs], routing)
    first = specs[0]
    window = (first.warmup_s, first.warmup_s + first.duration_s)
    fleets: dict[str, Fleet] = {}
    clients = Clients(loop, fleets, router.route, window, retry, first.seed)
    for i, spec in enumerate(specs):
        fleets[spec.region] = Fleet(spec, config, progress if i == 0 else None, loop, clients)
    if lose is not None:
        region, at_s = lose
        if region not in fleets:
            raise ValueError(f"no region {region!r} to lose")

        def loss(fleet: Fleet, t: float) -> None:
            if fleet.up and t >= at_s:
                fleet.fail(t)
                router.unhealthy[region] = routing.unhealthy_at(t)

        fleets[region].hooks.append(loss)
    clients.start(arrivals)
    for fleet in fleets.values():
        loop.push(0.0, fleet, TICK, None)
    loop.run(max(f.end_s for f in fleets.values()))
    return RegionsRun(fleets, clients, router)

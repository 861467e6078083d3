"""The gateway's router: version resolution with pins, and the replica pick Envoy follows.

:class:`Router` holds the control plane's latest :class:`~modelfleet.contract.router_state.RouterState`
(aliases, routable replicas and their reported tokens in flight), the pin store and the
:class:`~gateway_ext.routing.replica_load.SentLedger`. It decides on plain data with a clock passed in;
the long poll that feeds it is :mod:`gateway_ext.routing.feed`.

* :meth:`Router.choose_version` (step 6 of the decision): explicit ``@vN``, else the pinned
  version, else the canary split, pinned (:mod:`gateway_ext.routing.versions`); conversations are
  scoped by (team, model, conversation id). One pure plan (:meth:`Router.version_plan`) and
  two ways to resolve its pin: on the sync store, or awaited (:meth:`Router.choose_version_async`,
  the shared lifecycle's path). Aliases come from the router state, or from the
  gateway's own config until a state arrives.
* :meth:`Router.route` (when a request is admitted, at once or out of the queue): a replica of
  the version's pool by :mod:`gateway_ext.routing.picking` over the routable replicas whose last beat is
  not stale (:meth:`~modelfleet.contract.router_state.RouterState.stale`; all of them if every one
  is), loads = last report + sent since; the choice and its fallbacks go to Envoy as
  ``ip:port,ip:port,...`` in
  ``x-gateway-destination-endpoint`` (Envoy's ``override_host`` policy tries them in order, one
  per attempt; an address not in the cluster is skipped). No state or no replica: no header,
  and Envoy's ring hash (``hash_balance_factor`` 125) picks.
* :meth:`Router.apply_state`: a new state; returns each pool's capacity (routable replicas x
  the version's load-tested tokens in flight per replica) for admission, also for a version of
  a known model that only the state serves (the feed then adds its pool: :meth:`Router.serve`).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from gateway_ext.decision import Admitted
from gateway_ext.request import ChatRequest
from gateway_ext.routing.async_pins import AsyncPinStore
from gateway_ext.routing.picking import (
    Pick,
    Ring,
    build_ring,
    first_choices,
    over_bound,
    pick,
    pick_least_loaded,
    pick_round_robin,
)
from gateway_ext.routing.pins import PinStore
from gateway_ext.routing.replica_load import SentLedger
from gateway_ext.routing.versions import (
    PinAsk,
    VersionReason,
    alias_of,
    choose,
    conversation_key,
    pin_targets,
)
from modelfleet.config.schema import PlatformConfig
from modelfleet.contract.headers import DESTINATION_HEADER
from modelfleet.contract.router_state_types import ModelAlias, PoolRoute, RouterState

log = logging.getLogger(__name__)


class Picking(StrEnum):
    """Replica-picking policies (the routing A/B's three; production runs ``affinity``)."""

    AFFINITY = "affinity"
    LEAST_TOKENS = "least_tokens"
    ROUND_ROBIN = "round_robin"


@dataclass(frozen=True)
class RoutingPolicy:
    """``bound``: skip a replica above this multiple of the pool's average tokens in flight,
    unless it holds at most ``floor_fraction`` of its load-tested tokens in flight;
    ``max_fallbacks``: addresses after the choice, for Envoy's retries."""

    picking: Picking = Picking.AFFINITY
    bound: float = 1.25
    floor_fraction: float = 0.1
    max_fallbacks: int = 2


class Router:
    """Version resolution and replica picking for the pools in ``pools`` (``model@version``)."""

    def __init__(self, config: PlatformConfig, pins: PinStore, pools: Collection[str],
                 policy: RoutingPolicy | None = None, rng: random.Random | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 on_pick: Callable[[str, str], None] | None = None,
                 on_pin: Callable[[str], None] | None = None,
                 async_pins: AsyncPinStore | None = None) -> None:
        self.config, self.pins, self.pools = config, pins, set(pools)
        self.async_pins = async_pins
        """Where :meth:`choose_version_async` resolves pins (the service's asyncio Redis)."""
        self.policy = policy or RoutingPolicy()
        self.rng = rng or random.Random()
        self.clock = clock
        self.ledger = SentLedger()
        self.state: RouterState | None = None
        self.state_received_at: float | None = None
        self.source = "config"
        """Where the routing comes from: ``config`` (no state yet), ``file`` or ``control-plane``."""
        self._on_pick, self._on_pin = on_pick, on_pin
        self._rings: dict[str, Ring] = {}
        self._turns: dict[str, int] = {}

    def alias(self, model: str) -> ModelAlias | None:
        """Where ``model``'s traffic goes: the router state's alias, else the config's; a canary
        this gateway has no pool for is left out."""
        alias = self.state.alias(model) if self.state is not None else None
        if alias is None:
            declared = self.config.model(model)
            alias = alias_of(declared) if declared is not None else None
        if alias is not None and alias.canary and f"{model}@{alias.canary}" not in self.pools:
            alias = replace(alias, canary=None, canary_percent=0.0)
        return alias

    def serve(self, key: str) -> None:
        """Admission now has a pool for ``key`` (``model@version``): route to it."""
        self.pools.add(key)

    def version_plan(self, request: ChatRequest, team: str | None = None) -> str | PinAsk:
        """Step 6 without the pin store: the version (``v13``) of an authorized, parsed request of
        ``team``, or the pin to resolve (a split conversation); see :mod:`gateway_ext.routing.versions`.
        A conversation's split point and pin belong to (team, model, conversation id): two teams
        reusing an id never share a pin. The sync and the awaited paths both start here."""
        alias = self.alias(request.model)
        if alias is None:
            raise ValueError(f"unknown model {request.model!r}")
        cid = request.conversation_id
        draw = self.rng.random() if not cid else 0.0
        key = conversation_key(team, request.model, cid) if cid else None
        choice = choose(alias, request.version, key, draw)
        if choice.reason is not VersionReason.SPLIT or not cid:
            return choice.version
        return PinAsk(team or "", request.model, cid, choice.version, pin_targets(alias))

    def choose_version(self, request: ChatRequest, team: str | None = None) -> str:
        """:meth:`version_plan`, its pin resolved on :attr:`pins` (blocking when in Redis)."""
        plan = self.version_plan(request, team)
        if isinstance(plan, str):
            return plan
        return self._pinned(*self.pins.resolve(*plan.args()))

    async def choose_version_async(self, request: ChatRequest, team: str | None = None) -> str:
        """:meth:`version_plan`, its pin resolved on :attr:`async_pins` (awaited), else on
        :attr:`pins`."""
        plan = self.version_plan(request, team)
        if isinstance(plan, str):
            return plan
        if self.async_pins is None:
            return self._pinned(*self.pins.resolve(*plan.args()))
        return self._pinned(*await self.async_pins.resolve(*plan.args()))

    def _pinned(self, version: str, written: bool) -> str:
        if self._on_pin is not None:
            self._on_pin("new" if written else "kept")
        return version

    def route(self, admitted: Admitted, now: float) -> Admitted:
        """``admitted`` with ``x-gateway-destination-endpoint`` set, its tokens counted on the
        chosen replica; unchanged when the pool has no routable replica in the state."""
        pool = self.state.pool(admitted.pool) if self.state is not None else None
        if pool is None or not pool.replicas:
            return admitted
        loads = self.ledger.loads({r.replica_id: r.tokens_in_flight for r in pool.replicas})
        chosen = self.pick(pool, admitted.request.conversation_id, loads, self.stale_ids(pool))
        self.ledger.add(admitted.reservation_id, chosen.replica,
                        admitted.request.reserve_tokens, now)
        if self._on_pick is not None:
            self._on_pick(pool.key, str(chosen.reason))
        address = {r.replica_id: r.address for r in pool.replicas}
        value = ",".join(address[r] for r in (chosen.replica, *chosen.fallbacks))
        return replace(admitted, headers={**admitted.headers, DESTINATION_HEADER: value})

    def stale_ids(self, pool: PoolRoute) -> frozenset[str]:
        """Replicas of ``pool`` whose last beat was stale when the state was published."""
        state = self.state
        return frozenset(r.replica_id for r in pool.replicas
                         if state is not None and state.stale(r))

    def pick(self, pool: PoolRoute, conversation_id: str | None,
             loads: Mapping[str, int], stale: Collection[str] = ()) -> Pick:
        """The policy's pick among ``pool``'s routable replicas (``loads`` in tokens), leaving
        out the ``stale`` ones unless every replica is stale."""
        ids = first_choices([r.replica_id for r in pool.replicas], stale)
        fallbacks = self.policy.max_fallbacks
        if self.policy.picking is Picking.LEAST_TOKENS:
            return pick_least_loaded(ids, loads, fallbacks)
        if self.policy.picking is Picking.ROUND_ROBIN:
            turn = self._turns.get(pool.key, 0)
            self._turns[pool.key] = turn + 1
            return pick_round_robin(ids, turn, fallbacks)
        return pick(self._ring(pool.key, ids), conversation_id, loads, self.policy.bound,
                    fallbacks, self.floor_tokens(pool))

    def floor_tokens(self, pool: PoolRoute) -> int:
        """Tokens in flight below which a replica is never skipped for load."""
        return round(self.policy.floor_fraction * self.replica_capacity(pool))

    def replica_capacity(self, pool: PoolRoute) -> int:
        """Load-tested tokens in flight of one replica of ``pool`` (state, else config)."""
        if pool.replica_capacity_tokens is not None:
            return pool.replica_capacity_tokens
        declared = self.config.version(pool.model, pool.version)
        return declared.capacity.tokens_in_flight if declared is not None else 0

    def _ring(self, key: str, ids: tuple[str, ...]) -> Ring:
        ring = self._rings.get(key)
        if ring is None or ring.replicas != tuple(sorted(ids)):
            ring = self._rings[key] = build_ring(ids)
        return ring

    def release(self, request_id: str) -> None:
        """A routed request ended (settled or abandoned)."""
        self.ledger.remove(request_id)

    def apply_state(self, state: RouterState, now: float, source: str = "control-plane"
                    ) -> dict[str, int]:
        """Route on ``state`` from ``now`` (seconds); returns capacity (tokens in flight) per pool
        this gateway admits to: 0 for a pool the state does not serve."""
        before = self._stale_now()
        self.state, self.state_received_at, self.source = state, now, source
        after = self._stale_now()
        for rid in sorted(after - before):
            log.info("replica %s: last beat stale in state %d, not a first choice", rid,
                     state.state_version)
        for rid in sorted(before - after):
            log.info("replica %s: beating again (or gone) in state %d", rid, state.state_version)
        self.ledger.reported(now)
        self.ledger.expire(now)
        out = {}
        known = {p.key for p in state.pools if self.config.model(p.model) is not None}
        for key in sorted(self.pools | known):
            pool = state.pool(key)
            out[key] = 0 if pool is None else self.replica_capacity(pool) * len(pool.replicas)
        return out

    def _stale_now(self) -> frozenset[str]:
        state = self.state
        return frozenset().union(*(self.stale_ids(p) for p in state.pools)) if state else frozenset()

    def view(self) -> dict[str, Any]:
        """The routing as this gateway sees it now (debug endpoint): per pool and replica, the
        reported and pending tokens, the load and whether it is over the bound."""
        state = self.state
        out: dict[str, Any] = {
            "source": self.source, "picking": str(self.policy.picking),
            "state_version": state.state_version if state else None,
            "instance_id": state.instance_id if state else None,
            "age_s": None if self.state_received_at is None
            else round(self.clock() - self.state_received_at, 3),
            "aliases": {m.name: (a.__dict__ if (a := self.alias(m.name)) else None)
                        for m in self.config.models},
            "pools": {},
        }
        for pool in state.pools if state else ():
            reported = {r.replica_id: r.tokens_in_flight for r in pool.replicas}
            loads = self.ledger.loads(reported)
            over = over_bound(loads, list(loads), self.policy.bound, self.floor_tokens(pool))
            stale = self.stale_ids(pool)
            out["pools"][pool.key] = {"floor_tokens": self.floor_tokens(pool), "replicas": [
                {"replica_id": r.replica_id, "address": r.address, "reported": r.tokens_in_flight,
                 "pending": self.ledger.pending(r.replica_id), "load": loads[r.replica_id],
                 "over_bound": r.replica_id in over, "beat_age_s": r.beat_age_s,
                 "stale": r.replica_id in stale} for r in pool.replicas]}
        return out

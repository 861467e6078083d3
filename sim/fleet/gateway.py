"""The gateway in the simulator: the production decision and picking code on plain data.

Per request, what ``gateway_ext`` does after parsing: the retry budget, then
:class:`gateway_ext.decision.GatewayCore` (tier check, the team's token bucket in a
:class:`~gateway_ext.limits.bucket_store.MemoryBucketStore`, the version, admission by tier on the
pool's :class:`~gateway_ext.limits.admission.PoolAdmission`), then a replica from
:mod:`gateway_ext.routing.picking`. Finishing requests settle their reservation and free their pool slot
through ``GatewayCore.finish`` / ``abandon``. Nothing here decides anything itself.

The picker's view of a replica's load is what the issue specifies: its last heartbeat report
of tokens in flight (every ``heartbeat_s``) plus the tokens this gateway has sent it since.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from enum import StrEnum

from gateway_ext.decision import Admitted, GatewayCore, Refused
from gateway_ext.limits.admission import PoolAdmission, pool_capacity_tokens
from gateway_ext.limits.admission_types import AdmissionConfig, Outcome
from gateway_ext.limits.bucket_store import MemoryBucketStore
from gateway_ext.limits.retry_budget import RetryBudget, retry_after_headers
from gateway_ext.metering.meter import UsageMeter
from gateway_ext.request import ChatRequest
from gateway_ext.routing.picking import Ring, build_ring, pick, pick_least_loaded, pick_round_robin
from gateway_ext.routing.router import RoutingPolicy
from modelfleet.config.keys import Authenticated
from modelfleet.config.schema import PlatformConfig
from modelfleet.contract.errors import rate_limited
from sim.traces.arrivals import Arrival


class Routing(StrEnum):
    """The replica-picking policies of the routing A/B."""

    ROUND_ROBIN = "round-robin"
    LEAST_LOADED = "least-loaded"
    AFFINITY = "affinity"


class PoolPicker:
    """The gateway's view of one pool (``model@version``): its serving replicas, the ring, the
    heartbeat reports and the tokens sent since, and the picking policy."""

    def __init__(self, routing: Routing, bound: float, capacity_tokens_per_replica: int) -> None:
        self.routing, self.bound = routing, bound
        self.capacity_tokens_per_replica = capacity_tokens_per_replica
        # the production picker's floor: a replica holding at most this many tokens in flight is
        # never skipped for load (gateway_ext.routing.router.RoutingPolicy.floor_fraction)
        self.floor_tokens = round(RoutingPolicy().floor_fraction * capacity_tokens_per_replica)
        self.members: tuple[str, ...] = ()
        self.ring: Ring | None = None
        self.reported: dict[str, int] = {}
        self.sent: dict[str, int] = {}
        self._counter = 0

    def pick(self, conversation_id: str | None, tokens: int) -> str:
        """The replica for a request of ``tokens`` (prompt + max_tokens), by the routing policy;
        counts the tokens as sent to it until its next report."""
        if self.ring is None:
            raise RuntimeError("no serving replica to pick from")
        reported, sent = self.reported, self.sent
        loads = {r: reported.get(r, 0) + sent.get(r, 0) for r in self.members}
        if self.routing is Routing.AFFINITY:
            chosen = pick(self.ring, conversation_id, loads, self.bound,
                          floor_tokens=self.floor_tokens).replica
        elif self.routing is Routing.LEAST_LOADED:
            chosen = pick_least_loaded(self.members, loads).replica
        else:
            chosen = pick_round_robin(self.members, self._counter).replica
            self._counter += 1
        sent[chosen] = sent.get(chosen, 0) + tokens
        return chosen

    def report(self, loads: dict[str, int]) -> None:
        """Heartbeats: each replica's tokens in flight now (tokens); forgets what was sent."""
        self.reported = dict(loads)
        self.sent = {}

    def set_members(self, replica_ids: Sequence[str]) -> None:
        """The serving replicas changed: rebuild the ring."""
        ids = tuple(sorted(replica_ids))
        if ids != self.members:
            self.members = ids
            self.ring = build_ring(ids) if ids else None


class SimGateway:
    """One gateway process of a region in front of a model's pools (``model@version``): the
    live version's, and any other (a canary) added with :meth:`add_pool`."""

    def __init__(self, config: PlatformConfig, model: str, version: str, routing: Routing,
                 capacity_tokens_per_replica: int, admission: AdmissionConfig | None = None,
                 bound: float = 1.25, seed: int = 0, region: str = "sim",
                 choose_version: Callable[[ChatRequest], str] | None = None) -> None:
        self.model, self.version = model, version
        self.pool_key = f"{model}@{version}"
        self.routing, self.bound = routing, bound
        self.capacity_tokens_per_replica = capacity_tokens_per_replica
        self.admission = admission or AdmissionConfig()
        self.store = MemoryBucketStore()
        self.pools: dict[str, PoolAdmission] = {}
        self.pickers: dict[str, PoolPicker] = {}
        self.core = GatewayCore(config, self.store, self.pools,
                                RetryBudget(random.Random(seed)), UsageMeter(region),
                                choose_version=choose_version or (lambda _req: version))
        self._teams = {t.name: Authenticated(t) for t in config.teams}
        self.add_pool(version, capacity_tokens_per_replica)
        self.pool = self.pools[self.pool_key]
        self.main = self.pickers[self.pool_key]

    def add_pool(self, version: str, capacity_tokens_per_replica: int) -> str:
        """Serve ``model@version`` too (no replicas yet); returns its pool key."""
        key = f"{self.model}@{version}"
        self.pools[key] = PoolAdmission(0, self.admission)
        self.pickers[key] = PoolPicker(self.routing, self.bound, capacity_tokens_per_replica)
        return key

    def offer(self, a: Arrival, request_id: str, now: float) -> Admitted | Refused:
        """Decide on arrival ``a`` at ``now`` (seconds), as ``GatewayCore.decide`` does after it
        has parsed the body: retry budget, tier, bucket, version, admission."""
        auth = self._teams.get(a.team)
        if auth is None:
            raise ValueError(f"arrival of unknown team {a.team!r}")
        print_ = f"c:{a.conversation_id}" if a.conversation_id else f"r:{request_id}"
        check = self.core.retry.check(a.team, print_, now)
        if not check.allowed:
            error = rate_limited("Too many retries before Retry-After.", code="retry_budget_exceeded")
            return Refused(error.with_headers(retry_after_headers(check.retry_after_s)), a.team)
        req = ChatRequest(a.model, None, (), a.reserve_max_tokens, True, 1, True, a.tier,
                          a.conversation_id, a.prompt_tokens)
        # GatewayCore.decide parses bytes; the simulator has the parsed request already.
        return self.core.charge(auth, req, print_, now, request_id)

    def set_members(self, pool_key: str, replica_ids: Sequence[str], now: float) -> list[Outcome]:
        """The serving replicas of ``pool_key`` changed: rebuild its ring and its admission
        capacity (load-tested tokens in flight per replica x replicas); returns the queued
        requests admitted."""
        picker = self.pickers[pool_key]
        picker.set_members(replica_ids)
        return self.pools[pool_key].set_capacity(
            pool_capacity_tokens(picker.capacity_tokens_per_replica, len(picker.members)), now)

    def finish(self, admitted: Admitted, prompt_tokens: int, cached_tokens: int,
               output_tokens: int, now: float) -> list[Outcome]:
        """A request ended with its real usage (tokens): settle, meter, free its pool slot."""
        return self.core.finish(admitted, prompt_tokens, cached_tokens, output_tokens, now)[1]

    def abandon(self, admitted: Admitted, now: float, shed: bool) -> list[Outcome]:
        """A queued request left without running (shed or timed out if ``shed``)."""
        return self.core.abandon(admitted, now, shed)

    def expire(self, now: float) -> list[Outcome]:
        """Queue timeouts (503s) at ``now`` (seconds) and the admissions they make room for."""
        out: list[Outcome] = []
        for pool in self.pools.values():
            out.extend(pool.expire(now))
        return out

    def queued(self) -> int:
        """Requests waiting in the admission queues of every pool."""
        return sum(sum(p.view().queued.values()) for p in self.pools.values())

    def sweep(self, now: float) -> None:
        """Forget bucket reservations expired at ``now`` (seconds); the service does it periodically."""
        self.store.sweep(now)

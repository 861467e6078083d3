"""Router state as gateways read it: the frozen dataclasses (standard library only, like
:mod:`modelfleet.contract.router_state`, which parses them and keeps the state file)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from modelfleet.contract.router_teams import TeamRoute, teams_json

FORMAT = 1
"""The JSON layout's version (``format``); a reader refuses any other."""
STALE_BEATS = 2.0
"""Beat intervals after which a replica's last beat is stale: still routable (three missed beats
take it out), but not a gateway's first choice (see :meth:`RouterState.stale`)."""


class RouterStateError(ValueError):
    """The JSON is not a router state this reader understands."""


@dataclass(frozen=True)
class RoutableReplica:
    """A replica that may take new requests, with its load from its last beat (tokens)."""

    replica_id: str
    host: str
    port: int
    region: str | None
    tokens_in_flight: int
    queue_depth: int
    running: int
    kv_cache_usage: float | None
    beating: bool
    """False for a replica registered by PUT that has not beaten yet: its load is unknown (0)."""
    beat_age_s: float | None = None
    """Seconds between its last beat and the publication (None: no beat yet, or a state of an
    older control plane). Above ``STALE_BEATS`` intervals the gateway does not pick it first."""

    @property
    def address(self) -> str:
        """``host:port`` (IPv6 in brackets), as Envoy's override-host header wants it."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True)
class PoolRoute:
    """One served ``model@version``: its routable replicas (by id) and per-replica capacity."""

    model: str
    version: str
    replica_capacity_tokens: int | None
    """Load-tested tokens in flight one replica carries (tokens), None if not declared."""
    replicas: tuple[RoutableReplica, ...]

    @property
    def key(self) -> str:
        """``model@version``."""
        return f"{self.model}@{self.version}"

    @property
    def tokens_in_flight(self) -> int:
        """Sum over the routable replicas (tokens)."""
        return sum(r.tokens_in_flight for r in self.replicas)

    @property
    def queue_depth(self) -> int:
        """Sum over the routable replicas (requests)."""
        return sum(r.queue_depth for r in self.replicas)


@dataclass(frozen=True)
class ModelAlias:
    """Where a model name's traffic goes: versions (``v13``), canary percent (0..100), shadow
    fraction (0..1)."""

    model: str
    live: str
    canary: str | None = None
    canary_percent: float = 0.0
    shadow: str | None = None
    shadow_fraction: float = 0.0


@dataclass(frozen=True)
class RouterState:
    """Everything a gateway routes on. ``state_version`` grows with each publication of one
    control plane (and continues across restarts when it restores a state file);
    ``instance_id`` changes with each control-plane start. ``published_at`` is Unix seconds."""

    state_version: int
    instance_id: str
    snapshot_version: str
    published_at: float
    beat_interval_s: float
    pools: tuple[PoolRoute, ...] = ()
    aliases: tuple[ModelAlias, ...] = ()
    format: int = field(default=FORMAT)
    teams: tuple[TeamRoute, ...] | None = None
    """Every team's effective limits; None: not published (a state file of an older control
    plane), the gateway keeps its own config's limits."""

    def pool(self, key: str) -> PoolRoute | None:
        """The pool ``model@version``, if served."""
        return next((p for p in self.pools if p.key == key), None)

    def alias(self, model: str) -> ModelAlias | None:
        """The alias of ``model``, if declared."""
        return next((a for a in self.aliases if a.model == model), None)

    def unstamped(self) -> RouterState:
        """The content alone: version, instance and publication time blanked."""
        return replace(self, state_version=0, instance_id="", published_at=0.0)

    def stale(self, replica: RoutableReplica) -> bool:
        """Whether ``replica``'s last beat was more than ``STALE_BEATS`` intervals old when this
        state was published (a replica that has not beaten yet is not stale)."""
        age = replica.beat_age_s
        return age is not None and age > STALE_BEATS * self.beat_interval_s

    def routing(self) -> RouterState:
        """Who serves what, without loads: equal routings differ at most in load figures. A beat
        age counts only as stale or not (a replica turning stale is a routing change)."""
        pools = tuple(
            replace(
                p,
                replicas=tuple(
                    replace(r, tokens_in_flight=0, queue_depth=0, running=0, kv_cache_usage=None,
                            beat_age_s=math.inf if self.stale(r) else None)
                    for r in p.replicas
                ),
            )
            for p in self.pools
        )
        return replace(self.unstamped(), pools=pools)

    def as_dict(self) -> dict[str, Any]:
        """The JSON shape of ``GET /v1/router/state`` and of the state file."""
        return {
            "format": self.format,
            "state_version": self.state_version,
            "instance_id": self.instance_id,
            "snapshot_version": self.snapshot_version,
            "published_at": self.published_at,
            "beat_interval_s": self.beat_interval_s,
            "pools": {
                p.key: {
                    "model": p.model,
                    "version": p.version,
                    "replica_capacity_tokens": p.replica_capacity_tokens,
                    "replicas": [{**r.__dict__, "address": r.address} for r in p.replicas],
                }
                for p in self.pools
            },
            "aliases": {
                a.model: {k: v for k, v in a.__dict__.items() if k != "model"} for a in self.aliases
            },
            **({} if self.teams is None else {"teams": teams_json(self.teams)}),
        }

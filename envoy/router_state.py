"""Router state as gateways read it: frozen dataclasses, JSON parsing and the state file.

The control plane publishes this state at ``GET /v1/router/state`` (long-poll with ``after`` and
``wait_s``) and, with ``--state-file``, keeps it in a file, so a gateway restarted while the
control plane is down still starts from the last state. Only the standard library is imported
here: gateway_ext can import this module without the control plane's other parts. The long-poll
client is :mod:`envoy_control.router_poller`:

    state = load_router_state(path)                      # None if the file does not exist
    poller = RouterStatePoller(http_fetch(client, url), initial=state)
    asyncio.create_task(poller.run())                    # poller.state stays current
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from envoy_control.router_teams import TeamRoute, TeamsError, parse_teams, teams_json

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


def _get(data: Mapping[str, Any], key: str, kinds: tuple[type, ...], where: str) -> Any:
    value = data.get(key)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        names = "/".join(k.__name__ for k in kinds)
        raise RouterStateError(f"{where}.{key}: expected {names}, got {value!r}")
    return value


def _replica(d: Any, where: str) -> RoutableReplica:
    if not isinstance(d, Mapping):
        raise RouterStateError(f"{where}: expected an object")
    usage = _get(d, "kv_cache_usage", (int, float, type(None)), where)
    age = _get(d, "beat_age_s", (int, float, type(None)), where)
    return RoutableReplica(
        replica_id=_get(d, "replica_id", (str,), where),
        host=_get(d, "host", (str,), where),
        port=_get(d, "port", (int,), where),
        region=_get(d, "region", (str, type(None)), where),
        tokens_in_flight=_get(d, "tokens_in_flight", (int,), where),
        queue_depth=_get(d, "queue_depth", (int,), where),
        running=_get(d, "running", (int,), where),
        kv_cache_usage=None if usage is None else float(usage),
        beating=_get(d, "beating", (bool,), where),
        beat_age_s=None if age is None else float(age),
    )


def _teams(data: Any) -> tuple[TeamRoute, ...] | None:
    try:
        return parse_teams(data)
    except TeamsError as exc:
        raise RouterStateError(str(exc)) from None


def parse_router_state(data: Any) -> RouterState:
    """The router state in ``data`` (decoded JSON); raises RouterStateError on a bad shape."""
    if not isinstance(data, Mapping):
        raise RouterStateError("router state: expected an object")
    if data.get("format") != FORMAT:
        raise RouterStateError(f"router state format {data.get('format')!r}, expected {FORMAT}")
    pools_in = _get(data, "pools", (dict,), "state")
    aliases_in = _get(data, "aliases", (dict,), "state")
    pools = []
    for key, p in sorted(pools_in.items()):
        where = f"pools[{key}]"
        if not isinstance(p, Mapping):
            raise RouterStateError(f"{where}: expected an object")
        replicas = _get(p, "replicas", (list,), where)
        pools.append(
            PoolRoute(
                model=_get(p, "model", (str,), where),
                version=_get(p, "version", (str,), where),
                replica_capacity_tokens=_get(
                    p, "replica_capacity_tokens", (int, type(None)), where
                ),
                replicas=tuple(
                    _replica(r, f"{where}.replicas[{i}]") for i, r in enumerate(replicas)
                ),
            )
        )
    aliases = []
    for model, a in sorted(aliases_in.items()):
        where = f"aliases[{model}]"
        if not isinstance(a, Mapping):
            raise RouterStateError(f"{where}: expected an object")
        aliases.append(
            ModelAlias(
                model=model,
                live=_get(a, "live", (str,), where),
                canary=_get(a, "canary", (str, type(None)), where),
                canary_percent=float(_get(a, "canary_percent", (int, float), where)),
                shadow=_get(a, "shadow", (str, type(None)), where),
                shadow_fraction=float(_get(a, "shadow_fraction", (int, float), where)),
            )
        )
    return RouterState(
        state_version=_get(data, "state_version", (int,), "state"),
        instance_id=_get(data, "instance_id", (str,), "state"),
        snapshot_version=_get(data, "snapshot_version", (str,), "state"),
        published_at=float(_get(data, "published_at", (int, float), "state")),
        beat_interval_s=float(_get(data, "beat_interval_s", (int, float), "state")),
        pools=tuple(pools),
        aliases=tuple(aliases),
        teams=_teams(data.get("teams")),
    )


def load_router_state(path: Path) -> RouterState | None:
    """The state saved at ``path``; None if there is no file. Raises RouterStateError when the
    file is not a router state (a torn write cannot happen: the writer renames whole files)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        return parse_router_state(json.loads(text))
    except json.JSONDecodeError as exc:
        raise RouterStateError(f"{path}: not JSON: {exc}") from None


def write_router_state(path: Path, state: RouterState) -> None:
    """Save ``state`` to ``path`` atomically: a reader sees the old file or the new, whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("w") as f:
        json.dump(state.as_dict(), f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)

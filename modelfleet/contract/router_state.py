"""Router state as gateways read it: frozen dataclasses (in :mod:`modelfleet.contract.router_state_types`,
importable from here), JSON parsing and the state file.

The control plane publishes this state at ``GET /v1/router/state`` (long-poll with ``after`` and
``wait_s``) and, with ``--state-file``, keeps it in a file, so a gateway restarted while the
control plane is down still starts from the last state. Only the standard library is imported
here: gateway_ext can import this module without the control plane's other parts. The long-poll
client is :mod:`gateway_ext.routing.poller`:

    state = load_router_state(path)                      # None if the file does not exist
    poller = RouterStatePoller(http_fetch(client, url), initial=state)
    asyncio.create_task(poller.run())                    # poller.state stays current
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from modelfleet.contract.router_state_types import (
    FORMAT,
    STALE_BEATS,
    ModelAlias,
    PoolRoute,
    RoutableReplica,
    RouterState,
    RouterStateError,
)
from modelfleet.contract.router_teams import TeamRoute, TeamsError, parse_teams

__all__ = ["FORMAT", "STALE_BEATS", "ModelAlias", "PoolRoute", "RoutableReplica", "RouterState",
           "RouterStateError", "TeamRoute", "load_router_state", "parse_router_state",
           "write_router_state"]


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

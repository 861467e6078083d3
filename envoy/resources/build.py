"""Desired state: the declared config plus the replica set, turned into xDS resources (pure).

- one EDS cluster per declared, not retired ``model@version``;
- one ClusterLoadAssignment per cluster, with that version's replicas (possibly none);
- one listener for the public API, every request checked by gateway_ext through ext_authz, and
  one route configuration: each routable ``model@version`` on the ``x-route-version`` header,
  the live version mirrored to its shadow. With ``ListenerSpec.gateway`` None (tests of the
  routing layer): no check, routes on the body's ``model`` with Envoy's own canary split.

Replicas of a version that is not declared (or retired) are left out, and reported by
:func:`unroutable_replicas`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from envoy_control.resources.body_routes import make_body_route_config
from envoy_control.resources.clusters import make_cluster, make_load_assignment
from envoy_control.resources.ext_authz import DEFAULT_GATEWAY, ExtAuthzSpec
from envoy_control.resources.listeners import make_listener
from envoy_control.resources.routes import AliasRoute, make_route_config
from envoy_control.state.replicas import Replica, replicas_by_key
from envoy_control.xds.snapshot import CLUSTER, ENDPOINT, LISTENER, ROUTE
from google.protobuf.message import Message

from modelfleet.config import PlatformConfig


@dataclass(frozen=True)
class ListenerSpec:
    """Where Envoy's public API listens: ``host`` and TCP ``port``; ``gateway``: how requests
    are checked by gateway_ext (its cluster lives in Envoy's bootstrap,
    ``envoy_control.resources.bootstrap``). ``gateway=None`` serves no check and routes on the body's
    ``model`` (``envoy_control.resources.body_routes``: tests of the routing layer only, never a public
    listener)."""

    host: str = "127.0.0.1"
    port: int = 8080
    access_log: bool = True
    gateway: ExtAuthzSpec | None = DEFAULT_GATEWAY


def served_version_keys(config: PlatformConfig) -> list[str]:
    """``model@version`` of every declared version that is not retired, in declaration order."""
    return [v.key for v in config.versions if v.status != "retired"]


def alias_routes(config: PlatformConfig) -> list[AliasRoute]:
    """Each declared model name and where its traffic goes."""
    out = []
    for m in config.models:
        out.append(
            AliasRoute(
                model=m.name,
                live=f"{m.name}@{m.live}",
                canary=f"{m.name}@{m.canary.version}" if m.canary else None,
                canary_percent=m.canary.percent if m.canary else 0.0,
                shadow=f"{m.name}@{m.shadow.version}" if m.shadow else None,
                shadow_fraction=m.shadow.fraction if m.shadow else 0.0,
            )
        )
    return out


def unroutable_replicas(config: PlatformConfig, replicas: Iterable[Replica]) -> list[Replica]:
    """Replicas whose ``model@version`` has no cluster (undeclared or retired)."""
    keys = set(served_version_keys(config))
    return [r for r in replicas if r.key not in keys]


def build_resources(
    config: PlatformConfig,
    replicas: Iterable[Replica],
    listener: ListenerSpec,
    extra: Mapping[str, Sequence[Message]] | None = None,
    region: str | None = None,
) -> dict[str, list[Message]]:
    """All xDS resources for ``config`` and ``replicas``, by type URL.

    ``extra`` adds resources as they are (the debug endpoint's deliberately invalid ones);
    ``region`` names the endpoints' locality (default: the config's local-stack region).
    """
    keys = served_version_keys(config)
    groups = replicas_by_key(replicas)
    resources: dict[str, list[Message]] = {
        CLUSTER: [make_cluster(k) for k in keys],
        ENDPOINT: [
            make_load_assignment(
                k, groups.get(k, ()), region if region is not None else config.local.region
            )
            for k in keys
        ],
        LISTENER: [
            make_listener(
                listener.host, listener.port, access_log=listener.access_log,
                gateway=listener.gateway,
            )
        ],
        ROUTE: [
            (make_route_config if listener.gateway else make_body_route_config)(
                alias_routes(config), keys
            )
        ],
    }
    for type_url, messages in (extra or {}).items():
        resources.setdefault(type_url, []).extend(messages)
    return resources

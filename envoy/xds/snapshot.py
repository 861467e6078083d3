"""Immutable xDS snapshots: every resource of every type at one version, checked for consistency.

A snapshot carries one version per type URL. A type whose resources are byte-for-byte those of
the previous snapshot keeps the previous snapshot's version for that type, so the server never
pushes it again; a type that changed takes the new snapshot's version.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from google.protobuf import any_pb2
from google.protobuf.message import Message

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2

CLUSTER = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
ENDPOINT = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
LISTENER = "type.googleapis.com/envoy.config.listener.v3.Listener"
ROUTE = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
PUSH_ORDER: tuple[str, ...] = (CLUSTER, ENDPOINT, LISTENER, ROUTE)
"""Make-before-break: clusters before the endpoints that fill them, listeners before their routes."""
SHORT_NAMES = {CLUSTER: "cds", ENDPOINT: "eds", LISTENER: "lds", ROUTE: "rds"}
MESSAGE_TYPES: dict[str, type[Message]] = {
    CLUSTER: cluster_pb2.Cluster,
    ENDPOINT: endpoint_pb2.ClusterLoadAssignment,
    LISTENER: listener_pb2.Listener,
    ROUTE: route_pb2.RouteConfiguration,
}


def resource_name(message: Message) -> str:
    """The xDS name of a resource (``cluster_name`` for a ClusterLoadAssignment)."""
    if isinstance(message, endpoint_pb2.ClusterLoadAssignment):
        return str(message.cluster_name)
    return str(getattr(message, "name"))  # noqa: B009 - every other xDS resource has .name


@dataclass(frozen=True)
class Resource:
    """One resource: its name, the message, and the message packed once for every send."""

    name: str
    message: Message = field(repr=False, compare=False)
    packed: any_pb2.Any = field(repr=False, compare=False)
    digest: bytes = field(repr=False)

    @classmethod
    def of(cls, message: Message) -> Resource:
        """Wrap (and copy) ``message``; later edits to the caller's message do not leak in."""
        copy = type(message)()
        copy.CopyFrom(message)
        packed = any_pb2.Any()
        packed.Pack(copy, deterministic=True)
        return cls(resource_name(copy), copy, packed, hashlib.sha256(packed.value).digest())


@dataclass(frozen=True)
class Snapshot:
    """Resources per type URL (sorted by name), the snapshot version and each type's version."""

    version: str
    resources: Mapping[str, tuple[Resource, ...]]
    versions: Mapping[str, str]
    external_clusters: frozenset[str] = frozenset()
    """Clusters every Envoy already holds (from its bootstrap) that routes may name, though the
    snapshot does not serve them."""

    def names(self, type_url: str) -> frozenset[str]:
        """Names of the resources of ``type_url``."""
        return frozenset(r.name for r in self.resources.get(type_url, ()))

    def messages(self, type_url: str) -> list[Message]:
        """The resources of ``type_url`` as messages (do not mutate them)."""
        return [r.message for r in self.resources.get(type_url, ())]

    def type_version(self, type_url: str) -> str:
        """The version of ``type_url`` in this snapshot ("" for a type it does not serve)."""
        return self.versions.get(type_url, "")


def digest_of(resources: Iterable[Resource]) -> bytes:
    """One digest over a type's resources, in name order."""
    h = hashlib.sha256()
    for r in resources:
        h.update(r.name.encode() + b"\0" + r.digest)
    return h.digest()


def new_snapshot(
    version: str, resources: Mapping[str, Iterable[Message]], previous: Snapshot | None = None,
    external_clusters: Iterable[str] = (),
) -> Snapshot:
    """A snapshot at ``version``; types unchanged since ``previous`` keep its type versions.
    Routes may also name ``external_clusters`` (clusters of every Envoy's bootstrap).

    Raises ValueError on two resources of one type with the same name or an unknown type URL.
    """
    by_type: dict[str, tuple[Resource, ...]] = {}
    versions: dict[str, str] = {}
    for type_url in PUSH_ORDER:
        wrapped = sorted(
            (Resource.of(m) for m in resources.get(type_url, ())), key=lambda r: r.name
        )
        names = [r.name for r in wrapped]
        if len(set(names)) != len(names):
            dupes = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"{SHORT_NAMES[type_url]}: duplicate resource names {dupes}")
        by_type[type_url] = tuple(wrapped)
        unchanged = previous is not None and digest_of(
            previous.resources.get(type_url, ())
        ) == digest_of(wrapped)
        versions[type_url] = previous.type_version(type_url) if previous and unchanged else version
    unknown = set(resources) - set(PUSH_ORDER)
    if unknown:
        raise ValueError(f"unknown type URLs {sorted(unknown)}")
    return Snapshot(version, MappingProxyType(by_type), MappingProxyType(versions),
                    frozenset(external_clusters))


def same_resources(a: Snapshot | None, b: Snapshot) -> bool:
    """Whether ``a`` and ``b`` hold identical resources of every type."""
    return a is not None and all(a.type_version(t) == b.type_version(t) for t in PUSH_ORDER)

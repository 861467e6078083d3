"""The consistency check a snapshot must pass before it is published (go-control-plane's
``Snapshot.Consistent``): every reference between resources resolves inside the snapshot.

- every EDS cluster has its ClusterLoadAssignment, and every assignment belongs to a cluster;
- every listener's RDS route configuration name exists;
- every cluster a route forwards to, splits to or mirrors to exists, in the snapshot or among its
  ``external_clusters`` (static clusters of every Envoy's bootstrap, which the control plane does
  not serve).
"""

from __future__ import annotations

from collections.abc import Iterator

from envoy_control.xds.snapshot import CLUSTER, ENDPOINT, LISTENER, ROUTE, Snapshot

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)


class InconsistentSnapshot(ValueError):
    """A snapshot references a resource it does not hold; ``problems`` says which."""

    def __init__(self, version: str, problems: list[str]) -> None:
        self.version = version
        self.problems = problems
        super().__init__(f"snapshot {version} is inconsistent: " + "; ".join(problems))


def eds_name(cluster: cluster_pb2.Cluster) -> str | None:
    """The assignment name an EDS cluster waits for (None for a cluster that is not EDS)."""
    if cluster.type != cluster_pb2.Cluster.EDS:
        return None
    return str(cluster.eds_cluster_config.service_name or cluster.name)


def route_config_names(listener: listener_pb2.Listener) -> Iterator[str]:
    """RDS names referenced by the HTTP connection managers of ``listener``."""
    chains = [*listener.filter_chains]
    if listener.HasField("default_filter_chain"):
        chains.append(listener.default_filter_chain)
    for chain in chains:
        for f in chain.filters:
            if f.typed_config.Is(hcm_pb2.HttpConnectionManager.DESCRIPTOR):
                hcm = hcm_pb2.HttpConnectionManager()
                f.typed_config.Unpack(hcm)
                if hcm.HasField("rds"):
                    yield str(hcm.rds.route_config_name)


def route_clusters(config: route_pb2.RouteConfiguration) -> Iterator[tuple[str, str]]:
    """``(route name, cluster)`` for every cluster a route forwards, splits or mirrors to."""
    for host in config.virtual_hosts:
        for policy in host.request_mirror_policies:
            yield f"{host.name} (mirror)", str(policy.cluster)
        for route in host.routes:
            if not route.HasField("route"):
                continue
            action = route.route
            label = route.name or f"{host.name}[{route.match.prefix or route.match.path}]"
            if action.cluster:
                yield label, str(action.cluster)
            for weighted in action.weighted_clusters.clusters:
                yield label, str(weighted.name)
            for policy in action.request_mirror_policies:
                if policy.cluster:
                    yield f"{label} (mirror)", str(policy.cluster)


def consistency_problems(snapshot: Snapshot) -> list[str]:
    """Every dangling reference in ``snapshot`` (an empty list when it is consistent); routes may
    also name the snapshot's ``external_clusters``."""
    problems: list[str] = []
    clusters = set(snapshot.names(CLUSTER)) | snapshot.external_clusters
    assignments = snapshot.names(ENDPOINT)
    wanted: set[str] = set()
    for message in snapshot.messages(CLUSTER):
        assert isinstance(message, cluster_pb2.Cluster)
        name = eds_name(message)
        if name is None:
            continue
        wanted.add(name)
        if name not in assignments:
            problems.append(f"cluster {message.name} has no ClusterLoadAssignment {name}")
    problems += [
        f"ClusterLoadAssignment {n} belongs to no EDS cluster" for n in sorted(assignments - wanted)
    ]
    routes = snapshot.names(ROUTE)
    for message in snapshot.messages(LISTENER):
        assert isinstance(message, listener_pb2.Listener)
        problems += [
            f"listener {message.name} uses route configuration {n}, which is missing"
            for n in route_config_names(message)
            if n not in routes
        ]
    for message in snapshot.messages(ROUTE):
        assert isinstance(message, route_pb2.RouteConfiguration)
        problems += [
            f"route {label} in {message.name} sends to cluster {c}, which is missing"
            for label, c in route_clusters(message)
            if c not in clusters
        ]
    return problems


def check_consistent(snapshot: Snapshot) -> Snapshot:
    """Return ``snapshot`` if it is consistent, else raise :class:`InconsistentSnapshot`."""
    problems = consistency_problems(snapshot)
    if problems:
        raise InconsistentSnapshot(snapshot.version, problems)
    return snapshot

"""Builders for the batch API behind Envoy: a static cluster for the batch service and the routes
that send ``/v1/batches``, ``/v1/files`` and everything below them to it.

The routes go in the API's route configuration (``envoy_control.resources.routes.make_route_config``)
right after the models list, before the version and error routes. They switch ``ext_authz`` off
(``ExtAuthzPerRoute.disabled``): these are not chat requests to admit, the batch service checks
the team key itself and scopes every batch and file to its team, and file uploads may be larger
than the 1 MiB body the check buffers. The header-stripping filter still runs, so a client
cannot forge gateway headers here either.

The cluster, like the gateway's, belongs in each Envoy's bootstrap (``static_resources.clusters``,
``envoy_control.resources.bootstrap.make_bootstrap(batch=...)``): each deployment knows its batch service's
address, the control plane need not (its consistency check accepts the name,
``envoy_control.resources.bootstrap.BOOTSTRAP_CLUSTERS``). An Envoy whose bootstrap has no batch cluster
answers these paths 503 (cluster not found).
"""

from __future__ import annotations

import ipaddress

from envoy_control.resources.clusters import seconds
from google.protobuf import any_pb2

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import address_pb2
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2
from envoy.config.route.v3 import route_components_pb2 as rc
from envoy.extensions.filters.http.ext_authz.v3 import ext_authz_pb2

BATCH_CLUSTER = "modelfleet_batch"
"""The bootstrap's static cluster of the batch service (``python -m batch``)."""
BATCH_PATH = "/v1/batches"
FILES_PATH = "/v1/files"
EXT_AUTHZ_FILTER = "envoy.filters.http.ext_authz"
"""The ext_authz filter's name in the listener (``envoy_control.resources.ext_authz``)."""
BATCH_ROUTE_TIMEOUT_S = 30.0
"""Longest batch API call, in seconds (they are short database reads and writes)."""
FILES_ROUTE_TIMEOUT_S = 300.0
"""Longest ``/v1/files`` call, in seconds (an upload or download of up to 200 MiB)."""


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def make_batch_cluster(host: str, port: int, name: str = BATCH_CLUSTER,
                       connect_timeout_s: float = 1.0) -> cluster_pb2.Cluster:
    """The batch service at ``host:port`` (TCP port) as an HTTP/1.1 cluster: STATIC for an IP,
    STRICT_DNS for a name (a Kubernetes Service)."""
    address = address_pb2.Address(
        socket_address=address_pb2.SocketAddress(address=host, port_value=port))
    return cluster_pb2.Cluster(
        name=name,
        type=cluster_pb2.Cluster.STATIC if _is_ip(host) else cluster_pb2.Cluster.STRICT_DNS,
        connect_timeout=seconds(connect_timeout_s),
        load_assignment=endpoint_pb2.ClusterLoadAssignment(
            cluster_name=name,
            endpoints=[endpoint_components_pb2.LocalityLbEndpoints(lb_endpoints=[
                endpoint_components_pb2.LbEndpoint(
                    endpoint=endpoint_components_pb2.Endpoint(address=address))])],
        ),
    )


def make_batch_route(cluster: str = BATCH_CLUSTER,
                     timeout_s: float = BATCH_ROUTE_TIMEOUT_S, path: str = BATCH_PATH,
                     name: str = "batches") -> rc.Route:
    """``path`` and everything under ``path/`` (not ``/v1/batchesX``: a
    ``path_separated_prefix`` match) to ``cluster``, any method, ``timeout_s`` seconds, with
    ext_authz switched off for the route (the service checks keys itself)."""
    off = any_pb2.Any()
    off.Pack(ext_authz_pb2.ExtAuthzPerRoute(disabled=True))
    return rc.Route(
        name=name,
        match=rc.RouteMatch(path_separated_prefix=path),
        route=rc.RouteAction(cluster=cluster, timeout=seconds(timeout_s)),
        typed_per_filter_config={EXT_AUTHZ_FILTER: off},
    )


def make_batch_routes(cluster: str = BATCH_CLUSTER) -> list[rc.Route]:
    """The batch service's routes: ``/v1/batches`` (30 s) and ``/v1/files`` (300 s)."""
    return [make_batch_route(cluster),
            make_batch_route(cluster, FILES_ROUTE_TIMEOUT_S, FILES_PATH, "files")]

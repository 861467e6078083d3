"""Builders for the batch API behind Envoy: a static cluster for the batch service and the route
that sends ``/v1/batches`` and ``/v1/batches/...`` to it.

The route goes in the API's route configuration before the error routes (``version-unrouted``,
``unknown-url``), e.g. right after the models list. The request has passed ext_authz already:
gateway_ext answers a check of any path other than chat completions with 200 for a valid team
key (401 otherwise) and sets no ``x-route-version``, so no version route matches it; the batch
service checks the key again and scopes every batch to its team. The cluster, like the
gateway's, belongs in each Envoy's bootstrap (``static_resources.clusters``): each deployment
knows its batch service's address, the control plane need not.
"""

from __future__ import annotations

import ipaddress

from envoy_control.clusters import seconds

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import address_pb2
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2
from envoy.config.route.v3 import route_components_pb2 as rc

BATCH_CLUSTER = "modelfleet_batch"
"""The bootstrap's static cluster of the batch service (``python -m gateway_ext.batch_main``)."""
BATCH_PATH = "/v1/batches"
BATCH_ROUTE_TIMEOUT_S = 30.0
"""Longest batch API call, in seconds (they are short database reads and writes)."""


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
                     timeout_s: float = BATCH_ROUTE_TIMEOUT_S) -> rc.Route:
    """``/v1/batches`` and everything under ``/v1/batches/`` (not ``/v1/batchesX``: a
    ``path_separated_prefix`` match) to ``cluster``, any method, ``timeout_s`` seconds."""
    return rc.Route(
        name="batches",
        match=rc.RouteMatch(path_separated_prefix=BATCH_PATH),
        route=rc.RouteAction(cluster=cluster, timeout=seconds(timeout_s)),
    )

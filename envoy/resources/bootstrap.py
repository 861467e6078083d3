"""The Envoy bootstrap: node identity, admin, the xDS server as a static HTTP/2 cluster, the
gateway (gateway_ext, checked by the ext_authz filter) as a static HTTP/1.1 cluster, and dynamic
resources (CDS and LDS) over one ADS stream. Everything else comes from the control plane.

The gateway's cluster lives here, not in CDS: each Envoy deployment knows its gateway's address
(a Kubernetes Service name, or the local stack's port) while the control plane need not; the
listener it serves refers to the cluster by name (``envoy_control.resources.ext_authz.GATEWAY_CLUSTER``).
An Envoy without it answers every API request 503 (ext_authz fails closed). The batch service's
cluster (``envoy_control.resources.batch.BATCH_CLUSTER``) is optional in the same way: without it
``/v1/batches`` and ``/v1/files`` answer 503.
"""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path
from typing import Any

from envoy_control.resources.batch import BATCH_CLUSTER, make_batch_cluster
from envoy_control.resources.clusters import ads_config_source, seconds
from envoy_control.resources.ext_authz import GATEWAY_CLUSTER
from google.protobuf import any_pb2, json_format, wrappers_pb2
from google.protobuf.message import Message

from envoy.config.bootstrap.v3 import bootstrap_pb2
from envoy.config.cluster.v3 import circuit_breaker_pb2, cluster_pb2
from envoy.config.core.v3 import (
    address_pb2,
    backoff_pb2,
    base_pb2,
    config_source_pb2,
    grpc_service_pb2,
    protocol_pb2,
)
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2
from envoy.config.overload.v3 import overload_pb2
from envoy.extensions.resource_monitors.downstream_connections.v3 import downstream_connections_pb2
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2

XDS_CLUSTER = "modelfleet_xds"
BOOTSTRAP_CLUSTERS = frozenset({GATEWAY_CLUSTER, BATCH_CLUSTER})
"""Static clusters of every Envoy's bootstrap that the control plane's routes may name (the
gateway's and the batch service's): each snapshot carries them as ``external_clusters``."""
MAX_DOWNSTREAM_CONNECTIONS = 50_000


def _pack(message: Message) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed


def _socket(host: str, port: int) -> address_pb2.Address:
    return address_pb2.Address(
        socket_address=address_pb2.SocketAddress(address=host, port_value=port)
    )


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def make_xds_cluster(xds_host: str, xds_port: int) -> cluster_pb2.Cluster:
    """The control plane as an HTTP/2 (gRPC) cluster: STATIC for an IP, STRICT_DNS for a name."""
    h2 = http_protocol_options_pb2.HttpProtocolOptions(
        explicit_http_config=http_protocol_options_pb2.HttpProtocolOptions.ExplicitHttpConfig(
            http2_protocol_options=protocol_pb2.Http2ProtocolOptions(
                connection_keepalive=protocol_pb2.KeepaliveSettings(
                    interval=seconds(15), timeout=seconds(5)
                )
            )
        )
    )
    cluster = _static_cluster(XDS_CLUSTER, xds_host, xds_port, connect_timeout_s=1.0)
    cluster.typed_extension_protocol_options[
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
    ].CopyFrom(_pack(h2))
    return cluster


def _static_cluster(name: str, host: str, port: int, connect_timeout_s: float) -> cluster_pb2.Cluster:
    return cluster_pb2.Cluster(
        name=name,
        type=cluster_pb2.Cluster.STATIC if _is_ip(host) else cluster_pb2.Cluster.STRICT_DNS,
        connect_timeout=seconds(connect_timeout_s),
        load_assignment=endpoint_pb2.ClusterLoadAssignment(
            cluster_name=name,
            endpoints=[
                endpoint_components_pb2.LocalityLbEndpoints(
                    lb_endpoints=[
                        endpoint_components_pb2.LbEndpoint(
                            endpoint=endpoint_components_pb2.Endpoint(address=_socket(host, port))
                        )
                    ]
                )
            ],
        ),
    )


def make_gateway_cluster(host: str, port: int, max_requests: int = 100_000) -> cluster_pb2.Cluster:
    """gateway_ext as an HTTP/1.1 cluster (STATIC for an IP, STRICT_DNS for a name).

    Queued requests hold their check open for up to minutes, one connection each, so the circuit
    breakers are raised to ``max_requests`` (Envoy's default 1024 would refuse the 1025th).
    """
    cluster = _static_cluster(GATEWAY_CLUSTER, host, port, connect_timeout_s=0.25)
    limits = circuit_breaker_pb2.CircuitBreakers.Thresholds(
        max_connections=wrappers_pb2.UInt32Value(value=max_requests),
        max_pending_requests=wrappers_pb2.UInt32Value(value=max_requests),
        max_requests=wrappers_pb2.UInt32Value(value=max_requests),
    )
    cluster.circuit_breakers.CopyFrom(circuit_breaker_pb2.CircuitBreakers(thresholds=[limits]))
    return cluster


def make_bootstrap(
    *,
    node_id: str,
    cluster: str,
    admin_port: int,
    xds_host: str,
    xds_port: int,
    admin_host: str = "127.0.0.1",
    xds_retry_max_s: float = 2.0,
    gateway: tuple[str, int] | None = None,
    batch: tuple[str, int] | None = None,
) -> bootstrap_pb2.Bootstrap:
    """The bootstrap as a message. Ports are TCP ports (``admin_port`` 0: Envoy picks one).

    ``xds_retry_max_s`` caps Envoy's reconnect backoff to the control plane, in seconds.
    ``gateway`` is gateway_ext's ``(host, port)``: without it the ext_authz filter of the served
    listener has no cluster and every API request is refused (503). ``batch`` is the batch
    service's ``(host, port)`` (``/v1/batches``, ``/v1/files``; None: those answer 503).
    """
    ads = config_source_pb2.ApiConfigSource(
        api_type=config_source_pb2.ApiConfigSource.GRPC,
        transport_api_version=config_source_pb2.V3,
        set_node_on_first_message_only=True,
        grpc_services=[
            grpc_service_pb2.GrpcService(
                envoy_grpc=grpc_service_pb2.GrpcService.EnvoyGrpc(
                    cluster_name=XDS_CLUSTER,
                    retry_policy=base_pb2.RetryPolicy(
                        retry_back_off=backoff_pb2.BackoffStrategy(
                            base_interval=seconds(0.1), max_interval=seconds(xds_retry_max_s)
                        )
                    ),
                )
            )
        ],
    )
    connections = downstream_connections_pb2.DownstreamConnectionsConfig(
        max_active_downstream_connections=MAX_DOWNSTREAM_CONNECTIONS
    )
    return bootstrap_pb2.Bootstrap(
        node=base_pb2.Node(id=node_id, cluster=cluster),
        admin=bootstrap_pb2.Admin(address=_socket(admin_host, admin_port)),
        static_resources=bootstrap_pb2.Bootstrap.StaticResources(
            clusters=[
                make_xds_cluster(xds_host, xds_port),
                *([make_gateway_cluster(*gateway)] if gateway is not None else []),
                *([make_batch_cluster(*batch)] if batch is not None else []),
            ]
        ),
        dynamic_resources=bootstrap_pb2.Bootstrap.DynamicResources(
            ads_config=ads, cds_config=ads_config_source(), lds_config=ads_config_source()
        ),
        overload_manager=overload_pb2.OverloadManager(
            resource_monitors=[
                overload_pb2.ResourceMonitor(
                    name="envoy.resource_monitors.global_downstream_max_connections",
                    typed_config=_pack(connections),
                )
            ]
        ),
    )


def render_bootstrap(
    *,
    node_id: str,
    cluster: str,
    admin_port: int,
    xds_host: str,
    xds_port: int,
    admin_host: str = "127.0.0.1",
    xds_retry_max_s: float = 2.0,
    gateway: tuple[str, int] | None = None,
    batch: tuple[str, int] | None = None,
) -> dict[str, Any]:
    """The bootstrap as plain JSON data (write it with ``json.dumps`` and pass it to ``envoy -c``).

    See :func:`make_bootstrap` for the arguments.
    """
    message = make_bootstrap(
        node_id=node_id,
        cluster=cluster,
        admin_port=admin_port,
        xds_host=xds_host,
        xds_port=xds_port,
        admin_host=admin_host,
        xds_retry_max_s=xds_retry_max_s,
        gateway=gateway,
        batch=batch,
    )
    data: dict[str, Any] = json_format.MessageToDict(message, preserving_proto_field_name=True)
    return data


def write_bootstrap(path: Path, **kwargs: Any) -> Path:
    """Render the bootstrap (keyword arguments of :func:`render_bootstrap`) to ``path`` as JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(render_bootstrap(**kwargs), indent=2), encoding="utf-8")
    return path

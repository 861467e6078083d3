"""The Envoy bootstrap: node identity, admin, the xDS server as a static HTTP/2 cluster, and
dynamic resources (CDS and LDS) over one ADS stream. Everything else comes from the control plane.
"""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path
from typing import Any

from envoy_control.clusters import ads_config_source, seconds
from google.protobuf import any_pb2, json_format
from google.protobuf.message import Message

from envoy.config.bootstrap.v3 import bootstrap_pb2
from envoy.config.cluster.v3 import cluster_pb2
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
    return cluster_pb2.Cluster(
        name=XDS_CLUSTER,
        type=cluster_pb2.Cluster.STATIC if _is_ip(xds_host) else cluster_pb2.Cluster.STRICT_DNS,
        connect_timeout=seconds(1),
        typed_extension_protocol_options={
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": _pack(h2)
        },
        load_assignment=endpoint_pb2.ClusterLoadAssignment(
            cluster_name=XDS_CLUSTER,
            endpoints=[
                endpoint_components_pb2.LocalityLbEndpoints(
                    lb_endpoints=[
                        endpoint_components_pb2.LbEndpoint(
                            endpoint=endpoint_components_pb2.Endpoint(
                                address=_socket(xds_host, xds_port)
                            )
                        )
                    ]
                )
            ],
        ),
    )


def make_bootstrap(
    *,
    node_id: str,
    cluster: str,
    admin_port: int,
    xds_host: str,
    xds_port: int,
    admin_host: str = "127.0.0.1",
    xds_retry_max_s: float = 2.0,
) -> bootstrap_pb2.Bootstrap:
    """The bootstrap as a message. Ports are TCP ports (``admin_port`` 0: Envoy picks one).

    ``xds_retry_max_s`` caps Envoy's reconnect backoff to the control plane, in seconds.
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
            clusters=[make_xds_cluster(xds_host, xds_port)]
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
    )
    data: dict[str, Any] = json_format.MessageToDict(message, preserving_proto_field_name=True)
    return data


def write_bootstrap(path: Path, **kwargs: Any) -> Path:
    """Render the bootstrap (keyword arguments of :func:`render_bootstrap`) to ``path`` as JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(render_bootstrap(**kwargs), indent=2), encoding="utf-8")
    return path

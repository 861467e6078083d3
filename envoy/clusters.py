"""Builders for CDS and EDS resources: one cluster and one load assignment per ``model@version``.

Every version's cluster balances with a ring hash on the route's hash policy (the
``x-conversation-id`` header), bounded by Envoy's own ``hash_balance_factor`` (a host takes at most
125% of the average load before the ring moves on to the next one). Each endpoint's ring position
is pinned to its replica id through the ``envoy.lb`` / ``hash_key`` metadata, so a replica keeps
its conversations when other replicas come and go, whatever its address.
"""

from __future__ import annotations

from collections.abc import Iterable

from envoy_control.replicas import Replica
from google.protobuf import any_pb2, duration_pb2, struct_pb2, wrappers_pb2

from envoy.config.cluster.v3 import circuit_breaker_pb2, cluster_pb2
from envoy.config.core.v3 import (
    address_pb2,
    base_pb2,
    config_source_pb2,
    extension_pb2,
    health_check_pb2,
)
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2
from envoy.extensions.load_balancing_policies.common.v3 import common_pb2
from envoy.extensions.load_balancing_policies.ring_hash.v3 import ring_hash_pb2

HASH_BALANCE_FACTOR = 125
"""Bounded load, in percent of the average: the seed's "skip a replica above 125%"."""
MIN_RING_SIZE = 1024
"""Ring entries per cluster (Envoy's default minimum); spread across the replicas."""
METADATA_NAMESPACE = "modelfleet"
"""Our own metadata namespace on clusters and endpoints."""
RING_HASH_POLICY = "envoy.load_balancing_policies.ring_hash"


def seconds(value: float) -> duration_pb2.Duration:
    """A protobuf Duration of ``value`` seconds."""
    d = duration_pb2.Duration()
    d.FromNanoseconds(round(value * 1e9))
    return d


def ads_config_source() -> config_source_pb2.ConfigSource:
    """A ConfigSource that says "over the ADS stream", xDS v3."""
    return config_source_pb2.ConfigSource(
        ads=config_source_pb2.AggregatedConfigSource(),
        resource_api_version=config_source_pb2.V3,
    )


def struct(values: dict[str, str]) -> struct_pb2.Struct:
    """A protobuf Struct of string values."""
    s = struct_pb2.Struct()
    s.update(values)
    return s


def make_ring_hash_policy(
    hash_balance_factor: int = HASH_BALANCE_FACTOR,
) -> cluster_pb2.LoadBalancingPolicy:
    """Ring hash (xxHash) with bounded load ``hash_balance_factor`` (percent, >= 100)."""
    ring = ring_hash_pb2.RingHash(
        hash_function=ring_hash_pb2.RingHash.XX_HASH,
        minimum_ring_size=wrappers_pb2.UInt64Value(value=MIN_RING_SIZE),
        consistent_hashing_lb_config=common_pb2.ConsistentHashingLbConfig(
            hash_balance_factor=wrappers_pb2.UInt32Value(value=hash_balance_factor),
        ),
    )
    typed = any_pb2.Any()
    typed.Pack(ring)
    policy = cluster_pb2.LoadBalancingPolicy()
    policy.policies.add().typed_extension_config.CopyFrom(
        extension_pb2.TypedExtensionConfig(name=RING_HASH_POLICY, typed_config=typed)
    )
    return policy


def make_cluster(
    key: str,
    *,
    connect_timeout_s: float = 1.0,
    hash_balance_factor: int = HASH_BALANCE_FACTOR,
    max_requests: int = 100_000,
) -> cluster_pb2.Cluster:
    """The EDS cluster of version ``key`` (``model@version``; Envoy accepts ``@`` in names).

    ``connect_timeout_s`` in seconds; ``max_requests`` is the circuit-breaker cap on concurrent
    requests (Envoy's default 1024 would cut a pool of many long streams).
    """
    model, _, version = key.partition("@")
    limits = circuit_breaker_pb2.CircuitBreakers.Thresholds(
        max_connections=wrappers_pb2.UInt32Value(value=max_requests),
        max_pending_requests=wrappers_pb2.UInt32Value(value=max_requests),
        max_requests=wrappers_pb2.UInt32Value(value=max_requests),
        max_retries=wrappers_pb2.UInt32Value(value=max(3, max_requests // 100)),
    )
    return cluster_pb2.Cluster(
        name=key,
        type=cluster_pb2.Cluster.EDS,
        eds_cluster_config=cluster_pb2.Cluster.EdsClusterConfig(eds_config=ads_config_source()),
        connect_timeout=seconds(connect_timeout_s),
        load_balancing_policy=make_ring_hash_policy(hash_balance_factor),
        circuit_breakers=circuit_breaker_pb2.CircuitBreakers(thresholds=[limits]),
        metadata=base_pb2.Metadata(
            filter_metadata={METADATA_NAMESPACE: struct({"model": model, "version": version})}
        ),
    )


def make_lb_endpoint(replica: Replica) -> endpoint_components_pb2.LbEndpoint:
    """One replica as an endpoint: hostname and ring-hash key are its replica id."""
    return endpoint_components_pb2.LbEndpoint(
        endpoint=endpoint_components_pb2.Endpoint(
            address=address_pb2.Address(
                socket_address=address_pb2.SocketAddress(
                    address=replica.host, port_value=replica.port
                )
            ),
            hostname=replica.replica_id,
        ),
        health_status=health_check_pb2.HEALTHY,
        metadata=base_pb2.Metadata(
            filter_metadata={
                "envoy.lb": struct({"hash_key": replica.replica_id}),
                METADATA_NAMESPACE: struct({"replica_id": replica.replica_id}),
            }
        ),
    )


def make_load_assignment(
    key: str, replicas: Iterable[Replica], region: str = ""
) -> endpoint_pb2.ClusterLoadAssignment:
    """The endpoints of version ``key``: its replicas, sorted by id, in one locality ``region``."""
    ordered = sorted(replicas, key=lambda r: r.replica_id)
    cla = endpoint_pb2.ClusterLoadAssignment(cluster_name=key)
    if ordered:
        cla.endpoints.add(
            locality=base_pb2.Locality(region=region),
            lb_endpoints=[make_lb_endpoint(r) for r in ordered],
        )
    return cla

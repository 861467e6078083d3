"""Builders for CDS and EDS resources: one cluster and one load assignment per ``model@version``.

Load balancing is Envoy's ``override_host`` policy: gateway_ext picks the replica (ring on the
conversation id, bounded by tokens in flight) and names it, with fallbacks, in the
``x-gateway-destination-endpoint`` request header (``ip:port,ip:port``); Envoy sends attempt *n*
to the *n*-th address that is in the cluster. Without the header (no router state yet, a
mirrored copy, the body-routed test listener) the fallback policy picks: a ring hash on the
route's hash policy (``x-conversation-id``), bounded by Envoy's own ``hash_balance_factor`` (a
host takes at most 125% of the average of active requests). Each endpoint's ring position is
pinned to its replica id through the ``envoy.lb`` / ``hash_key`` metadata, so a replica keeps
its conversations when other replicas come and go, whatever its address.

Health and ``override_host`` (Envoy 1.40): the policy uses a named host whatever its health
(it looks the address up in the cluster's host map, no status check, and has no setting for
it); ``CommonLbConfig.override_host_status`` governs only the stateful-session override path,
not this policy, so it is not set. The gateway therefore names healthy replicas first itself:
routable ones only, stale beats left out (:mod:`gateway_ext.routing.router`).

Failure handling tuned for streaming pools (see :class:`PoolHealth`): active HTTP health checks
on ``/health`` and outlier detection on consecutive failures (never on success rate: a few long
streams are no sample), neither of which closes open streams; endpoints removed by EDS leave at
once whatever their health; a retry budget per cluster (circuit breaker ``retry_budget``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from envoy_control.state.replicas import Replica
from google.protobuf import any_pb2, duration_pb2, struct_pb2, wrappers_pb2
from google.protobuf.message import Message

from envoy.config.cluster.v3 import circuit_breaker_pb2, cluster_pb2, outlier_detection_pb2
from envoy.config.core.v3 import (
    address_pb2,
    base_pb2,
    config_source_pb2,
    extension_pb2,
    health_check_pb2,
)
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2
from envoy.extensions.load_balancing_policies.common.v3 import common_pb2
from envoy.extensions.load_balancing_policies.override_host.v3 import override_host_pb2
from envoy.extensions.load_balancing_policies.ring_hash.v3 import ring_hash_pb2
from envoy.type.v3 import percent_pb2
from modelfleet.contract.headers import DESTINATION_HEADER

HASH_BALANCE_FACTOR = 125
"""Bounded load, in percent of the average: the seed's "skip a replica above 125%"."""
MIN_RING_SIZE = 1024
"""Ring entries per cluster (Envoy's default minimum); spread across the replicas."""
METADATA_NAMESPACE = "modelfleet"
"""Our own metadata namespace on clusters and endpoints."""
RING_HASH_POLICY = "envoy.load_balancing_policies.ring_hash"
OVERRIDE_HOST_POLICY = "envoy.load_balancing_policies.override_host"
HEALTH_PATH = "/health"


@dataclass(frozen=True)
class PoolHealth:
    """Health and retry settings of a version's cluster (seconds, counts, percent).

    Active checks: ``/health`` every ``check_interval_s`` (``idle_check_interval_s`` while the
    cluster has no traffic), out after ``unhealthy_threshold`` failures, back after one success.
    Outlier detection: eject after ``consecutive_local_failures`` connect failures/resets or
    ``consecutive_gateway_failures`` 502/503/504 in a row, for ``base_ejection_s`` (growing with
    each ejection, at most ``max_ejection_s``), never more than ``max_ejection_percent`` of the
    pool. Retries: at most ``retry_budget_percent`` of the cluster's active requests may be
    retries (at least ``min_retry_concurrency``).
    """

    check_interval_s: float = 2.0
    idle_check_interval_s: float = 5.0
    check_timeout_s: float = 1.0
    unhealthy_threshold: int = 2
    consecutive_local_failures: int = 3
    consecutive_gateway_failures: int = 3
    outlier_interval_s: float = 1.0
    base_ejection_s: float = 10.0
    max_ejection_s: float = 120.0
    max_ejection_percent: int = 50
    retry_budget_percent: float = 20.0
    min_retry_concurrency: int = 10


DEFAULT_HEALTH = PoolHealth()


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


def _policy(name: str, config: Message) -> cluster_pb2.LoadBalancingPolicy:
    typed = any_pb2.Any()
    typed.Pack(config)
    policy = cluster_pb2.LoadBalancingPolicy()
    policy.policies.add().typed_extension_config.CopyFrom(
        extension_pb2.TypedExtensionConfig(name=name, typed_config=typed)
    )
    return policy


def make_override_host_policy(
    fallback: cluster_pb2.LoadBalancingPolicy, header: str = DESTINATION_HEADER
) -> cluster_pb2.LoadBalancingPolicy:
    """Hosts named in request ``header`` (``ip:port,...``, one per attempt), else ``fallback``."""
    config = override_host_pb2.OverrideHost(
        override_host_sources=[override_host_pb2.OverrideHost.OverrideHostSource(header=header)],
        fallback_policy=fallback,
    )
    return _policy(OVERRIDE_HOST_POLICY, config)


def make_health_check(health: PoolHealth = DEFAULT_HEALTH) -> health_check_pb2.HealthCheck:
    """Active HTTP health check of ``/health`` (a replica answers it without touching the GPU)."""
    return health_check_pb2.HealthCheck(
        timeout=seconds(health.check_timeout_s),
        interval=seconds(health.check_interval_s),
        no_traffic_interval=seconds(health.idle_check_interval_s),
        unhealthy_threshold=wrappers_pb2.UInt32Value(value=health.unhealthy_threshold),
        healthy_threshold=wrappers_pb2.UInt32Value(value=1),
        http_health_check=health_check_pb2.HealthCheck.HttpHealthCheck(path=HEALTH_PATH),
    )


def make_outlier_detection(
    health: PoolHealth = DEFAULT_HEALTH,
) -> outlier_detection_pb2.OutlierDetection:
    """Ejection on consecutive local-origin failures (connect, reset) and 502/503/504 only."""
    def u32(v: int) -> wrappers_pb2.UInt32Value:
        return wrappers_pb2.UInt32Value(value=v)

    return outlier_detection_pb2.OutlierDetection(
        split_external_local_origin_errors=True,
        consecutive_local_origin_failure=u32(health.consecutive_local_failures),
        enforcing_consecutive_local_origin_failure=u32(100),
        consecutive_gateway_failure=u32(health.consecutive_gateway_failures),
        enforcing_consecutive_gateway_failure=u32(100),
        consecutive_5xx=u32(health.consecutive_gateway_failures),
        enforcing_success_rate=u32(0),
        enforcing_local_origin_success_rate=u32(0),
        interval=seconds(health.outlier_interval_s),
        base_ejection_time=seconds(health.base_ejection_s),
        max_ejection_time=seconds(health.max_ejection_s),
        max_ejection_percent=u32(health.max_ejection_percent),
    )


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
    return _policy(RING_HASH_POLICY, ring)


def make_cluster(
    key: str,
    *,
    connect_timeout_s: float = 1.0,
    hash_balance_factor: int = HASH_BALANCE_FACTOR,
    max_requests: int = 100_000,
    health: PoolHealth = DEFAULT_HEALTH,
) -> cluster_pb2.Cluster:
    """The EDS cluster of version ``key`` (``model@version``; Envoy accepts ``@`` in names).

    ``connect_timeout_s`` in seconds; ``max_requests`` is the circuit-breaker cap on concurrent
    requests (Envoy's default 1024 would cut a pool of many long streams); ``health``: checks,
    ejection and the retry budget.
    """
    model, _, version = key.partition("@")
    budget = circuit_breaker_pb2.CircuitBreakers.Thresholds.RetryBudget(
        budget_percent=percent_pb2.Percent(value=health.retry_budget_percent),
        min_retry_concurrency=wrappers_pb2.UInt32Value(value=health.min_retry_concurrency),
    )
    limits = circuit_breaker_pb2.CircuitBreakers.Thresholds(
        max_connections=wrappers_pb2.UInt32Value(value=max_requests),
        max_pending_requests=wrappers_pb2.UInt32Value(value=max_requests),
        max_requests=wrappers_pb2.UInt32Value(value=max_requests),
        retry_budget=budget,
    )
    return cluster_pb2.Cluster(
        name=key,
        type=cluster_pb2.Cluster.EDS,
        eds_cluster_config=cluster_pb2.Cluster.EdsClusterConfig(eds_config=ads_config_source()),
        connect_timeout=seconds(connect_timeout_s),
        load_balancing_policy=make_override_host_policy(
            make_ring_hash_policy(hash_balance_factor)
        ),
        health_checks=[make_health_check(health)],
        outlier_detection=make_outlier_detection(health),
        ignore_health_on_host_removal=True,
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

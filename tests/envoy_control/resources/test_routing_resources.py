"""The routing issue's Envoy resources: override_host from the gateway's destination header over
a bounded ring hash, health checks and outlier detection for streaming pools, a retry budget per
cluster, retries of 503 before the first byte, mirrored copies stripped of reservation and
destination and marked as shadow, and a client's destination header stripped before the check."""

from __future__ import annotations

from envoy.extensions.filters.http.header_mutation.v3 import header_mutation_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.extensions.load_balancing_policies.override_host.v3 import override_host_pb2
from envoy_control.resources.build import ListenerSpec, build_resources
from envoy_control.resources.clusters import DEFAULT_HEALTH, HEALTH_PATH, make_cluster
from envoy_control.resources.routes import make_route_action
from envoy_control.xds.snapshot import LISTENER

from modelfleet.config import PlatformConfig
from modelfleet.contract.headers import (
    DESTINATION_HEADER,
    RESERVATION_HEADER,
    SHADOW_HEADER,
    UPSTREAM_HEADERS,
)


def test_the_cluster_follows_the_gateways_pick_else_its_ring() -> None:
    c = make_cluster("chat-7b@v13")
    (policy,) = c.load_balancing_policy.policies
    override = override_host_pb2.OverrideHost()
    policy.typed_extension_config.typed_config.Unpack(override)
    assert [s.header for s in override.override_host_sources] == [DESTINATION_HEADER]
    (fallback,) = override.fallback_policy.policies
    assert fallback.typed_extension_config.name == "envoy.load_balancing_policies.ring_hash"
    assert DESTINATION_HEADER in UPSTREAM_HEADERS  # ext_authz copies it onto the request


def test_health_checks_and_ejection_never_cut_streams_and_removal_is_immediate() -> None:
    c = make_cluster("chat-7b@v13")
    (check,) = c.health_checks
    assert check.http_health_check.path == HEALTH_PATH
    assert check.interval.seconds == DEFAULT_HEALTH.check_interval_s
    assert check.unhealthy_threshold.value == 2 and check.healthy_threshold.value == 1
    assert not c.close_connections_on_host_health_failure  # open streams finish
    assert c.ignore_health_on_host_removal  # EDS removal (missed beats, draining) wins at once
    od = c.outlier_detection
    assert od.split_external_local_origin_errors
    assert od.consecutive_local_origin_failure.value == 3
    assert od.consecutive_gateway_failure.value == 3
    assert od.enforcing_success_rate.value == 0  # a few long streams are no sample
    assert od.max_ejection_percent.value == 50


def test_a_retry_budget_per_cluster() -> None:
    (limits,) = make_cluster("chat-7b@v13").circuit_breakers.thresholds
    assert limits.retry_budget.budget_percent.value == 20.0
    assert limits.retry_budget.min_retry_concurrency.value == 10
    assert not limits.HasField("max_retries")  # the budget replaces the fixed cap


def test_mirrored_copies_lose_the_reservation_and_destination_and_are_marked() -> None:
    action = make_route_action([("chat-7b@v13", 1)], ("chat-7b@v15", 0.01))
    (mirror,) = action.request_mirror_policies
    assert mirror.cluster == "chat-7b@v15"
    assert mirror.runtime_fraction.default_value.numerator == 10_000  # per million
    removed = [m.remove for m in mirror.request_headers_mutations if m.remove]
    assert removed == [RESERVATION_HEADER, DESTINATION_HEADER]
    (added,) = [m.append.header for m in mirror.request_headers_mutations if m.HasField("append")]
    assert (added.key, added.value) == (SHADOW_HEADER, "1")


def test_a_clients_destination_header_is_stripped_before_the_check(
        example_config: PlatformConfig) -> None:
    (listener,) = build_resources(example_config, [], ListenerSpec("127.0.0.1", 18080))[LISTENER]
    hcm = hcm_pb2.HttpConnectionManager()
    listener.filter_chains[0].filters[0].typed_config.Unpack(hcm)  # type: ignore[attr-defined]
    strip = header_mutation_pb2.HeaderMutation()
    hcm.http_filters[1].typed_config.Unpack(strip)  # after health_check
    assert DESTINATION_HEADER in [m.remove for m in strip.mutations.request_mutations]

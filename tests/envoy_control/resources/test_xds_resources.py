"""The resources built from the example config and a replica set: clusters, endpoints, routes."""

from __future__ import annotations

import json

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_components_pb2, route_pb2
from envoy.extensions.filters.http.ext_authz.v3 import ext_authz_pb2
from envoy.extensions.filters.http.header_mutation.v3 import header_mutation_pb2
from envoy.extensions.filters.http.json_to_metadata.v3 import json_to_metadata_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.extensions.load_balancing_policies.override_host.v3 import override_host_pb2
from envoy.extensions.load_balancing_policies.ring_hash.v3 import ring_hash_pb2
from envoy_control.resources.body_filter import BODY_INVALID, REQUEST_METADATA
from envoy_control.resources.body_routes import canary_weights
from envoy_control.resources.bootstrap import render_bootstrap
from envoy_control.resources.build import ListenerSpec, build_resources, unroutable_replicas
from envoy_control.resources.ext_authz import GATEWAY_CLUSTER
from envoy_control.resources.routes import UPSTREAM_HEADERS
from envoy_control.state.replicas import Replica
from envoy_control.xds.snapshot import CLUSTER, ENDPOINT, LISTENER, ROUTE

from modelfleet.config import PlatformConfig, Shadow
from modelfleet.contract.headers import (
    CONVERSATION_HEADER,
    MAX_BODY_BYTES,
    PRIORITY_HEADER,
    SHED_STATUS,
)
from modelfleet.contract.headers import UPSTREAM_HEADERS as GATEWAY_HEADERS


def _build(config: PlatformConfig, replicas: list[Replica]) -> dict[str, list]:  # type: ignore[type-arg]
    return build_resources(config, replicas, ListenerSpec("127.0.0.1", 8080))


def _routes(
    config: PlatformConfig, replicas: list[Replica]
) -> dict[str, route_components_pb2.Route]:
    (rc,) = _build(config, replicas)[ROUTE]
    assert isinstance(rc, route_pb2.RouteConfiguration)
    return {r.name: r for r in rc.virtual_hosts[0].routes}


def test_one_ring_hash_cluster_per_version(
    example_config: PlatformConfig, example_replicas: list[Replica]
) -> None:
    clusters = _build(example_config, example_replicas)[CLUSTER]
    assert sorted(c.name for c in clusters) == ["chat-7b@v13", "chat-7b@v14", "reason-70b@v1"]
    for c in clusters:
        assert isinstance(c, cluster_pb2.Cluster)
        assert c.type == cluster_pb2.Cluster.EDS
        assert c.eds_cluster_config.eds_config.HasField("ads")
        (outer,) = c.load_balancing_policy.policies
        assert outer.typed_extension_config.name == "envoy.load_balancing_policies.override_host"
        override = override_host_pb2.OverrideHost()
        outer.typed_extension_config.typed_config.Unpack(override)
        (policy,) = override.fallback_policy.policies  # the gateway's pick, else the ring
        assert policy.typed_extension_config.name == "envoy.load_balancing_policies.ring_hash"
        ring = ring_hash_pb2.RingHash()
        policy.typed_extension_config.typed_config.Unpack(ring)
        assert ring.consistent_hashing_lb_config.hash_balance_factor.value == 125
        assert c.circuit_breakers.thresholds[0].max_requests.value >= 10_000


def test_endpoints_pin_hash_key_to_replica_id(
    example_config: PlatformConfig, example_replicas: list[Replica]
) -> None:
    assignments = {a.cluster_name: a for a in _build(example_config, example_replicas)[ENDPOINT]}
    assert set(assignments) == {"chat-7b@v13", "chat-7b@v14", "reason-70b@v1"}
    v13 = assignments["chat-7b@v13"]
    assert isinstance(v13, endpoint_pb2.ClusterLoadAssignment)
    eps = [e for loc in v13.endpoints for e in loc.lb_endpoints]
    assert [e.endpoint.hostname for e in eps] == ["chat-7b-v13-0", "chat-7b-v13-1", "chat-7b-v13-2"]
    assert [e.endpoint.address.socket_address.port_value for e in eps] == [9100, 9101, 9102]
    for e in eps:
        assert e.metadata.filter_metadata["envoy.lb"]["hash_key"] == e.endpoint.hostname
    assert v13.endpoints[0].locality.region == example_config.local.region
    assert len(assignments["reason-70b@v1"].endpoints) == 0  # declared, no replica yet: empty


def test_every_routable_version_matches_its_route_header(
    example_config: PlatformConfig, example_replicas: list[Replica]
) -> None:
    routes = _routes(example_config, example_replicas)
    for key in ("chat-7b@v13", "chat-7b@v14", "reason-70b@v1"):
        r = routes[f"version:{key}"]
        assert r.route.cluster == key  # one cluster: the gateway already chose the version
        (header,) = r.match.headers
        assert (header.name, header.string_match.exact) == ("x-route-version", key)
    assert not any(name.startswith("alias:") for name in routes)


def test_route_actions_suit_long_streams(
    example_config: PlatformConfig, example_replicas: list[Replica]
) -> None:
    route = _routes(example_config, example_replicas)["version:chat-7b@v13"]
    action = route.route
    assert action.timeout.seconds == 0 and action.timeout.nanos == 0  # no total timeout
    assert action.idle_timeout.seconds > 0
    assert [h.header.header_name for h in action.hash_policy] == [CONVERSATION_HEADER]
    assert set(action.retry_policy.retry_on.split(",")) == {
        "connect-failure",
        "refused-stream",
        "reset",
        "retriable-status-codes",
    }
    assert list(action.retry_policy.retriable_status_codes) == [503]
    assert (
        action.retry_policy.retry_host_predicate[0].name
        == "envoy.retry_host_predicates.previous_hosts"
    )
    added = {h.header.key: h.header.value for h in route.response_headers_to_add}
    assert added == UPSTREAM_HEADERS


def test_error_routes_come_after_version_routes(
    example_config: PlatformConfig, example_replicas: list[Replica]
) -> None:
    routes = _routes(example_config, example_replicas)
    names = list(routes)
    assert names[0] == "models-list" and names[-2:] == ["version-unrouted", "unknown-url"]
    unrouted = routes["version-unrouted"]
    assert unrouted.match.headers[0].present_match
    assert unrouted.direct_response.status == 404  # 4xx: the local-reply mappers leave it alone
    error = unrouted.direct_response.body_format.json_format["error"]
    assert set(error.keys()) == {"message", "type", "param", "code"}
    assert error["code"] == "model_not_found"
    assert routes["unknown-url"].direct_response.status == 404


def test_models_list_names_models_and_versions(
    example_config: PlatformConfig, example_replicas: list[Replica]
) -> None:
    body = _routes(example_config, example_replicas)["models-list"].direct_response.body_format
    listing = json.loads(body.text_format_source.inline_string)
    assert listing["object"] == "list"
    assert [m["id"] for m in listing["data"]] == [
        "chat-7b",
        "reason-70b",
        "chat-7b@v13",
        "chat-7b@v14",
        "reason-70b@v1",
    ]


def test_shadow_mirrors_a_fraction(
    example_config: PlatformConfig, example_replicas: list[Replica]
) -> None:
    model = example_config.model("chat-7b")
    assert model is not None
    shadowed = example_config.model_copy(
        update={
            "models": (
                model.model_copy(
                    update={"canary": None, "shadow": Shadow(version="v14", fraction=0.01)}
                ),
                *example_config.models[1:],
            )
        }
    )
    routes = _routes(shadowed, example_replicas)
    live = routes["version:chat-7b@v13"]
    assert live.route.cluster == "chat-7b@v13"
    (mirror,) = live.route.request_mirror_policies
    assert mirror.cluster == "chat-7b@v14"
    assert mirror.runtime_fraction.default_value.numerator == 10_000  # per million
    assert not routes["version:chat-7b@v14"].route.request_mirror_policies


def _hcm(config: PlatformConfig, spec: ListenerSpec) -> hcm_pb2.HttpConnectionManager:
    (listener,) = build_resources(config, [], spec)[LISTENER]
    assert isinstance(listener, listener_pb2.Listener)
    hcm = hcm_pb2.HttpConnectionManager()
    listener.filter_chains[0].filters[0].typed_config.Unpack(hcm)
    return hcm


def test_listener_checks_every_request_with_the_gateway(example_config: PlatformConfig) -> None:
    (listener,) = build_resources(example_config, [], ListenerSpec("127.0.0.1", 18080))[LISTENER]
    assert isinstance(listener, listener_pb2.Listener)
    assert listener.address.socket_address.port_value == 18080
    hcm = _hcm(example_config, ListenerSpec("127.0.0.1", 18080))
    assert [f.name for f in hcm.http_filters] == [
        "envoy.filters.http.health_check",
        "envoy.filters.http.header_mutation",
        "envoy.filters.http.ext_authz",
        "envoy.filters.http.router",
    ]
    strip = header_mutation_pb2.HeaderMutation()
    hcm.http_filters[1].typed_config.Unpack(strip)
    removed = strip.mutations.request_mutations
    assert removed[0].remove == "x-route-version"
    assert removed[1].remove_on_match.key_matcher.prefix == "x-modelfleet-"
    authz = ext_authz_pb2.ExtAuthz()
    hcm.http_filters[2].typed_config.Unpack(authz)
    assert authz.http_service.server_uri.cluster == GATEWAY_CLUSTER
    assert authz.http_service.path_prefix == "/authz"
    assert not authz.failure_mode_allow and authz.clear_route_cache
    assert authz.status_on_error.code == 503
    assert authz.with_request_body.max_request_bytes == MAX_BODY_BYTES
    assert not authz.with_request_body.allow_partial_message
    assert authz.http_service.server_uri.timeout.seconds > 120  # above the longest queue wait
    assert {p.exact for p in authz.allowed_headers.patterns} == {
        "authorization", PRIORITY_HEADER, CONVERSATION_HEADER, "content-type", "content-length"}
    response = authz.http_service.authorization_response
    assert {p.exact for p in response.allowed_upstream_headers.patterns} == set(GATEWAY_HEADERS)
    assert {p.exact or p.prefix for p in response.allowed_client_headers.patterns} == {
        "retry-after", "retry-after-ms", "content-type", "x-ratelimit-"}
    assert [p.prefix for p in response.allowed_client_headers_on_success.patterns] == [
        "x-ratelimit-"]
    assert hcm.rds.route_config_name == "modelfleet-api"
    assert hcm.request_timeout.seconds == 0 and hcm.stream_idle_timeout.seconds >= 60


def test_the_gateway_503_marker_is_mapped_back_to_503(example_config: PlatformConfig) -> None:
    first = _hcm(example_config, ListenerSpec()).local_reply_config.mappers[0]
    (status, flag) = first.filter.and_filter.filters
    assert status.status_code_filter.comparison.value.default_value == SHED_STATUS
    assert list(flag.response_flag_filter.flags) == ["UAEX"]  # only ext_authz denials
    assert first.status_code.value == 503 and not first.HasField("body_format_override")


def test_without_gateway_envoy_routes_on_the_body_and_splits_the_canary(
    example_config: PlatformConfig, example_replicas: list[Replica]
) -> None:
    spec = ListenerSpec(gateway=None)
    hcm = _hcm(example_config, spec)
    assert [f.name for f in hcm.http_filters] == [
        "envoy.filters.http.health_check",
        "envoy.filters.http.json_to_metadata",
        "envoy.filters.http.router",
    ]
    j2m = json_to_metadata_pb2.JsonToMetadata()
    hcm.http_filters[1].typed_config.Unpack(j2m)
    (rule,) = j2m.request_rules.rules
    assert [s.key for s in rule.selectors] == ["model"]
    assert rule.on_present.metadata_namespace == REQUEST_METADATA
    (rc,) = build_resources(example_config, example_replicas, spec)[ROUTE]
    assert isinstance(rc, route_pb2.RouteConfiguration)
    routes = {r.name: r for r in rc.virtual_hosts[0].routes}
    alias = routes["alias:chat-7b"]
    weights = {c.name: c.weight.value for c in alias.route.weighted_clusters.clusters}
    assert weights == {"chat-7b@v13": 9000, "chat-7b@v14": 1000}  # canary 10 %
    assert alias.route.weighted_clusters.use_hash_policy.value  # a conversation keeps its version
    assert alias.match.dynamic_metadata[0].value.string_match.exact == "chat-7b"
    assert list(routes)[:2] == ["models-list", "body-not-json"]
    assert list(routes)[-3:] == ["model-missing", "model-unknown", "unknown-url"]
    assert routes["body-not-json"].match.dynamic_metadata[0].value.string_match.exact == (
        BODY_INVALID)


def test_canary_weights_edges() -> None:
    assert canary_weights("a", None, 0) == [("a", 10_000)]
    assert canary_weights("a", "b", 0) == [("a", 10_000)]
    assert canary_weights("a", "b", 1) == [("a", 9_900), ("b", 100)]
    assert canary_weights("a", "b", 0.25) == [("a", 9_975), ("b", 25)]
    assert canary_weights("a", "b", 100) == [("b", 10_000)]


def test_the_bootstrap_holds_the_gateway_cluster() -> None:
    boot = render_bootstrap(node_id="n", cluster="c", admin_port=0, xds_host="127.0.0.1",
                            xds_port=1, gateway=("gateway-ext.modelfleet.svc", 8090))
    clusters = {c["name"]: c for c in boot["static_resources"]["clusters"]}
    gateway = clusters[GATEWAY_CLUSTER]
    assert gateway["type"] == "STRICT_DNS"
    assert gateway["circuit_breakers"]["thresholds"][0]["max_requests"] >= 10_000
    address = gateway["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
    assert address["socket_address"] == {"address": "gateway-ext.modelfleet.svc",
                                         "port_value": 8090}
    assert GATEWAY_CLUSTER not in {c["name"] for c in render_bootstrap(
        node_id="n", cluster="c", admin_port=0, xds_host="127.0.0.1", xds_port=1,
    )["static_resources"]["clusters"]}


def test_replicas_of_undeclared_versions_are_left_out(example_config: PlatformConfig) -> None:
    stray = Replica("x-0", "chat-7b", "v99", "127.0.0.1", 9999)
    assert unroutable_replicas(example_config, [stray]) == [stray]
    assignments = build_resources(example_config, [stray], ListenerSpec())[ENDPOINT]
    assert all(
        isinstance(a, endpoint_pb2.ClusterLoadAssignment) and not a.endpoints for a in assignments
    )

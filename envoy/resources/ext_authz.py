"""Builders for the gateway's HTTP filters: strip gateway-only headers, then ``ext_authz``.

Every API request is checked by gateway_ext before it is routed (see ``modelfleet.contract.headers`` for
the wire contract):

1. ``header_mutation`` removes the client's ``x-route-version``, ``x-gateway-destination-endpoint``
   and every ``x-modelfleet-*`` request header, so only the gateway can set them (a client cannot
   pick its replica; and ``override_host`` only reaches addresses in the cluster anyway);
2. ``ext_authz`` (HTTP service on the bootstrap's static cluster ``modelfleet_gateway``) sends the
   method, path, body (up to 1 MiB; larger bodies get a 413 without a check) and the allowed
   headers. On 200 the gateway's ``x-route-version`` / ``x-modelfleet-*`` headers are set on the
   request and the route cache is cleared, so the router picks the route on ``x-route-version``;
   its ``x-ratelimit-*`` headers go to the client. A refusal keeps its status, JSON body,
   ``Retry-After`` and ``x-ratelimit-*`` headers. An unreachable or failing gateway (or one past
   ``timeout_s``) is a 503 for the client: ``failure_mode_allow`` is false.
"""

from __future__ import annotations

from dataclasses import dataclass

from envoy_control.resources.clusters import seconds
from google.protobuf import any_pb2
from google.protobuf.message import Message

from envoy.config.common.mutation_rules.v3 import mutation_rules_pb2
from envoy.config.core.v3 import config_source_pb2, http_uri_pb2
from envoy.extensions.filters.http.ext_authz.v3 import ext_authz_pb2
from envoy.extensions.filters.http.header_mutation.v3 import header_mutation_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.type.matcher.v3 import string_pb2
from envoy.type.v3 import http_status_pb2
from modelfleet.contract.headers import (
    AUTHZ_PATH_PREFIX,
    CHECK_HEADERS,
    CLIENT_HEADERS,
    DESTINATION_HEADER,
    GATEWAY_HEADER_PREFIX,
    MAX_BODY_BYTES,
    RATELIMIT_PREFIX,
    ROUTE_VERSION_HEADER,
    UPSTREAM_HEADERS,
)

GATEWAY_CLUSTER = "modelfleet_gateway"
"""The bootstrap's static cluster of gateway_ext (``envoy_control.resources.bootstrap``)."""
GATEWAY_TIMEOUT_S = 150.0
"""Longest check, in seconds: above gateway_ext's longest queue wait (120 s, batch) so that the
gateway, not Envoy, answers a queue timeout (with its 503 and Retry-After); below the stream idle
timeout (300 s)."""


@dataclass(frozen=True)
class ExtAuthzSpec:
    """How Envoy reaches gateway_ext: ``cluster`` name, check ``timeout_s`` (seconds), the body
    limit ``max_request_bytes`` (bytes) and the check path prefix."""

    cluster: str = GATEWAY_CLUSTER
    timeout_s: float = GATEWAY_TIMEOUT_S
    max_request_bytes: int = MAX_BODY_BYTES
    path_prefix: str = AUTHZ_PATH_PREFIX


DEFAULT_GATEWAY = ExtAuthzSpec()


def _pack(message: Message) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed


def _exact(name: str) -> string_pb2.StringMatcher:
    return string_pb2.StringMatcher(exact=name)


def _prefix(prefix: str) -> string_pb2.StringMatcher:
    return string_pb2.StringMatcher(prefix=prefix)


def make_strip_filter() -> hcm_pb2.HttpFilter:
    """``header_mutation``: drop client request headers only the gateway may set."""
    mutations = header_mutation_pb2.Mutations(
        request_mutations=[
            mutation_rules_pb2.HeaderMutation(remove=ROUTE_VERSION_HEADER),
            mutation_rules_pb2.HeaderMutation(
                remove_on_match=mutation_rules_pb2.HeaderMutation.RemoveOnMatch(
                    key_matcher=_prefix(GATEWAY_HEADER_PREFIX)
                )
            ),
            mutation_rules_pb2.HeaderMutation(remove=DESTINATION_HEADER),
        ]
    )
    config = header_mutation_pb2.HeaderMutation(mutations=mutations)
    return hcm_pb2.HttpFilter(
        name="envoy.filters.http.header_mutation", typed_config=_pack(config)
    )


def make_ext_authz_config(spec: ExtAuthzSpec) -> ext_authz_pb2.ExtAuthz:
    """The ``ext_authz`` filter's config for ``spec`` (HTTP service, request body, fail closed)."""
    response = ext_authz_pb2.AuthorizationResponse(
        allowed_upstream_headers=string_pb2.ListStringMatcher(
            patterns=[_exact(h) for h in UPSTREAM_HEADERS]
        ),
        allowed_client_headers=string_pb2.ListStringMatcher(
            patterns=[*(_exact(h) for h in CLIENT_HEADERS), _prefix(RATELIMIT_PREFIX)]
        ),
        allowed_client_headers_on_success=string_pb2.ListStringMatcher(
            patterns=[_prefix(RATELIMIT_PREFIX)]
        ),
    )
    service = ext_authz_pb2.HttpService(
        server_uri=http_uri_pb2.HttpUri(
            uri=f"http://{spec.cluster}", cluster=spec.cluster, timeout=seconds(spec.timeout_s)
        ),
        path_prefix=spec.path_prefix,
        authorization_response=response,
    )
    return ext_authz_pb2.ExtAuthz(
        http_service=service,
        transport_api_version=config_source_pb2.V3,
        failure_mode_allow=False,
        status_on_error=http_status_pb2.HttpStatus(code=http_status_pb2.ServiceUnavailable),
        clear_route_cache=True,
        with_request_body=ext_authz_pb2.BufferSettings(
            max_request_bytes=spec.max_request_bytes, allow_partial_message=False
        ),
        allowed_headers=string_pb2.ListStringMatcher(patterns=[_exact(h) for h in CHECK_HEADERS]),
    )


def make_ext_authz_filter(spec: ExtAuthzSpec) -> hcm_pb2.HttpFilter:
    """The ``ext_authz`` HTTP filter calling gateway_ext."""
    return hcm_pb2.HttpFilter(
        name="envoy.filters.http.ext_authz", typed_config=_pack(make_ext_authz_config(spec))
    )


def gateway_filters(spec: ExtAuthzSpec) -> list[hcm_pb2.HttpFilter]:
    """The filters before the router: strip the gateway-only headers, then ext_authz."""
    return [make_strip_filter(), make_ext_authz_filter(spec)]

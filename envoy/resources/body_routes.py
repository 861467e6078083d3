"""Routing on the request body's ``model`` when no gateway checks requests (``ListenerSpec.gateway``
is None): tests of the routing layer and the control plane's own live tests. Never a public
listener: nothing authenticates, limits or meters these requests.

``json_to_metadata`` buffers the body, parses it and writes its ``model`` into the dynamic
metadata ``modelfleet.request:model`` (a sentinel when the field is missing or the body is not
JSON), clearing the route cache; the routes here match that metadata: an alias (``chat-7b``) to
its live version with Envoy's own canary split (hashing ``x-conversation-id``) and shadow copy,
an explicit ``model@version`` to that version, everything else to an OpenAI-shaped error. With
the gateway, the version is chosen by gateway_ext and routed on ``x-route-version`` instead
(``envoy_control.resources.routes``).
"""

from __future__ import annotations

from collections.abc import Sequence

from envoy_control.resources.body_filter import BODY_INVALID, MODEL_MISSING, REQUEST_METADATA
from envoy_control.resources.listeners import ROUTE_CONFIG_NAME
from envoy_control.resources.openai_errors import error_format
from envoy_control.resources.routes import (
    AliasRoute,
    direct_route,
    make_models_list_route,
    make_route_action,
    upstream_headers,
)

from envoy.config.route.v3 import route_components_pb2 as rc
from envoy.config.route.v3 import route_pb2
from envoy.type.matcher.v3 import metadata_pb2, string_pb2, value_pb2
from modelfleet.contract.errors import ErrorType

WEIGHT_TOTAL = 10_000
"""Weights are basis points of traffic, so canary percents keep two decimals."""


def model_match(name: str | None, *, post_only: bool = False) -> rc.RouteMatch:
    """Match ``/v1/...`` requests whose body's ``model`` is ``name`` (None: any value)."""
    value = (
        value_pb2.ValueMatcher(present_match=True)
        if name is None
        else value_pb2.ValueMatcher(string_match=string_pb2.StringMatcher(exact=name))
    )
    match = rc.RouteMatch(
        prefix="/v1/",
        dynamic_metadata=[
            metadata_pb2.MetadataMatcher(
                filter=REQUEST_METADATA,
                path=[metadata_pb2.MetadataMatcher.PathSegment(key="model")],
                value=value,
            )
        ],
    )
    if post_only:
        match.headers.add(name=":method", string_match=string_pb2.StringMatcher(exact="POST"))
    return match


def canary_weights(live: str, canary: str | None, percent: float) -> list[tuple[str, int]]:
    """``(cluster, weight)`` pairs summing to ``WEIGHT_TOTAL``; a zero-weight side is left out."""
    canary_weight = round(percent * WEIGHT_TOTAL / 100) if canary else 0
    pairs = [(live, WEIGHT_TOTAL - canary_weight), (canary or "", canary_weight)]
    return [(name, weight) for name, weight in pairs if weight > 0]


def make_alias_route(alias: AliasRoute) -> rc.Route:
    """A model name in the body goes to its live version, with the canary split and shadow copy."""
    shadow = (alias.shadow, alias.shadow_fraction) if alias.shadow else None
    return rc.Route(
        name=f"alias:{alias.model}",
        match=model_match(alias.model),
        route=make_route_action(
            canary_weights(alias.live, alias.canary, alias.canary_percent), shadow
        ),
        response_headers_to_add=upstream_headers(),
    )


def make_body_version_route(key: str) -> rc.Route:
    """An explicit ``model@version`` in the body goes to that version's cluster."""
    return rc.Route(
        name=f"version:{key}",
        match=model_match(key),
        route=make_route_action([(key, 1)]),
        response_headers_to_add=upstream_headers(),
    )


def make_body_error_routes() -> list[rc.Route]:
    """Body not JSON (400), no ``model`` (400), unknown model (404), unknown URL (404)."""
    invalid = rc.RouteMatch(prefix="/")
    invalid.dynamic_metadata.add(
        filter=REQUEST_METADATA,
        path=[metadata_pb2.MetadataMatcher.PathSegment(key="model")],
        value=value_pb2.ValueMatcher(string_match=string_pb2.StringMatcher(exact=BODY_INVALID)),
    )
    model_value = f"%DYNAMIC_METADATA({REQUEST_METADATA}:model)%"
    return [
        direct_route("body-not-json", invalid, 400, error_format(
            "We could not parse the JSON body of your request: send a JSON object with "
            "'Content-Type: application/json'.", ErrorType.INVALID_REQUEST, None)),
        direct_route("model-missing", model_match(MODEL_MISSING, post_only=True), 400,
                     error_format("You must provide a model parameter.",
                                  ErrorType.INVALID_REQUEST, None, "model")),
        direct_route("model-unknown", model_match(None, post_only=True), 404,
                     error_format(f"The model `{model_value}` does not exist.",
                                  ErrorType.INVALID_REQUEST, "model_not_found", "model")),
        direct_route("unknown-url", rc.RouteMatch(prefix="/"), 404, error_format(
            "Invalid URL (%REQ(:METHOD)% %REQ(:PATH)%).", ErrorType.INVALID_REQUEST,
            "unknown_url")),
    ]


def make_body_route_config(
    aliases: Sequence[AliasRoute], version_keys: Sequence[str], *, name: str = ROUTE_CONFIG_NAME
) -> route_pb2.RouteConfiguration:
    """Models list, invalid body, aliases, versions, then errors. The invalid-body route goes
    first so a client's literal ``model`` string can never shadow it."""
    errors = make_body_error_routes()
    routes = [make_models_list_route([a.model for a in aliases] + list(version_keys)), errors[0]]
    routes += [make_alias_route(a) for a in aliases]
    routes += [make_body_version_route(k) for k in version_keys]
    routes += errors[1:]
    host = rc.VirtualHost(name="api", domains=["*"], routes=routes)
    return route_pb2.RouteConfiguration(name=name, virtual_hosts=[host])

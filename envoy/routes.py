"""Builders for the RDS resource: routes on the request body's ``model`` field.

``json_to_metadata`` (see ``envoy_control.listeners``) puts the body's ``model`` into dynamic
metadata; each route here matches that metadata: an alias (``chat-7b``) goes to its live version,
split by weight to a canary (the split hashes ``x-conversation-id``, so a conversation stays on one
version) and mirrored to a shadow version; an explicit ``model@version`` goes to that version.
Anything else gets an OpenAI-shaped error from Envoy itself.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from envoy_control.clusters import seconds
from envoy_control.listeners import BODY_INVALID, MODEL_MISSING, REQUEST_METADATA, ROUTE_CONFIG_NAME
from envoy_control.openai_errors import error_format, json_body_format
from google.protobuf import any_pb2, wrappers_pb2

from envoy.config.core.v3 import base_pb2
from envoy.config.core.v3 import substitution_format_string_pb2 as sf
from envoy.config.route.v3 import route_components_pb2 as rc
from envoy.config.route.v3 import route_pb2
from envoy.extensions.retry.host.previous_hosts.v3 import previous_hosts_pb2
from envoy.type.matcher.v3 import metadata_pb2, string_pb2, value_pb2
from envoy.type.v3 import percent_pb2

CONVERSATION_HEADER = "x-conversation-id"
"""The routing key: ring hash over replicas and the canary split both hash it."""
UPSTREAM_HEADERS = {
    "x-modelfleet-upstream": "%UPSTREAM_HOST%",
    "x-modelfleet-cluster": "%UPSTREAM_CLUSTER%",
    "x-modelfleet-replica": "%UPSTREAM_HOST_NAME%",
}
"""Response headers Envoy adds: the replica's address, its cluster (model@version), its id."""
ROUTE_IDLE_TIMEOUT_S = 120.0
"""A stream with no bytes either way for this many seconds is reset."""
RETRY_ON = "connect-failure,refused-stream,reset"
"""Retried only before response headers, which a replica holds until its first token."""
WEIGHT_TOTAL = 10_000
"""Weights are basis points of traffic, so canary percents keep two decimals."""


@dataclass(frozen=True)
class AliasRoute:
    """A model name and where it goes: ``live`` and ``canary``/``shadow`` are ``model@version``.

    ``canary_percent`` in 0..100 of conversations; ``shadow_fraction`` in 0..1 of requests.
    """

    model: str
    live: str
    canary: str | None = None
    canary_percent: float = 0.0
    shadow: str | None = None
    shadow_fraction: float = 0.0


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


def make_retry_policy(num_retries: int = 2) -> rc.RetryPolicy:
    """Retry ``num_retries`` times on another replica, only when no response has started."""
    predicate = any_pb2.Any()
    predicate.Pack(previous_hosts_pb2.PreviousHostsPredicate())
    return rc.RetryPolicy(
        retry_on=RETRY_ON,
        num_retries=wrappers_pb2.UInt32Value(value=num_retries),
        retry_host_predicate=[
            rc.RetryPolicy.RetryHostPredicate(
                name="envoy.retry_host_predicates.previous_hosts", typed_config=predicate
            )
        ],
        host_selection_retry_max_attempts=5,
        retry_back_off=rc.RetryPolicy.RetryBackOff(
            base_interval=seconds(0.025), max_interval=seconds(0.25)
        ),
    )


def make_route_action(
    clusters: Sequence[tuple[str, int]], shadow: tuple[str, float] | None = None
) -> rc.RouteAction:
    """Forward to ``clusters`` (``(name, weight)``; one entry: no split) without a total timeout.

    ``shadow`` is ``(cluster, fraction 0..1)`` of requests mirrored there, answers discarded.
    """
    action = rc.RouteAction(
        timeout=seconds(0),
        idle_timeout=seconds(ROUTE_IDLE_TIMEOUT_S),
        retry_policy=make_retry_policy(),
        hash_policy=[
            rc.RouteAction.HashPolicy(
                header=rc.RouteAction.HashPolicy.Header(header_name=CONVERSATION_HEADER)
            )
        ],
    )
    if len(clusters) == 1:
        action.cluster = clusters[0][0]
    else:
        action.weighted_clusters.use_hash_policy.value = True
        for name, weight in clusters:
            action.weighted_clusters.clusters.add(
                name=name, weight=wrappers_pb2.UInt32Value(value=weight)
            )
    if shadow is not None and shadow[1] > 0:
        action.request_mirror_policies.add(
            cluster=shadow[0],
            runtime_fraction=base_pb2.RuntimeFractionalPercent(
                default_value=percent_pb2.FractionalPercent(
                    numerator=round(shadow[1] * 1_000_000),
                    denominator=percent_pb2.FractionalPercent.MILLION,
                )
            ),
        )
    return action


def _upstream_headers() -> list[base_pb2.HeaderValueOption]:
    return [
        base_pb2.HeaderValueOption(
            header=base_pb2.HeaderValue(key=k, value=v),
            append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
        )
        for k, v in UPSTREAM_HEADERS.items()
    ]


def make_version_route(key: str) -> rc.Route:
    """An explicit ``model@version`` in the body goes to that version's cluster."""
    return rc.Route(
        name=f"version:{key}",
        match=model_match(key),
        route=make_route_action([(key, 1)]),
        response_headers_to_add=_upstream_headers(),
    )


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
        response_headers_to_add=_upstream_headers(),
    )


def _direct(
    name: str, match: rc.RouteMatch, status: int, body: sf.SubstitutionFormatString
) -> rc.Route:
    return rc.Route(
        name=name,
        match=match,
        direct_response=rc.DirectResponseAction(status=status, body_format=body),
    )


def make_models_list_route(names: Iterable[str]) -> rc.Route:
    """``GET /v1/models``: the declared model names and ``model@version`` names, OpenAI list shape."""
    data = [{"id": n, "object": "model", "created": 0, "owned_by": "modelfleet"} for n in names]
    match = rc.RouteMatch(path="/v1/models")
    match.headers.add(name=":method", string_match=string_pb2.StringMatcher(exact="GET"))
    body = json_body_format(json.dumps({"object": "list", "data": data}, separators=(",", ":")))
    return _direct("models-list", match, 200, body)


def make_error_routes() -> list[rc.Route]:
    """Body not JSON (400), no ``model`` (400), unknown model (404), unknown URL (404).

    Placed after every model route: a route matches only what no model route took.
    """
    model_value = f"%DYNAMIC_METADATA({REQUEST_METADATA}:model)%"
    invalid = rc.RouteMatch(prefix="/")
    invalid.dynamic_metadata.add(
        filter=REQUEST_METADATA,
        path=[metadata_pb2.MetadataMatcher.PathSegment(key="model")],
        value=value_pb2.ValueMatcher(string_match=string_pb2.StringMatcher(exact=BODY_INVALID)),
    )
    return [
        _direct(
            "body-not-json",
            invalid,
            400,
            error_format(
                "We could not parse the JSON body of your request: send a JSON object with "
                "'Content-Type: application/json'.",
                "invalid_request_error",
                None,
            ),
        ),
        _direct(
            "model-missing",
            model_match(MODEL_MISSING, post_only=True),
            400,
            error_format(
                "You must provide a model parameter.", "invalid_request_error", None, "model"
            ),
        ),
        _direct(
            "model-unknown",
            model_match(None, post_only=True),
            404,
            error_format(
                f"The model `{model_value}` does not exist.",
                "invalid_request_error",
                "model_not_found",
                "model",
            ),
        ),
        _direct(
            "unknown-url",
            rc.RouteMatch(prefix="/"),
            404,
            error_format(
                "Invalid URL (%REQ(:METHOD)% %REQ(:PATH)%).", "invalid_request_error", "unknown_url"
            ),
        ),
    ]


def make_route_config(
    aliases: Sequence[AliasRoute], version_keys: Sequence[str], *, name: str = ROUTE_CONFIG_NAME
) -> route_pb2.RouteConfiguration:
    """The public API's routes: models list, invalid body, aliases, versions, then errors.

    The invalid-body route goes first so a client's literal ``model`` string can never shadow it.
    """
    routes = [make_models_list_route([a.model for a in aliases] + list(version_keys))]
    error_routes = make_error_routes()
    routes.append(error_routes[0])
    routes += [make_alias_route(a) for a in aliases]
    routes += [make_version_route(k) for k in version_keys]
    routes += error_routes[1:]
    host = rc.VirtualHost(name="api", domains=["*"], routes=routes)
    return route_pb2.RouteConfiguration(name=name, virtual_hosts=[host])

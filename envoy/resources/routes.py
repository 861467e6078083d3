"""Builders for the RDS resource: routes on the ``x-route-version`` header set by gateway_ext.

gateway_ext resolves every chat request to one ``model@version`` (explicit ``@vN``, conversation
pinning, the canary split) and sets ``x-route-version``; Envoy clears its route cache after the
check and picks the route here: each served ``model@version`` matches that header exactly and
forwards to its cluster, the live version of a model with a shadow also mirrors a fraction of
requests to the shadow version. ``GET /v1/models`` is answered by Envoy itself; ``/v1/batches``
and ``/v1/files`` go to the batch service (``envoy_control.resources.batch``, without the gateway's
check); anything else gets an OpenAI-shaped error. Bad bodies, unknown models, keys and limits are the gateway's
answers, before any route is chosen.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from envoy_control.resources.batch import make_batch_routes
from envoy_control.resources.clusters import seconds
from envoy_control.resources.listeners import ROUTE_CONFIG_NAME
from envoy_control.resources.openai_errors import error_format, json_body_format
from google.protobuf import any_pb2, wrappers_pb2

from envoy.config.common.mutation_rules.v3 import mutation_rules_pb2
from envoy.config.core.v3 import base_pb2
from envoy.config.core.v3 import substitution_format_string_pb2 as sf
from envoy.config.route.v3 import route_components_pb2 as rc
from envoy.config.route.v3 import route_pb2
from envoy.extensions.retry.host.previous_hosts.v3 import previous_hosts_pb2
from envoy.type.matcher.v3 import string_pb2
from envoy.type.v3 import percent_pb2
from modelfleet.contract.errors import ErrorType
from modelfleet.contract.headers import (
    CONVERSATION_HEADER,
    DESTINATION_HEADER,
    RESERVATION_HEADER,
    ROUTE_VERSION_HEADER,
    SHADOW_HEADER,
    UPSTREAM_CLUSTER_HEADER,
    UPSTREAM_HOST_HEADER,
    UPSTREAM_REPLICA_HEADER,
)

UPSTREAM_HEADERS = {
    UPSTREAM_HOST_HEADER: "%UPSTREAM_HOST%",
    UPSTREAM_CLUSTER_HEADER: "%UPSTREAM_CLUSTER%",
    UPSTREAM_REPLICA_HEADER: "%UPSTREAM_HOST_NAME%",
}
"""Response headers Envoy adds: the replica's address, its cluster (model@version), its id."""
ROUTE_IDLE_TIMEOUT_S = 120.0
"""A stream with no bytes either way for this many seconds is reset."""
RETRY_ON = "connect-failure,refused-stream,reset,retriable-status-codes"
"""Retried only before response headers, which a replica holds until its first token."""
RETRIABLE_STATUSES = (503,)
"""A replica answers 503 when it cannot start a request (draining, engine failed before the
first token): nothing reached the client, so another replica may serve it."""


@dataclass(frozen=True)
class AliasRoute:
    """A model name and its versions: ``live`` and ``canary``/``shadow`` are ``model@version``.

    Envoy routes ``live`` and ``canary`` as versions (gateway_ext splits between them;
    ``canary_percent``, 0..100 of conversations, is its input) and mirrors ``shadow_fraction``
    (0..1) of the live version's requests to ``shadow``.
    """

    model: str
    live: str
    canary: str | None = None
    canary_percent: float = 0.0
    shadow: str | None = None
    shadow_fraction: float = 0.0


def version_match(key: str | None) -> rc.RouteMatch:
    """Match ``/v1/...`` requests whose ``x-route-version`` is ``key`` (None: any value)."""
    header = rc.HeaderMatcher(name=ROUTE_VERSION_HEADER)
    if key is None:
        header.present_match = True
    else:
        header.string_match.CopyFrom(string_pb2.StringMatcher(exact=key))
    return rc.RouteMatch(prefix="/v1/", headers=[header])


def make_retry_policy(num_retries: int = 2) -> rc.RetryPolicy:
    """Retry ``num_retries`` times on another replica, only when no response has started: the
    next address of ``x-gateway-destination-endpoint`` (``override_host``), else the ring's
    next host; ``previous_hosts`` refuses a replica already tried. The cluster's retry budget
    bounds retries under a storm."""
    predicate = any_pb2.Any()
    predicate.Pack(previous_hosts_pb2.PreviousHostsPredicate())
    return rc.RetryPolicy(
        retry_on=RETRY_ON,
        retriable_status_codes=list(RETRIABLE_STATUSES),
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
    """Forward to ``clusters`` (``(name, weight)``; one entry: no split) without a total timeout,
    retrying before the first byte only.

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
            request_headers_mutations=shadow_mutations(),
            runtime_fraction=base_pb2.RuntimeFractionalPercent(
                default_value=percent_pb2.FractionalPercent(
                    numerator=round(shadow[1] * 1_000_000),
                    denominator=percent_pb2.FractionalPercent.MILLION,
                )
            ),
        )
    return action


def shadow_mutations() -> list[mutation_rules_pb2.HeaderMutation]:
    """What a mirrored copy loses and gains: no reservation (only the served request settles),
    no destination (the live version's addresses; the shadow cluster's ring picks), and
    ``x-modelfleet-shadow: 1`` so the shadow replica records it apart."""
    return [
        mutation_rules_pb2.HeaderMutation(remove=RESERVATION_HEADER),
        mutation_rules_pb2.HeaderMutation(remove=DESTINATION_HEADER),
        mutation_rules_pb2.HeaderMutation(
            append=base_pb2.HeaderValueOption(
                header=base_pb2.HeaderValue(key=SHADOW_HEADER, value="1"),
                append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
            )
        ),
    ]


def upstream_headers() -> list[base_pb2.HeaderValueOption]:
    """``UPSTREAM_HEADERS`` as response headers to add."""
    return [
        base_pb2.HeaderValueOption(
            header=base_pb2.HeaderValue(key=k, value=v),
            append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
        )
        for k, v in UPSTREAM_HEADERS.items()
    ]


def make_version_route(key: str, shadow: tuple[str, float] | None = None) -> rc.Route:
    """``x-route-version: key`` goes to ``key``'s cluster; ``shadow`` is ``(cluster, fraction
    0..1)`` of requests mirrored there."""
    return rc.Route(
        name=f"version:{key}",
        match=version_match(key),
        route=make_route_action([(key, 1)], shadow),
        response_headers_to_add=upstream_headers(),
    )


def version_targets(aliases: Sequence[AliasRoute], version_keys: Sequence[str]) -> list[str]:
    """Every ``model@version`` a request may be routed to: ``version_keys`` and each alias's live
    and canary version, in that order, each once."""
    out = list(dict.fromkeys(version_keys))
    for a in aliases:
        out += [k for k in (a.live, a.canary) if k and k not in out]
    return out


def shadows(aliases: Sequence[AliasRoute]) -> dict[str, tuple[str, float]]:
    """Live version -> ``(shadow version, fraction of requests)`` for aliases with a shadow."""
    return {a.live: (a.shadow, a.shadow_fraction) for a in aliases
            if a.shadow and a.shadow_fraction > 0}


def direct_route(
    name: str, match: rc.RouteMatch, status: int, body: sf.SubstitutionFormatString
) -> rc.Route:
    """A route ``name`` answered by Envoy itself with ``status`` and ``body``."""
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
    return direct_route("models-list", match, 200, body)


def make_error_routes() -> list[rc.Route]:
    """A version no route serves (retired, or gateway and Envoy configs out of step: 404) and an
    unknown URL (404). Placed after every version route.

    Both are 4xx on purpose: a 5xx direct response would be rewritten by the local-reply mappers.
    """
    return [
        direct_route(
            "version-unrouted",
            version_match(None),
            404,
            error_format(
                f"The model `%REQ({ROUTE_VERSION_HEADER})%` is not served here.",
                ErrorType.INVALID_REQUEST,
                "model_not_found",
                "model",
            ),
        ),
        direct_route(
            "unknown-url",
            rc.RouteMatch(prefix="/"),
            404,
            error_format(
                "Invalid URL (%REQ(:METHOD)% %REQ(:PATH)%).", ErrorType.INVALID_REQUEST, "unknown_url"
            ),
        ),
    ]


def make_route_config(
    aliases: Sequence[AliasRoute], version_keys: Sequence[str], *, name: str = ROUTE_CONFIG_NAME,
    batch: bool = True,
) -> route_pb2.RouteConfiguration:
    """The public API's routes: models list, the batch service's ``/v1/batches`` and
    ``/v1/files`` (``batch``; its cluster is in each Envoy's bootstrap), one route per version
    (see :func:`version_targets`), then errors."""
    targets = version_targets(aliases, version_keys)
    mirrors = shadows(aliases)
    names = list(dict.fromkeys([a.model for a in aliases] + list(version_keys)))
    routes = [make_models_list_route(names), *(make_batch_routes() if batch else [])]
    routes += [make_version_route(k, mirrors.get(k)) for k in targets]
    routes += make_error_routes()
    host = rc.VirtualHost(name="api", domains=["*"], routes=routes)
    return route_pb2.RouteConfiguration(name=name, virtual_hosts=[host])

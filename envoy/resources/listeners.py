"""Builders for the LDS resource: the public API listener and its HTTP connection manager.

The filter chain is ``health_check`` (Envoy answers ``/health`` itself for load-balancer and
Route53 checks), ``header_mutation`` (strip gateway-only headers), ``ext_authz`` (gateway_ext
decides: 401/403/400/404/413/429/503, or allows with ``x-route-version``) then ``router``, which
picks the route on ``x-route-version`` (see ``envoy_control.resources.ext_authz`` and
``envoy_control.resources.routes``). Without a gateway (``gateway=None``, tests of the routing layer only)
``json_to_metadata`` reads the body's ``model`` and the routes match it
(``envoy_control.resources.body_routes``).
"""

from __future__ import annotations

from envoy_control.resources.body_filter import make_body_model_filter
from envoy_control.resources.clusters import ads_config_source, seconds
from envoy_control.resources.ext_authz import DEFAULT_GATEWAY, ExtAuthzSpec, gateway_filters
from envoy_control.resources.openai_errors import make_local_reply_config
from google.protobuf import any_pb2, wrappers_pb2
from google.protobuf.message import Message

from envoy.config.accesslog.v3 import accesslog_pb2
from envoy.config.core.v3 import address_pb2, substitution_format_string_pb2
from envoy.config.listener.v3 import listener_components_pb2, listener_pb2
from envoy.config.route.v3 import route_components_pb2
from envoy.extensions.access_loggers.stream.v3 import stream_pb2
from envoy.extensions.filters.http.health_check.v3 import health_check_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.type.matcher.v3 import string_pb2

LISTENER_NAME = "modelfleet-api"
ROUTE_CONFIG_NAME = "modelfleet-api"
STREAM_IDLE_TIMEOUT_S = 300.0
ACCESS_LOG_FORMAT = (
    "[%START_TIME%] %REQ(:METHOD)% %REQ(:PATH)% route=%REQ(X-ROUTE-VERSION)% "
    "team=%REQ(X-MODELFLEET-TEAM)% tier=%REQ(X-MODELFLEET-TIER)% "
    "%RESPONSE_CODE% %RESPONSE_FLAGS% cluster=%UPSTREAM_CLUSTER% upstream=%UPSTREAM_HOST% "
    "replica=%UPSTREAM_HOST_NAME% conv=%REQ(X-CONVERSATION-ID)% %DURATION%ms\n"
)


def _pack(message: Message) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed


HEALTH_PATH = "/health"
"""Answered by Envoy itself (200, or 503 while Envoy drains) for the NLB and the Route53 health
checks, before any key is asked for."""


def make_health_filter(path: str = HEALTH_PATH) -> hcm_pb2.HttpFilter:
    """Envoy's health_check filter, not passed through: ``GET path`` is answered by Envoy, so a
    region reads healthy exactly while its Envoy serves and is not draining."""
    check = health_check_pb2.HealthCheck(
        pass_through_mode=wrappers_pb2.BoolValue(value=False),
        headers=[route_components_pb2.HeaderMatcher(
            name=":path", string_match=string_pb2.StringMatcher(exact=path))],
    )
    return hcm_pb2.HttpFilter(name="envoy.filters.http.health_check", typed_config=_pack(check))


def make_router_filter() -> hcm_pb2.HttpFilter:
    """The terminal router filter."""
    return hcm_pb2.HttpFilter(
        name="envoy.filters.http.router", typed_config=_pack(router_pb2.Router())
    )


def make_stdout_access_log() -> accesslog_pb2.AccessLog:
    """One line per request on Envoy's stdout (route, team, tier, cluster, upstream, replica,
    duration in ms)."""
    log = stream_pb2.StdoutAccessLog(
        log_format=substitution_format_string_pb2.SubstitutionFormatString(
            text_format_source={"inline_string": ACCESS_LOG_FORMAT}
        )
    )
    return accesslog_pb2.AccessLog(name="envoy.access_loggers.stdout", typed_config=_pack(log))


def make_http_connection_manager(
    route_config_name: str = ROUTE_CONFIG_NAME,
    *,
    stream_idle_timeout_s: float = STREAM_IDLE_TIMEOUT_S,
    access_log: bool = True,
    gateway: ExtAuthzSpec | None = DEFAULT_GATEWAY,
) -> hcm_pb2.HttpConnectionManager:
    """The HTTP connection manager: the ``gateway`` filters (body routing if None), routes by RDS over
    ADS, no request timeout (streams run for minutes), a stream idle timeout of
    ``stream_idle_timeout_s`` seconds."""
    return hcm_pb2.HttpConnectionManager(
        stat_prefix="api",
        codec_type=hcm_pb2.HttpConnectionManager.AUTO,
        rds=hcm_pb2.Rds(config_source=ads_config_source(), route_config_name=route_config_name),
        http_filters=[
            make_health_filter(),
            *(gateway_filters(gateway) if gateway else [make_body_model_filter()]),
            make_router_filter(),
        ],
        stream_idle_timeout=seconds(stream_idle_timeout_s),
        request_timeout=seconds(0),
        normalize_path=wrappers_pb2.BoolValue(value=True),
        merge_slashes=True,
        local_reply_config=make_local_reply_config(),
        access_log=[make_stdout_access_log()] if access_log else [],
    )


def make_listener(
    host: str,
    port: int,
    *,
    name: str = LISTENER_NAME,
    route_config_name: str = ROUTE_CONFIG_NAME,
    access_log: bool = True,
    gateway: ExtAuthzSpec | None = DEFAULT_GATEWAY,
) -> listener_pb2.Listener:
    """The public API listener on ``host:port`` (TCP port), every request checked by ``gateway``
    (None: no check, routed on the body's ``model``; tests of the routing layer only).

    ``enable_reuse_port`` lets several Envoys on one machine (tests, the benchmark) bind the same
    snapshot's port; in a cluster each Envoy pod has its own network namespace anyway.
    """
    hcm = make_http_connection_manager(route_config_name, access_log=access_log, gateway=gateway)
    return listener_pb2.Listener(
        name=name,
        address=address_pb2.Address(
            socket_address=address_pb2.SocketAddress(address=host, port_value=port)
        ),
        enable_reuse_port=wrappers_pb2.BoolValue(value=True),
        filter_chains=[
            listener_components_pb2.FilterChain(
                filters=[
                    listener_components_pb2.Filter(
                        name="envoy.filters.network.http_connection_manager",
                        typed_config=_pack(hcm),
                    )
                ]
            )
        ],
    )

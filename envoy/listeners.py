"""Builders for the LDS resource: the public API listener and its HTTP connection manager.

The filter chain is ``json_to_metadata`` then ``router``. ``json_to_metadata`` buffers the request
body, parses it as JSON and writes its ``model`` field into the dynamic metadata namespace
``modelfleet.request`` (key ``model``), or a sentinel when the field is missing or the body is not
JSON. It clears the route cache when it writes metadata, so the router picks the route after the
body has been parsed: routes then match on that metadata (see ``envoy_control.routes``).
"""

from __future__ import annotations

from envoy_control.clusters import ads_config_source, seconds
from envoy_control.openai_errors import make_local_reply_config
from google.protobuf import any_pb2, struct_pb2, wrappers_pb2
from google.protobuf.message import Message

from envoy.config.accesslog.v3 import accesslog_pb2
from envoy.config.core.v3 import address_pb2, substitution_format_string_pb2
from envoy.config.listener.v3 import listener_components_pb2, listener_pb2
from envoy.extensions.access_loggers.stream.v3 import stream_pb2
from envoy.extensions.filters.http.json_to_metadata.v3 import json_to_metadata_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.type.matcher.v3 import regex_pb2

LISTENER_NAME = "modelfleet-api"
ROUTE_CONFIG_NAME = "modelfleet-api"
REQUEST_METADATA = "modelfleet.request"
"""Dynamic-metadata namespace written by ``json_to_metadata`` (key ``model``)."""
MODEL_MISSING = "__modelfleet_model_missing__"
"""Metadata value when the JSON body has no ``model`` field."""
BODY_INVALID = "__modelfleet_body_invalid__"
"""Metadata value when the body is not JSON (or has a non-JSON content type)."""
JSON_CONTENT_TYPE = r"(?i)application/json *(;.*)?"
STREAM_IDLE_TIMEOUT_S = 300.0
ACCESS_LOG_FORMAT = (
    "[%START_TIME%] %REQ(:METHOD)% %REQ(:PATH)% model=%DYNAMIC_METADATA(modelfleet.request:model)% "
    "%RESPONSE_CODE% %RESPONSE_FLAGS% cluster=%UPSTREAM_CLUSTER% upstream=%UPSTREAM_HOST% "
    "replica=%UPSTREAM_HOST_NAME% conv=%REQ(X-CONVERSATION-ID)% %DURATION%ms\n"
)


def _pack(message: Message) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed


def make_body_model_filter() -> hcm_pb2.HttpFilter:
    """``json_to_metadata``: the body's ``model`` field into ``modelfleet.request:model``."""

    def pair(value: str | None) -> json_to_metadata_pb2.JsonToMetadata.KeyValuePair:
        kv = json_to_metadata_pb2.JsonToMetadata.KeyValuePair(
            metadata_namespace=REQUEST_METADATA, key="model"
        )
        if value is None:
            kv.type = json_to_metadata_pb2.JsonToMetadata.STRING
        else:
            kv.value.CopyFrom(struct_pb2.Value(string_value=value))
        return kv

    rule = json_to_metadata_pb2.JsonToMetadata.Rule(
        selectors=[json_to_metadata_pb2.JsonToMetadata.Selector(key="model")],
        on_present=pair(None),
        on_missing=pair(MODEL_MISSING),
        on_error=pair(BODY_INVALID),
    )
    config = json_to_metadata_pb2.JsonToMetadata(
        request_rules=json_to_metadata_pb2.JsonToMetadata.MatchRules(
            rules=[rule],
            allow_empty_content_type=True,
            allow_content_types_regex=regex_pb2.RegexMatcher(regex=JSON_CONTENT_TYPE),
        )
    )
    return hcm_pb2.HttpFilter(
        name="envoy.filters.http.json_to_metadata", typed_config=_pack(config)
    )


def make_router_filter() -> hcm_pb2.HttpFilter:
    """The terminal router filter."""
    return hcm_pb2.HttpFilter(
        name="envoy.filters.http.router", typed_config=_pack(router_pb2.Router())
    )


def make_stdout_access_log() -> accesslog_pb2.AccessLog:
    """One line per request on Envoy's stdout (model, cluster, upstream, replica, duration in ms)."""
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
) -> hcm_pb2.HttpConnectionManager:
    """The HTTP connection manager: routes by RDS over ADS, no request timeout (streams run for
    minutes), a stream idle timeout of ``stream_idle_timeout_s`` seconds."""
    return hcm_pb2.HttpConnectionManager(
        stat_prefix="api",
        codec_type=hcm_pb2.HttpConnectionManager.AUTO,
        rds=hcm_pb2.Rds(config_source=ads_config_source(), route_config_name=route_config_name),
        http_filters=[make_body_model_filter(), make_router_filter()],
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
) -> listener_pb2.Listener:
    """The public API listener on ``host:port`` (TCP port).

    ``enable_reuse_port`` lets several Envoys on one machine (tests, the benchmark) bind the same
    snapshot's port; in a cluster each Envoy pod has its own network namespace anyway.
    """
    hcm = make_http_connection_manager(route_config_name, access_log=access_log)
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

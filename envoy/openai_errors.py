"""OpenAI-shaped error bodies that Envoy itself renders: ``{"error": {message, type, param, code}}``.

Used by the routes' ``direct_response`` (unknown model, body not JSON, unknown URL) and by the HTTP
connection manager's ``local_reply_config`` for the errors Envoy raises on its own (no healthy
replica, upstream reset, body too large), so a client never sees Envoy's plain-text replies.
Messages are Envoy format strings: ``%DYNAMIC_METADATA(...)%`` and friends are substituted and
JSON-escaped by Envoy's JSON formatter.
"""

from __future__ import annotations

from google.protobuf import struct_pb2

from envoy.config.accesslog.v3 import accesslog_pb2
from envoy.config.core.v3 import base_pb2, substitution_format_string_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)

JSON = "application/json"


def error_format(
    message: str, error_type: str, code: str | None, param: str | None = None
) -> substitution_format_string_pb2.SubstitutionFormatString:
    """A JSON body format ``{"error": {"message", "type", "param", "code"}}``.

    ``message`` may hold Envoy format commands; ``param``/``code`` of None become JSON null.
    """
    body = struct_pb2.Struct()
    error = body.get_or_create_struct("error")
    error["message"] = message
    error["type"] = error_type
    error["param"] = param
    error["code"] = code
    return substitution_format_string_pb2.SubstitutionFormatString(
        json_format=body, content_type=JSON
    )


def json_body_format(text: str) -> substitution_format_string_pb2.SubstitutionFormatString:
    """A fixed JSON document ``text`` served as ``application/json`` (no ``%`` allowed)."""
    if "%" in text:
        raise ValueError("a fixed JSON body must not contain '%' (Envoy format commands)")
    return substitution_format_string_pb2.SubstitutionFormatString(
        text_format_source=base_pb2.DataSource(inline_string=text), content_type=JSON
    )


def _status_filter(op: int, status: int) -> accesslog_pb2.AccessLogFilter:
    return accesslog_pb2.AccessLogFilter(
        status_code_filter=accesslog_pb2.StatusCodeFilter(
            comparison=accesslog_pb2.ComparisonFilter(
                op=op, value=base_pb2.RuntimeUInt32(default_value=status, runtime_key="")
            )
        )
    )


def make_local_reply_config() -> hcm_pb2.LocalReplyConfig:
    """Rewrite Envoy's own error replies (status >= 500, 413, 408) as OpenAI-shaped JSON.

    Direct responses of routes are local replies too, but all of ours are 4xx other than 408/413
    and already JSON, so the mappers leave them alone.
    """
    detail = "%LOCAL_REPLY_BODY% (%RESPONSE_CODE_DETAILS%)"
    mappers = [
        hcm_pb2.ResponseMapper(
            filter=_status_filter(accesslog_pb2.ComparisonFilter.GE, 500),
            body_format_override=error_format(detail, "server_error", "upstream_unavailable"),
        ),
        hcm_pb2.ResponseMapper(
            filter=_status_filter(accesslog_pb2.ComparisonFilter.EQ, 413),
            body_format_override=error_format(detail, "invalid_request_error", "request_too_large"),
        ),
        hcm_pb2.ResponseMapper(
            filter=_status_filter(accesslog_pb2.ComparisonFilter.EQ, 408),
            body_format_override=error_format(detail, "invalid_request_error", "request_timeout"),
        ),
    ]
    return hcm_pb2.LocalReplyConfig(mappers=mappers)

"""OpenAI-shaped error bodies that Envoy itself renders: ``{"error": {message, type, param, code}}``.

Used by the routes' ``direct_response`` (unknown URL) and by the HTTP connection manager's
``local_reply_config`` for the errors Envoy raises on its own (no healthy replica, upstream reset,
body too large, gateway unreachable), so a client never sees Envoy's plain-text replies. The
gateway's own refusals (ext_authz denials) already carry OpenAI JSON and pass unchanged, except
that its 503 marker status (``modelfleet.contract.headers.SHED_STATUS``) is turned back into 503.
Messages are Envoy format strings: ``%DYNAMIC_METADATA(...)%`` and friends are substituted and
JSON-escaped by Envoy's JSON formatter.
"""

from __future__ import annotations

from google.protobuf import struct_pb2, wrappers_pb2

from envoy.config.accesslog.v3 import accesslog_pb2
from envoy.config.core.v3 import base_pb2, substitution_format_string_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from modelfleet.contract.errors import ErrorType, error_body
from modelfleet.contract.headers import SHED_STATUS

JSON = "application/json"


def error_format(
    message: str, error_type: ErrorType, code: str | None, param: str | None = None
) -> substitution_format_string_pb2.SubstitutionFormatString:
    """A JSON body format of :func:`modelfleet.contract.errors.error_body`.

    ``message`` may hold Envoy format commands; ``param``/``code`` of None become JSON null.
    """
    body = struct_pb2.Struct()
    body.update(error_body(message, error_type, code, param))
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


def _ext_authz_filter(op: int, status: int) -> accesslog_pb2.AccessLogFilter:
    """A local reply of the ext_authz filter (response flag UAEX) whose status compares."""
    return accesslog_pb2.AccessLogFilter(
        and_filter=accesslog_pb2.AndFilter(
            filters=[
                _status_filter(op, status),
                accesslog_pb2.AccessLogFilter(
                    response_flag_filter=accesslog_pb2.ResponseFlagFilter(flags=["UAEX"])
                ),
            ]
        )
    )


def make_local_reply_config() -> hcm_pb2.LocalReplyConfig:
    """Rewrite Envoy's own error replies (status >= 500, 413, 408) as OpenAI-shaped JSON, and the
    gateway's 503 marker (``SHED_STATUS``) as 503 with its body and headers kept.

    The first matching mapper wins. Direct responses of routes are local replies too, but all of
    ours are 4xx other than 408/413 and already JSON, so the mappers leave them alone; so are the
    gateway's 4xx refusals.
    """
    detail = "%LOCAL_REPLY_BODY% (%RESPONSE_CODE_DETAILS%)"
    eq = accesslog_pb2.ComparisonFilter.EQ
    mappers = [
        hcm_pb2.ResponseMapper(
            filter=_ext_authz_filter(eq, SHED_STATUS),
            status_code=wrappers_pb2.UInt32Value(value=503),
        ),
        hcm_pb2.ResponseMapper(  # the gateway failed, timed out or is unreachable
            filter=_ext_authz_filter(eq, 503),
            body_format_override=error_format(
                "The gateway could not check this request; retry shortly "
                "(%RESPONSE_CODE_DETAILS%).",
                ErrorType.SERVER,
                "gateway_unavailable",
            ),
            headers_to_add=[
                base_pb2.HeaderValueOption(
                    header=base_pb2.HeaderValue(key="retry-after", value="1"),
                    append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
                )
            ],
        ),
        hcm_pb2.ResponseMapper(
            filter=_status_filter(accesslog_pb2.ComparisonFilter.GE, 500),
            body_format_override=error_format(detail, ErrorType.SERVER, "upstream_unavailable"),
        ),
        hcm_pb2.ResponseMapper(
            filter=_status_filter(accesslog_pb2.ComparisonFilter.EQ, 413),
            body_format_override=error_format(detail, ErrorType.INVALID_REQUEST, "request_too_large"),
        ),
        hcm_pb2.ResponseMapper(
            filter=_status_filter(accesslog_pb2.ComparisonFilter.EQ, 408),
            body_format_override=error_format(detail, ErrorType.INVALID_REQUEST, "request_timeout"),
        ),
    ]
    return hcm_pb2.LocalReplyConfig(mappers=mappers)

"""OpenAI-shaped errors that gateway_ext answers with: ``{"error": {message, type, param, code}}``.

Every refusal of the gateway is an :class:`ApiError` value returned by a policy function, never an
exception; the service turns it into a response at the edge. ``type`` is OpenAI's error type,
``code`` a short machine-readable string (as OpenAI and ``envoy_control.resources.openai_errors`` use it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class ErrorType(StrEnum):
    """OpenAI's ``error.type`` values that the gateway uses."""

    INVALID_REQUEST = "invalid_request_error"
    AUTHENTICATION = "authentication_error"
    PERMISSION = "permission_error"
    NOT_FOUND = "not_found_error"
    RATE_LIMIT = "rate_limit_error"
    SERVER = "server_error"


def error_body(message: str, error_type: ErrorType, code: str | None,
               param: str | None = None) -> dict[str, Any]:
    """OpenAI's error body ``{"error": {"message", "type", "param", "code"}}``: the one shape every
    refusal of the platform has, whether gateway_ext, the batch service or Envoy itself renders it
    (Envoy's local replies pass ``message`` with its format commands)."""
    return {"error": {"message": message, "type": str(error_type), "param": param, "code": code}}


@dataclass(frozen=True, slots=True)
class ApiError:
    """A refusal: HTTP ``status``, OpenAI ``type``, message, offending ``param`` and ``code``.

    ``headers`` are extra response headers (``Retry-After``, ``x-ratelimit-*``).
    """

    status: int
    type: ErrorType
    message: str
    code: str
    param: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def body(self) -> dict[str, Any]:
        """The JSON body ``{"error": {"message", "type", "param", "code"}}``."""
        return error_body(self.message, self.type, self.code, self.param)

    def with_headers(self, headers: dict[str, str]) -> ApiError:
        """This error with ``headers`` added (later keys win)."""
        return ApiError(self.status, self.type, self.message, self.code, self.param,
                        {**self.headers, **headers})


def invalid(message: str, param: str | None = None, code: str = "invalid_request") -> ApiError:
    """A 400 ``invalid_request_error``."""
    return ApiError(400, ErrorType.INVALID_REQUEST, message, code, param)


def unauthenticated(message: str, code: str = "invalid_api_key") -> ApiError:
    """A 401 ``authentication_error``."""
    return ApiError(401, ErrorType.AUTHENTICATION, message, code)


def forbidden(message: str, param: str | None = None, code: str = "model_not_allowed") -> ApiError:
    """A 403 ``permission_error``."""
    return ApiError(403, ErrorType.PERMISSION, message, code, param)


def not_found(message: str, param: str | None = "model", code: str = "model_not_found") -> ApiError:
    """A 404 ``not_found_error``."""
    return ApiError(404, ErrorType.NOT_FOUND, message, code, param)


def too_large(limit_bytes: int, size_bytes: int) -> ApiError:
    """A 413 for a body of ``size_bytes`` above ``limit_bytes`` (bytes)."""
    return ApiError(413, ErrorType.INVALID_REQUEST,
                    f"Request body is {size_bytes} bytes; the limit is {limit_bytes} bytes.",
                    "request_too_large")


def rate_limited(message: str, code: str = "rate_limit_exceeded") -> ApiError:
    """A 429 ``rate_limit_error`` (the caller adds ``Retry-After``)."""
    return ApiError(429, ErrorType.RATE_LIMIT, message, code)


def shed(message: str, code: str = "pool_overloaded") -> ApiError:
    """A 503 ``server_error`` for a request shed under overload (the caller adds ``Retry-After``)."""
    return ApiError(503, ErrorType.SERVER, message, code)

"""Sending one batch line through the platform's public API (Envoy, then gateway_ext's checks),
as the team, at a tier (I/O edge), and turning the answer into the line's output line.

The request is the line's body as JSON to ``<api base>/chat/completions`` with
``Authorization: Bearer <team key>`` and ``x-priority: batch`` (or ``standard`` once a batch's
urgency is raised). Going through the front door means the gateway meters it as any request,
charges the team's token bucket, and admits it only on idle capacity (batch tier).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from batch.models import error_line, response_line
from batch.store import PendingLine
from modelfleet.contract.headers import PRIORITY_HEADER, REQUEST_ID_HEADER

CHAT_PATH = "chat/completions"
"""Relative to the API base URL (``http://envoy:8080/v1``)."""


@dataclass(frozen=True, slots=True)
class Attempt:
    """One try: the HTTP status, headers (lower-case names) and JSON body (the text when not
    JSON), or, with no answer (refused, reset, timed out), ``status_code`` None and ``error``."""

    status_code: int | None
    headers: dict[str, str]
    body: Any = None
    error: str | None = None
    connected: bool = True
    """False when no connection was made (refused, DNS, connect timeout): nothing was sent."""


async def send_line(client: httpx.AsyncClient, key: str, tier: str,
                    body: dict[str, Any]) -> Attempt:
    """POST ``body`` as the team whose ``key`` it is, at ``tier``; never raises for HTTP."""
    headers = {"authorization": f"Bearer {key}", PRIORITY_HEADER: tier}
    try:
        response = await client.post(CHAT_PATH, json=body, headers=headers)
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
        return Attempt(None, {}, None, exc.__class__.__name__, connected=False)
    except httpx.HTTPError as exc:
        return Attempt(None, {}, None, exc.__class__.__name__)
    try:
        parsed: Any = response.json()
    except ValueError:
        parsed = response.text
    return Attempt(response.status_code, {k.lower(): v for k, v in response.headers.items()},
                   parsed)


def request_id_of(attempt: Attempt) -> str | None:
    """The answer's id (``chatcmpl-…``, carrying Envoy's ``x-request-id``), else that header."""
    if isinstance(attempt.body, dict) and isinstance(attempt.body.get("id"), str):
        return str(attempt.body["id"])
    return attempt.headers.get(REQUEST_ID_HEADER)


def output_of(batch_id: str, line: PendingLine, attempt: Attempt, attempts: int) -> dict[str, Any]:
    """The output line for ``line``'s last ``attempt`` (after ``attempts`` tries): its response,
    or an error line when there never was an answer."""
    if attempt.status_code is None:
        return error_line(batch_id, line.line_no, line.custom_id, "request_failed",
                          f"No answer after {attempts} attempts ({attempt.error}).")
    return response_line(batch_id, line.line_no, line.custom_id, attempt.status_code,
                         request_id_of(attempt), attempt.body)

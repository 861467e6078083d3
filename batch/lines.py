"""The batch input file (pure): OpenAI batch request lines to the requests a worker sends, or
per-line errors; whole-file problems fail the batch.

Each non-blank line is one JSON object ``{"custom_id": str, "method": "POST", "url":
"/v1/chat/completions", "body": {...}}``. A bad line (not JSON, no ``custom_id``, a
``custom_id`` seen before, another method or URL, no body object, a ``model`` of another model,
``stream: true``, a body over the gateway's 1 MiB) becomes an error line of the output; the
others run. The body's ``model`` defaults to the batch's; ``model@vN`` of the batch's model is
allowed. Anything the gateway checks itself (messages, ``max_tokens``) is left to it: its 400 is
the line's response. Lines are numbered from 1 as in the file (blank lines keep their number).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from batch.models import CHAT_ENDPOINT
from modelfleet.contract.headers import MAX_BODY_BYTES

MAX_LINES = 50_000
"""Most requests in one batch (OpenAI's limit)."""
MAX_CUSTOM_ID_CHARS = 512


@dataclass(frozen=True, slots=True)
class LineError:
    """Why a line cannot run: a short ``code`` and a message that never quotes the line."""

    code: str
    message: str


@dataclass(frozen=True, slots=True)
class ParsedLine:
    """Line ``line_no`` (1-based): the ``body`` to send, or the ``error`` that stops it."""

    line_no: int
    custom_id: str | None
    body: dict[str, Any] | None
    error: LineError | None = None


@dataclass(frozen=True, slots=True)
class FileError:
    """The input as a whole cannot be used: the batch fails with this error."""

    code: str
    message: str


def base_model(model: str) -> str:
    """``chat-7b`` for ``chat-7b`` and ``chat-7b@v13``."""
    return model.partition("@")[0]


def _check(obj: Any, model: str, seen: set[str]) -> tuple[str | None, dict[str, Any] | LineError]:
    """The custom id and the body to send, or the custom id (if any) and the line's error."""
    if not isinstance(obj, dict):
        return None, LineError("invalid_line", "A line must be a JSON object.")
    cid = obj.get("custom_id")
    if not isinstance(cid, str) or not cid or len(cid) > MAX_CUSTOM_ID_CHARS:
        return None, LineError("invalid_custom_id", f"custom_id must be a string of 1 to "
                               f"{MAX_CUSTOM_ID_CHARS} characters.")
    if cid in seen:
        return cid, LineError("duplicate_custom_id", "custom_id is used by an earlier line.")
    seen.add(cid)
    if obj.get("method", "POST") != "POST":
        return cid, LineError("invalid_method", "method must be POST.")
    if obj.get("url", CHAT_ENDPOINT) != CHAT_ENDPOINT:
        return cid, LineError("invalid_url", f"url must be {CHAT_ENDPOINT}.")
    body = obj.get("body")
    if not isinstance(body, dict):
        return cid, LineError("invalid_body", "body must be a JSON object.")
    line_model = body.get("model", model)
    if not isinstance(line_model, str) or base_model(line_model) != base_model(model):
        return cid, LineError("model_mismatch", f"body.model must be the batch's model "
                              f"'{model}' (or one of its versions).")
    if body.get("stream") is True:
        return cid, LineError("stream_unsupported", "stream is not supported in a batch.")
    body = {**body, "model": line_model}
    body.pop("stream", None)
    if len(json.dumps(body).encode()) > MAX_BODY_BYTES:
        return cid, LineError("body_too_large", f"body is larger than {MAX_BODY_BYTES} bytes.")
    return cid, body


def parse_input(data: bytes, model: str, max_lines: int = MAX_LINES) -> list[ParsedLine] | FileError:
    """Every non-blank line of the input file ``data`` for a batch of ``model``, in file order,
    or the :class:`FileError` that fails the batch (no lines, more than ``max_lines``)."""
    out: list[ParsedLine] = []
    seen: set[str] = set()
    for index, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        if len(out) >= max_lines:
            return FileError("too_many_lines", f"The input has more than {max_lines} lines.")
        try:
            obj = json.loads(raw)
        except (UnicodeDecodeError, ValueError):
            out.append(ParsedLine(index, None, None,
                                  LineError("invalid_json", "The line is not valid JSON.")))
            continue
        cid, checked = _check(obj, model, seen)
        if isinstance(checked, LineError):
            out.append(ParsedLine(index, cid, None, checked))
        else:
            out.append(ParsedLine(index, cid, checked))
    if not out:
        return FileError("empty_file", "The input file has no request lines.")
    return out


def first_model(data: bytes) -> str | None:
    """The ``body.model`` of the first line that names one (OpenAI's batch create has no
    ``model``: a batch made from an uploaded file takes it from its lines), else None."""
    for raw in data.splitlines():
        try:
            obj = json.loads(raw)
        except ValueError:
            continue
        body = obj.get("body") if isinstance(obj, dict) else None
        model = body.get("model") if isinstance(body, dict) else None
        if isinstance(model, str) and model:
            return model
    return None

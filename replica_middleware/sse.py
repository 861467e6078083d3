"""Server-sent events of a chat stream: splitting, classifying, and the middleware's own events
(pure).

A stream the middleware sends ends in exactly one of two ways:

* **normal end**: the final event, then ``data: [DONE]``. The final event is an OpenAI
  ``chat.completion.chunk`` with empty ``choices`` (the shape of OpenAI's usage chunk, so SDKs
  parse it) carrying ``usage {prompt_tokens, cached_tokens, completion_tokens, total_tokens,
  prompt_tokens_details {cached_tokens}}`` and top-level ``model_version``, ``region`` and
  ``replica_id``. It replaces the engine's own usage chunk; it is the only event with empty
  ``choices`` and a ``replica_id``;
* **cut**: ``data: {"error": {"message", "type": "server_error", "param": null, "code":
  "stream_interrupted"}, "model_version", "region", "replica_id"}`` and no ``[DONE]`` (OpenAI's
  SDKs raise ``APIError`` on an ``error`` event). A stream that simply stops, without either,
  was cut below the replica (the process died, the network broke): clients treat a missing
  ``[DONE]`` as a cut too.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from enum import Enum
from typing import Any

DONE = "[DONE]"
INTERRUPTED = "stream_interrupted"
_EMPTY_CHOICES = re.compile(r'"choices"\s*:\s*\[\s*\]')


class Kind(Enum):
    """What one event is."""

    CHUNK = "chunk"      # a completion chunk with choices: the role, a token, the finish
    USAGE = "usage"      # the engine's usage chunk (empty choices)
    ERROR = "error"      # an error object instead of a chunk
    DONE = "done"        # data: [DONE]
    OTHER = "other"      # comments, keep-alives, anything else: passed on as it is


@dataclass(frozen=True)
class Event:
    """One event: its raw text (with the blank line ending it), its kind, its data."""

    raw: bytes
    kind: Kind
    data: str


class SseSplitter:
    """Cuts a byte stream into whole events (``\\n\\n``-terminated); keeps a partial tail."""

    def __init__(self) -> None:
        self._tail = b""

    def feed(self, chunk: bytes) -> list[Event]:
        """The events completed by ``chunk``."""
        buf = self._tail + chunk
        parts = buf.replace(b"\r\n", b"\n").split(b"\n\n")
        self._tail = parts.pop()
        return [classify(p + b"\n\n") for p in parts if p.strip()]

    def rest(self) -> bytes:
        """What never completed an event (a stream cut mid-event)."""
        tail, self._tail = self._tail, b""
        return tail


def event_data(raw: bytes) -> str:
    """The ``data:`` lines of one event, joined by newlines."""
    lines = raw.decode("utf-8", "replace").split("\n")
    return "\n".join(line[5:].removeprefix(" ") for line in lines if line.startswith("data:"))


def classify(raw: bytes) -> Event:
    """The kind of one event. Chunks are recognised without parsing their JSON."""
    data = event_data(raw)
    if data.strip() == DONE:
        return Event(raw, Kind.DONE, data)
    if '"choices"' in data:
        return Event(raw, Kind.USAGE if _EMPTY_CHOICES.search(data) else Kind.CHUNK, data)
    try:
        obj = json.loads(data) if data else None
    except ValueError:
        obj = None
    if isinstance(obj, dict) and ("error" in obj or obj.get("object") == "error"):
        return Event(raw, Kind.ERROR, data)
    return Event(raw, Kind.OTHER, data)


def is_role_chunk(data: str) -> bool:
    """The first chunk (the assistant role, no text) is not an output token."""
    return '"role"' in data


def encode(obj: Any) -> bytes:
    """One ``data:`` event of ``obj`` (compact JSON)."""
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


DONE_EVENT = b"data: [DONE]\n\n"


@dataclass(frozen=True)
class Identity:
    """Who served: the version (``v13``), region and replica id."""

    model_version: str
    region: str
    replica_id: str

    def fields(self) -> dict[str, str]:
        """The three top-level fields of answers."""
        return {"model_version": self.model_version, "region": self.region,
                "replica_id": self.replica_id}


def usage_object(prompt: int, cached: int, completion: int) -> dict[str, Any]:
    """``usage`` with ``cached_tokens`` at the top and in ``prompt_tokens_details`` (tokens)."""
    return {"prompt_tokens": prompt, "cached_tokens": cached, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def usage_of(obj: Any) -> tuple[int, int, int] | None:
    """``(prompt, cached, completion)`` tokens of an OpenAI ``usage`` object, None if absent."""
    if not isinstance(obj, dict):
        return None
    details = obj.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    cached = cached if isinstance(cached, int) else obj.get("cached_tokens", 0)
    prompt, completion = obj.get("prompt_tokens"), obj.get("completion_tokens")
    if not isinstance(prompt, int) or not isinstance(completion, int):
        return None
    return prompt, cached if isinstance(cached, int) else 0, completion


def final_event(head: dict[str, Any], usage: tuple[int, int, int], who: Identity) -> bytes:
    """The final event: ``head`` (``id``, ``created``, ``model`` of the stream's chunks), empty
    choices, the usage (tokens) and who served."""
    obj = {"id": head.get("id", ""), "object": "chat.completion.chunk",
           "created": head.get("created", 0), "model": head.get("model", ""), "choices": [],
           "usage": usage_object(*usage), **who.fields()}
    return encode(obj)


def error_event(message: str, who: Identity) -> bytes:
    """The event that ends a cut stream (no ``[DONE]`` follows)."""
    error = {"message": message, "type": "server_error", "param": None, "code": INTERRUPTED}
    return encode({"error": error, **who.fields()})


def unavailable_body(message: str) -> bytes:
    """The JSON of a 503 sent before anything reached the client (Envoy retries it)."""
    error = {"message": message, "type": "server_error", "param": None, "code": 503}
    return json.dumps({"error": error}, separators=(",", ":")).encode()


def augment_completion(body: bytes, who: Identity) -> tuple[bytes, tuple[int, int, int] | None]:
    """A non-streamed completion with ``usage.cached_tokens`` and who served added; and its
    usage. An unparseable body comes back as it is."""
    try:
        obj = json.loads(body)
    except ValueError:
        return body, None
    if not isinstance(obj, dict):
        return body, None
    usage = usage_of(obj.get("usage"))
    if usage is not None:
        obj["usage"] = {**obj["usage"], "cached_tokens": usage[1]}
    obj.update(who.fields())
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode(), usage

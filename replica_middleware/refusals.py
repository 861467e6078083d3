"""Refusal detection on an answer's opening text (pure), for the rollout guard's refusal rate.

A model that refuses says so at once ("I'm sorry, but I can't help with that."), so the
middleware looks only at the answer's opening: the first :data:`OPENING_CHARS` characters of
the assistant's text, lower-cased, curly apostrophes made straight and runs of white space
made one space. The answer is a refusal when that opening contains one of :data:`PHRASES`.
The list is short on purpose (a phrase that also opens helpful answers would make every
version look alike); it works on any engine's output, real vLLM included, because it reads
the text the client gets.

The text is read from the response bytes as the middleware passes them on
(:class:`OpeningReader`): a JSON completion's ``choices[0].message.content``, or a stream's
``choices[0].delta.content`` pieces, reading at most :data:`MAX_BYTES` of the response.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

OPENING_CHARS = 160
"""How much of the answer's start is read (characters)."""
MAX_BYTES = 32_768
"""How much of the response body is kept to find the opening (bytes)."""
PHRASES = (
    "i'm sorry, but i can",
    "i am sorry, but i can",
    "sorry, i can't",
    "i can't help with",
    "i cannot help with",
    "i can't assist with",
    "i cannot assist with",
    "i can't provide",
    "i cannot provide",
    "i'm unable to",
    "i am unable to",
    "i'm not able to",
    "i won't be able to",
    "as an ai language model",
)
"""Lower-case phrases whose presence in the opening marks a refusal."""

_SPACE = re.compile(r"\s+")


def normalise(text: str) -> str:
    """``text`` lower-cased, curly apostrophes straightened, white space runs as one space."""
    return _SPACE.sub(" ", text.replace("\u2019", "'").replace("\u2018", "'").lower()).strip()


def is_refusal(opening: str) -> bool:
    """Whether the answer opening with ``opening`` refuses (see the module docstring)."""
    head = normalise(opening)[:OPENING_CHARS]
    return any(p in head for p in PHRASES)


def _content(obj: object, key: str) -> str:
    if not isinstance(obj, dict):
        return ""
    choices = obj.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return ""
    part = choices[0].get(key)
    text = part.get("content") if isinstance(part, dict) else None
    return text if isinstance(text, str) else ""


def opening_text(body: bytes, stream: bool) -> str:
    """The answer's text found in the first bytes of a response ``body`` (a JSON completion, or
    an event stream when ``stream``), up to about :data:`OPENING_CHARS` characters."""
    if not stream:
        try:
            return _content(json.loads(body), "message")[:OPENING_CHARS]
        except ValueError:
            return ""
    out = ""
    for line in body.decode("utf-8", "replace").splitlines():
        if not line.startswith("data:") or line[5:].strip() == "[DONE]":
            continue
        try:
            out += _content(json.loads(line[5:]), "delta")
        except ValueError:
            continue  # a line cut at MAX_BYTES
        if len(out) >= OPENING_CHARS:
            break
    return out[:OPENING_CHARS]


class OpeningReader:
    """Keeps the first :data:`MAX_BYTES` of one response as it is sent (ASGI messages)."""

    def __init__(self) -> None:
        self.stream = False
        self.status = 0
        self._body = bytearray()

    def feed(self, message: Mapping[str, Any]) -> None:
        """One ASGI ``http.response.*`` message of the response."""
        if message.get("type") == "http.response.start":
            status = message.get("status")
            self.status = status if isinstance(status, int) else 0
            headers = message.get("headers")
            for k, v in headers if isinstance(headers, list) else ():
                if k.lower() == b"content-type":
                    self.stream = v.startswith(b"text/event-stream")
        elif message.get("type") == "http.response.body" and len(self._body) < MAX_BYTES:
            body = message.get("body")
            if isinstance(body, bytes | bytearray):
                self._body += body[: MAX_BYTES - len(self._body)]

    def refused(self) -> bool:
        """Whether a successful response's answer opens with a refusal."""
        return self.status == 200 and is_refusal(opening_text(bytes(self._body), self.stream))

"""What a replica holds, as its middleware sees it (pure): tokens in flight, queue depth, running.

The middleware sits in front of the engine, so it knows each request's body and the events it
streams, not the engine's plan:

* **prompt tokens**: estimated at arrival from the messages with the simulated tokenizer and
  ChatML template (:mod:`modelfleet.contract.tokens`): exact for the simulated replica and what gateway_ext
  estimates too; for a real vLLM tokenizer a close estimate (word-level counting is within a
  few percent of BPE on English chat). The engine's exact count arrives with the final usage.
* **remaining output**: ``max_tokens`` (or ``max_completion_tokens``; absent: the replica's
  ``default_max_tokens``) minus the chunks streamed so far, never below 0. Real vLLM does not
  say how long an answer will be, so this is an upper bound, the same one gateway_ext reserves
  (prompt + max_tokens), so both count in one unit.
* **queue depth**: requests held that have not produced their first token (waiting or in
  prefill); **running**: requests streaming. Counted here rather than scraped from the
  engine's ``vllm:num_requests_waiting``: exact at every beat, and the same for any engine.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from modelfleet.contract import tokens


@dataclass(frozen=True)
class RequestShape:
    """What a chat body says about its cost: ``prompt_tokens`` (estimate) and ``max_tokens``
    (tokens), whether it streams and whether the client asked for the usage chunk."""

    prompt_tokens: int
    max_tokens: int
    stream: bool
    include_usage: bool


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p["text"] for p in content
                         if isinstance(p, Mapping) and p.get("type") == "text"
                         and isinstance(p.get("text"), str))
    return ""


def prompt_estimate(messages: Any) -> int:
    """Prompt tokens of ``messages`` (the body's list) through the simulated ChatML template."""
    if not isinstance(messages, list):
        return 0
    pairs = [(str(m.get("role", "")), _text(m.get("content")))
             for m in messages if isinstance(m, Mapping)]
    return tokens.count(tokens.render_chat(pairs))


def request_shape(body: Mapping[str, Any], default_max_tokens: int) -> RequestShape:
    """The :class:`RequestShape` of a chat-completions body (already decoded JSON)."""
    requested = body.get("max_completion_tokens")
    if not isinstance(requested, int) or isinstance(requested, bool):
        requested = body.get("max_tokens")
    max_tokens = requested if isinstance(requested, int) and not isinstance(requested, bool) \
        and requested > 0 else default_max_tokens
    options = body.get("stream_options")
    include_usage = isinstance(options, Mapping) and options.get("include_usage", True) is True
    return RequestShape(prompt_estimate(body.get("messages")), max_tokens,
                        body.get("stream") is True, include_usage)


@dataclass
class Held:
    """One request the replica holds: ``streamed`` chunks so far, ``started`` once the first
    token is out."""

    prompt_tokens: int
    max_tokens: int
    streamed: int = 0
    started: bool = False

    @property
    def tokens_in_flight(self) -> int:
        """Prompt plus remaining output (tokens)."""
        return self.prompt_tokens + max(0, self.max_tokens - self.streamed)


@dataclass(frozen=True)
class Load:
    """The figures of a heartbeat: tokens in flight (tokens), queued and running requests."""

    tokens_in_flight: int
    queue_depth: int
    running: int


class InFlight:
    """Every request held, by id."""

    def __init__(self) -> None:
        self._held: dict[str, Held] = {}

    def __len__(self) -> int:
        return len(self._held)

    def add(self, request_id: str, prompt_tokens: int, max_tokens: int) -> None:
        """A request arrived (tokens)."""
        self._held[request_id] = Held(prompt_tokens, max_tokens)

    def started(self, request_id: str) -> None:
        """Its first token is out."""
        held = self._held.get(request_id)
        if held is not None:
            held.started = True

    def streamed(self, request_id: str, chunks: int = 1) -> None:
        """``chunks`` more output chunks (about one token each) went out."""
        held = self._held.get(request_id)
        if held is not None:
            held.streamed += chunks

    def remove(self, request_id: str) -> None:
        """The request ended, however."""
        self._held.pop(request_id, None)

    def load(self) -> Load:
        """The current :class:`Load`."""
        held = self._held.values()
        running = sum(1 for h in held if h.started)
        return Load(sum(h.tokens_in_flight for h in held), len(self._held) - running, running)


def prepare_body(body: bytes, default_max_tokens: int) -> tuple[RequestShape, bytes]:
    """The request's shape, and its body with ``include_usage`` on if it streams (a body that is
    not a JSON object goes to the engine as it is, for its own 400)."""
    try:
        obj = json.loads(body)
    except ValueError:
        obj = None
    if not isinstance(obj, dict):
        return RequestShape(0, 0, False, False), body
    shape = request_shape(obj, default_max_tokens)
    if shape.stream and not shape.include_usage:
        options = obj.get("stream_options")
        obj["stream_options"] = {**(options if isinstance(options, dict) else {}),
                                 "include_usage": True}
        body = json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()
    return shape, body

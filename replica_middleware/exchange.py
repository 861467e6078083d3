"""One chat request through the middleware: hold the response until the first token, end it with
the final event or the explicit error, and say how it ended (the ASGI ``send`` side).

* **Headers held**: the app's ``http.response.start`` is kept until the first event that is not
  an error. Until then nothing has reached Envoy, so a replica that fails (engine error, an
  exception, a stream that ends early, a 5xx) answers **503** instead, which Envoy retries on
  the next replica (``retriable-status-codes``), and a replica process that dies resets the
  connection before any header, which Envoy retries too (``reset``).
* **Streams** (``text/event-stream``): chunks pass as they come and are counted (about one
  token each); the engine's usage chunk (the middleware always asks for it) is replaced by the
  final event; a stream that ends without ``[DONE]`` or with an error event once started ends
  with the explicit error event (see :mod:`replica_middleware.sse`).
* **Completions** (JSON): buffered (one object), ``usage.cached_tokens`` and who served added.

:class:`Exchange.outcome` is then one of ``finished``, ``rejected`` (4xx), ``error`` (cut after
it started), ``client_disconnect``, or ``retried`` (503 before the first token: another replica
serves and settles it).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from typing import Any

from starlette.types import Message, Send

from replica_middleware.inflight import InFlight
from replica_middleware.sse import (
    DONE_EVENT,
    Identity,
    Kind,
    SseSplitter,
    augment_completion,
    error_event,
    final_event,
    is_role_chunk,
    unavailable_body,
    usage_of,
)

CUT_MESSAGE = "The replica's answer stopped before it was complete; the text so far is partial."


async def send_unavailable(send: Send, message: str) -> None:
    """A 503 with an OpenAI-shaped error (Envoy retries it on another replica)."""
    body = unavailable_body(message)
    await send({"type": "http.response.start", "status": 503, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        (b"retry-after", b"1")]})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class Exchange:
    """The response side of one request ``request_id`` held in ``inflight``; ``who`` served;
    ``prompt_estimate`` (tokens) stands in for the engine's count if a stream ends without its
    usage; ``clock`` in seconds."""

    def __init__(self, send: Send, request_id: str, inflight: InFlight, who: Identity,
                 prompt_estimate: int = 0, clock: Callable[[], float] = time.monotonic) -> None:
        self._send, self.request_id, self.inflight, self.who = send, request_id, inflight, who
        self.prompt_estimate, self.clock = prompt_estimate, clock
        self.arrived_at = clock()
        self.first_token_at: float | None = None
        self.status: int | None = None
        self.outcome = "client_disconnect"
        self.usage: tuple[int, int, int] | None = None
        self.chunks = 0
        """Output chunks streamed (about one token each)."""
        self.client_gone = False
        self._start: Message | None = None
        self._sent_start = False
        self._mode = "unknown"
        self._done = False
        self._held = b""
        self._splitter = SseSplitter()
        self._head: dict[str, Any] = {}

    @property
    def started(self) -> bool:
        """Whether anything reached the client."""
        return self._sent_start

    @property
    def done(self) -> bool:
        """Whether the response is complete."""
        return self._done

    async def send(self, message: Message) -> None:
        """The app's ``send``."""
        if message["type"] == "http.response.start":
            self._start, self.status = message, int(message["status"])
            ctype = dict(message.get("headers", [])).get(b"content-type", b"")
            if self.status >= 500:
                self._mode = "failed"
            elif self.status >= 400:
                self._mode, self.outcome = "passthrough", "rejected"
                await self._release()
            else:
                self._mode = "stream" if ctype.startswith(b"text/event-stream") else "json"
            return
        if message["type"] != "http.response.body" or self._done:
            return
        body, more = bytes(message.get("body", b"")), bool(message.get("more_body", False))
        if self._mode == "passthrough":
            await self._out(body, more)
        elif self._mode == "json":
            self._held += body
            if not more:
                await self._completion()
        elif self._mode == "stream":
            await self._stream(body, more)

    async def _out(self, body: bytes, more: bool) -> None:
        await self._send({"type": "http.response.body", "body": body, "more_body": more})
        if not more:
            self._done = True

    async def _release(self, length: int | None = None) -> None:
        """Send the held status and headers (``length``: a new content-length)."""
        if self._sent_start or self._start is None:
            return
        headers = list(self._start.get("headers", []))
        if length is not None:
            headers = [(k, v) for k, v in headers if k.lower() != b"content-length"]
            headers.append((b"content-length", str(length).encode()))
        self._sent_start = True
        await self._send({**self._start, "headers": headers})

    async def _completion(self) -> None:
        body, usage = augment_completion(self._held, self.who)
        if self.status == 200 and usage is not None:
            self.usage, self.outcome = usage, "finished"
            self.first_token_at = self.clock()
        await self._release(len(body))
        await self._out(body, False)

    async def _stream(self, body: bytes, more: bool) -> None:
        for event in self._splitter.feed(body):
            if event.kind is Kind.CHUNK:
                self._held += self._chunk(event.data, event.raw)
            elif event.kind is Kind.USAGE:
                self._remember_head(event.data)
                with contextlib.suppress(ValueError, AttributeError):
                    self.usage = usage_of(json.loads(event.data).get("usage"))
            elif event.kind is Kind.ERROR:
                if self.first_token_at is None:  # nothing reached the client: 503, retried
                    self._mode = "failed"
                    return
                await self._cut()
                return
            elif event.kind is Kind.DONE:
                self._held += self._final()
                self.outcome = "finished"
                break
            else:
                self._held += event.raw
        if self.first_token_at is None and self.outcome != "finished":
            return  # headers and anything before the first token stay held
        out, self._held = self._held, b""
        await self._release()
        if self.outcome == "finished":
            await self._out(out, False)
        elif out:
            await self._out(out, True)
        if not more and not self._done:
            await self._cut()

    def _chunk(self, data: str, raw: bytes) -> bytes:
        if self.first_token_at is None:
            self.first_token_at = self.clock()
            self.inflight.started(self.request_id)
            self._remember_head(data)
        if not is_role_chunk(data):
            self.chunks += 1
            self.inflight.streamed(self.request_id)
        return raw

    def _remember_head(self, data: str) -> None:
        if not self._head:
            try:
                obj = json.loads(data)
            except ValueError:
                return
            if isinstance(obj, dict):
                self._head = {k: obj.get(k) for k in ("id", "created", "model")}

    def _final(self) -> bytes:
        if self.usage is None:
            self.usage = (self.prompt_estimate, 0, self.chunks)
        return final_event(self._head, self.usage, self.who) + DONE_EVENT

    async def _cut(self) -> None:
        self.outcome = "error"
        await self._release()
        await self._out(self._held + error_event(CUT_MESSAGE, self.who), False)
        self._held = b""

    async def finish(self) -> None:
        """The app returned or raised: complete what it left incomplete."""
        if self.client_gone:
            if self.outcome not in ("finished", "rejected"):
                self.outcome = "client_disconnect"
            return
        if self._done:
            return
        if not self._sent_start:
            self.outcome = "retried"
            self._done = True
            await send_unavailable(self._send, f"Replica {self.who.replica_id} failed before the "
                                   "first token; another replica can serve this request.")
        else:
            await self._cut()

"""``ModelfleetMiddleware``: the ASGI middleware every replica runs, real vLLM or simulated.

    vllm serve /weights/chat-7b/v13 ... --middleware replica_middleware.middleware.ModelfleetMiddleware

vLLM adds it with ``app.add_middleware(ModelfleetMiddleware)`` (no arguments): settings come
from ``MODELFLEET_*`` variables (:mod:`replica_middleware.settings`). The simulated replica adds
the same class with ``settings=`` built from its flags, so both run this code. It:

* tracks what the replica holds (:mod:`replica_middleware.inflight`) and beats once a second to the
  control plane (:mod:`replica_middleware.heartbeat`), ``serving``, or ``draining`` from SIGTERM on (the
  SIGTERM handler is chained in front of the server's; new chat requests then get a 503 that
  Envoy retries elsewhere);
* serves each ``POST /v1/chat/completions`` through :class:`replica_middleware.exchange.Exchange`: status
  and headers held until the first token, the final event (usage, version, region, replica id)
  or the explicit error event, the same fields in a JSON body. Streamed requests are sent to
  the engine with ``stream_options.include_usage`` on (the final event needs its counts);
* reports each admitted request's real usage to gateway_ext (``x-modelfleet-reservation``,
  batched by :class:`replica_middleware.settle.SettleReporter`), also when the client left or the stream
  was cut; never for a shadow copy (``x-modelfleet-shadow``) or a request another replica will
  serve (``retried``);
* appends its own metrics (:mod:`replica_middleware.metrics`) to the engine's ``/metrics``.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from modelfleet.contract.headers import CHAT_PATH, METRICS_PATH, SHADOW_HEADER
from modelfleet.contract.heartbeat import HEARTBEAT_PATH, ReplicaPhase
from replica_middleware.asgi import asgi_get, read_body
from replica_middleware.exchange import Exchange, send_unavailable
from replica_middleware.heartbeat import EngineFigures, Heartbeater, parse_engine_metrics
from replica_middleware.inflight import InFlight, RequestShape, prepare_body
from replica_middleware.metrics import MiddlewareMetrics
from replica_middleware.refusals import OpeningReader
from replica_middleware.settings import MiddlewareSettings
from replica_middleware.settle import SettleReporter, settle_report
from replica_middleware.sse import Identity

log = logging.getLogger(__name__)



class ModelfleetMiddleware:
    """The middleware around ``app``; ``settings`` default to the environment's."""

    def __init__(self, app: ASGIApp, settings: MiddlewareSettings | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.app = app
        self.settings = settings or MiddlewareSettings.from_env()
        self.clock = clock
        self.inflight = InFlight()
        self.metrics = MiddlewareMetrics(self.inflight.load)
        self.who = Identity(self.settings.version, self.settings.region, self.settings.replica_id)
        self.draining = False
        self.reporter: SettleReporter | None = None
        self.beater: Heartbeater | None = None
        self._client: httpx.AsyncClient | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._previous_sigterm: Any = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(scope, receive, send)
        elif scope["type"] == "http" and scope["method"] == "POST" and scope["path"] == CHAT_PATH:
            await self._chat(scope, receive, send)
        elif scope["type"] == "http" and scope["method"] == "GET" and scope["path"] == METRICS_PATH:
            await self._metrics(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    # ---------------------------------------------------------------- lifecycle

    async def _lifespan(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def wrapped(message: Message) -> None:
            if message["type"] == "lifespan.startup.complete":
                await self.start()
            elif message["type"] == "lifespan.shutdown.complete":
                await self.stop()
            await send(message)

        await self.app(scope, receive, wrapped)

    async def start(self) -> None:
        """Start beating and reporting (the app's startup is complete)."""
        s = self.settings
        if s.settle_url:
            self.reporter = SettleReporter(s.settle_url)
        if s.beats:
            self._client = httpx.AsyncClient(timeout=min(0.9, s.beat_interval_s))
            self.beater = Heartbeater(s, self._post_beat, self.state, self.inflight.load,
                                      self.engine_figures)
            self._tasks.append(asyncio.create_task(self.beater.run(), name="modelfleet-beats"))
        elif s.control_plane_url:
            log.warning("no heartbeats: MODELFLEET_REPLICA_ID, _REPLICA_IP, _MODEL and _VERSION "
                        "are all needed")
        self._install_sigterm()
        log.info("modelfleet middleware: replica %s (%s@%s), beats %s, settle %s",
                 s.replica_id or "-", s.model or "-", s.version or "-",
                 "on" if s.beats else "off", "on" if s.settle_url else "off")

    async def stop(self) -> None:
        """Last beat (``draining``), stop beating, send the last settles."""
        self.draining = True
        if self.beater is not None:
            await self.beater.beat_once()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if self.reporter is not None:
            await self.reporter.aclose()
        if self._client is not None:
            await self._client.aclose()
        if self._previous_sigterm is not None:
            signal.signal(signal.SIGTERM, self._previous_sigterm)
            self._previous_sigterm = None

    def state(self) -> ReplicaPhase:
        """``serving`` or ``draining``."""
        return "draining" if self.draining else "serving"

    def drain(self) -> None:
        """Stop taking new requests and say so in a beat now (SIGTERM does this)."""
        self.draining = True
        if self.beater is not None:
            self.beater.kick()

    def _install_sigterm(self) -> None:
        if not self.settings.handle_sigterm or threading.current_thread() is not \
                threading.main_thread():
            return
        loop = asyncio.get_running_loop()
        previous = signal.getsignal(signal.SIGTERM)

        def on_sigterm(signum: int, frame: Any) -> None:
            loop.call_soon_threadsafe(self.drain)
            if callable(previous):
                grace = self.settings.drain_grace_s
                loop.call_soon_threadsafe(loop.call_later, grace, previous, signum, frame)
            elif previous == signal.SIG_DFL:
                raise SystemExit(128 + signum)

        signal.signal(signal.SIGTERM, on_sigterm)
        self._previous_sigterm = previous

    async def _post_beat(self, body: dict[str, Any]) -> None:
        assert self._client is not None
        r = await self._client.post(self.settings.control_plane_url + HEARTBEAT_PATH, json=body)
        r.raise_for_status()

    async def engine_figures(self) -> EngineFigures:
        """KV usage and prefix-cache counters from the engine's ``/metrics``, in process."""
        status, body = await asgi_get(self.app, METRICS_PATH)
        if status != 200:
            raise RuntimeError(f"engine /metrics answered {status}")
        return parse_engine_metrics(body.decode("utf-8", "replace"))

    # ---------------------------------------------------------------- requests

    async def _metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        status, body = await asgi_get(self.app, METRICS_PATH)
        if status == 200:
            body += self.metrics.render()
        await send({"type": "http.response.start", "status": status, "headers": [
            (b"content-type", b"text/plain; version=0.0.4; charset=utf-8"),
            (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    async def _chat(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = await read_body(receive)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers", [])}
        shadow = headers.get(SHADOW_HEADER) == "1"
        if self.draining:
            self.metrics.record(self.settings.version, shadow, "draining", None, None)
            await send_unavailable(send, f"Replica {self.settings.replica_id} is draining.")
            return
        shape, body = prepare_body(body, self.settings.default_max_tokens)
        rid = uuid.uuid4().hex
        self.inflight.add(rid, shape.prompt_tokens, shape.max_tokens)
        x = Exchange(send, rid, self.inflight, self.who, shape.prompt_tokens, self.clock)
        scope = {**scope, "headers": [(k, v) for k, v in scope.get("headers", [])
                                      if k.lower() != b"content-length"]
                 + [(b"content-length", str(len(body)).encode())]}
        replayed = False
        opening = OpeningReader()

        async def sent(message: Message) -> None:
            opening.feed(message)
            await x.send(message)

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            message = await receive()
            if message["type"] == "http.disconnect" and not x.done:
                x.client_gone = True
            return message

        try:
            await self.app(scope, replay, sent)
        except Exception:
            if not x.client_gone:
                log.exception("chat request failed in the engine")
        finally:
            await x.finish()
            self.inflight.remove(rid)
            self._ended(x, headers, shape, shadow, opening.refused())

    def _ended(self, x: Exchange, headers: dict[str, str], shape: RequestShape,
               shadow: bool, refused: bool = False) -> None:
        ttft = None if x.first_token_at is None else \
            (x.first_token_at - x.arrived_at) * self.settings.time_scale
        usage = x.usage
        self.metrics.record(self.settings.version, shadow, x.outcome, ttft,
                            usage[2] if usage else None, refused)
        if self.reporter is None or shadow or x.outcome == "retried":
            return
        if x.outcome == "finished" and usage is not None:
            prompt, cached, completion = usage
        elif x.outcome == "rejected":
            prompt = cached = completion = 0
        else:  # cut or left: what came out; the prompt counts only if prefill ran
            prompt, cached, completion = (shape.prompt_tokens if x.chunks else 0), 0, x.chunks
        report = settle_report(headers, prompt, cached, completion, _settle_outcome(x.outcome))
        if report is not None:
            self.reporter.report(report)


def _settle_outcome(outcome: str) -> Any:
    return outcome if outcome in ("finished", "rejected", "error") else "client_disconnect"

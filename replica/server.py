"""The replica's ASGI app: the routes of ``vllm serve`` over one simulated engine.

This is the engine's app alone, as vLLM's is; ``python -m replica`` wraps it in the modelfleet
middleware (:func:`serve_app`), as ``vllm serve --middleware`` does. With ``ReplicaConfig.debug``
it also serves ``POST /v1/debug/engine`` for failure tests: ``{"slowdown": 20}`` runs the engine
20 times slower than its time scale (1 restores it), ``{"fail": true}`` fails the engine as a GPU
error would (``"exit": true`` then stops the process with SIGTERM, as vLLM's watchdog does).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import AsyncIterator, Callable
from http import HTTPStatus

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from replica.chat import ChatHandler, ReplicaConfig
from replica.clock import ManualClock
from replica.driver import EngineDriver
from replica.engine import Engine
from replica.metrics import ReplicaMetrics
from replica.protocol import ChatCompletionRequest, error_body, models_body
from replica_middleware.middleware import ModelfleetMiddleware
from replica_middleware.settings import MiddlewareSettings

log = logging.getLogger(__name__)


class Replica:
    """One simulated vLLM server's state: engine, driver and metrics, built from a config."""

    def __init__(self, config: ReplicaConfig, wall: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.clock = ManualClock()
        self.engine = Engine(config.params, self.clock)
        info = {k: v for k, v in (("model_version", config.model_version), ("replica_id", config.replica_id),
                                  ("region", config.region)) if v}
        self.metrics = ReplicaMetrics(config.served_model_names[0], self.engine.stats, info)
        self.driver = EngineDriver(self.engine, self.clock, config.time_scale, self.metrics.observe_step, wall)
        self.created = int(time.time())


def create_app(config: ReplicaConfig, wall: Callable[[], float] = time.monotonic) -> FastAPI:
    """An app that serves ``config`` like ``vllm serve``; the engine loop runs in its lifespan.

    ``wall`` is the wall clock in seconds (injectable for tests). The ``Replica`` is on
    ``app.state.replica`` for in-process inspection.
    """
    replica = Replica(config, wall)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        task = asyncio.create_task(replica.driver.run(), name="replica-engine")
        log.info("replica %s serving %s (time scale %g)", config.replica_id or "-",
                 " ".join(config.served_model_names), config.time_scale)
        try:
            yield
        finally:
            replica.driver.stop()
            try:
                await asyncio.wait_for(task, timeout=5.0)
            except (TimeoutError, asyncio.CancelledError):
                task.cancel()

    app = FastAPI(title="modelfleet simulated vLLM replica", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.replica = replica
    chat = ChatHandler(config, replica.driver, replica.metrics.finished)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        param = ".".join(str(p) for p in errors[0]["loc"]) if errors else None
        label = "error" if len(errors) == 1 else "errors"
        message = f"{len(errors)} validation {label}:\n" + "".join(f"  {e}\n" for e in errors)
        body = error_body(message.rstrip(), HTTPStatus.BAD_REQUEST.phrase, 400, param)
        return JSONResponse(body, status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        status = HTTPStatus(exc.status_code)
        body = error_body(str(exc.detail), status.phrase, exc.status_code)
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(body: ChatCompletionRequest, raw: Request) -> Response:
        return await chat(body, raw)

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        root = config.model_version or config.served_model_names[0]
        return JSONResponse(models_body(list(config.served_model_names), root,
                                        config.params.max_model_len, replica.created))

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(replica.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    if config.debug:
        _add_debug_routes(app, replica)
    return app


def _add_debug_routes(app: FastAPI, replica: Replica) -> None:
    @app.post("/v1/debug/engine")
    async def engine(request: Request) -> JSONResponse:
        body = await request.json()
        slowdown = float(body.get("slowdown", 0) or 0)
        if slowdown > 0:
            replica.driver.set_time_scale(replica.config.time_scale / slowdown)
        if body.get("fail"):
            replica.driver.fail()
            if body.get("exit"):
                asyncio.get_running_loop().call_later(0.2, os.kill, os.getpid(), signal.SIGTERM)
        return JSONResponse({"time_scale": replica.driver.time_scale, "dead": replica.driver.dead})


def serve_app(config: ReplicaConfig, settings: MiddlewareSettings,
              wall: Callable[[], float] = time.monotonic) -> FastAPI:
    """The replica as it runs: the engine's app wrapped in the modelfleet middleware (what
    ``vllm serve --middleware replica_middleware.middleware.ModelfleetMiddleware`` runs)."""
    app = create_app(config, wall)
    app.add_middleware(ModelfleetMiddleware, settings=settings)
    return app

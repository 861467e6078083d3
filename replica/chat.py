"""``POST /v1/chat/completions``: check the request, plan the answer, stream it as the engine runs.

Checking and planning are plain functions of the request and the replica's config (they raise
``RequestError``); only ``ChatHandler`` touches the driver and the HTTP connection.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from http import HTTPStatus

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from modelfleet.contract import tokens
from modelfleet.contract.headers import REQUEST_ID_HEADER
from replica.driver import EngineDead, EngineDriver, RequestHandle
from replica.engine_types import EngineRequest
from replica.generation import OutputPlan, plan_output
from replica.judge import judge_plan
from replica.params import CHAT_7B, EngineParams
from replica.protocol import ChatCompletionRequest, ChunkWriter, completion_body, error_body, usage


@dataclass(frozen=True)
class ReplicaConfig:
    """Who this replica is and what it simulates."""

    served_model_names: tuple[str, ...]
    """Names requests may use, as ``--served-model-name``; the first labels the metrics."""
    params: EngineParams = CHAT_7B
    model_version: str = ""
    """The version this replica serves (``v13`` or ``chat-7b@v13``), reported as the models' ``root``."""
    replica_id: str = ""
    region: str = ""
    seed: int = 0
    """Seed of generation for requests that send none."""
    time_scale: float = 1.0
    """Model seconds per wall second (10: ten times faster than real time)."""
    default_temperature: float = 1.0
    debug: bool = False
    """Serve ``/v1/debug/engine`` (slow the engine down, make it fail) for failure tests."""

    def __post_init__(self) -> None:
        if not self.served_model_names:
            raise ValueError("at least one served model name is required")
        if self.time_scale <= 0:
            raise ValueError(f"time_scale must be positive, got {self.time_scale}")


class RequestError(Exception):
    """A request the replica refuses, with vLLM's error type and HTTP status."""

    def __init__(self, message: str, status: HTTPStatus = HTTPStatus.BAD_REQUEST,
                 err_type: str = "BadRequestError", param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.status, self.err_type, self.param = message, status, err_type, param

    def response(self) -> JSONResponse:
        """The error as vLLM sends it."""
        return JSONResponse(error_body(self.message, self.err_type, self.status.value, self.param),
                            status_code=self.status.value)


@dataclass(frozen=True)
class PreparedRequest:
    """A checked request: its prompt, its planned answer and how to deliver it."""

    model: str
    prompt_ids: list[int]
    plan: OutputPlan
    stream: bool
    include_usage: bool


def prepare(body: ChatCompletionRequest, config: ReplicaConfig) -> PreparedRequest:
    """Check ``body`` against the replica and plan its answer; raises ``RequestError``."""
    p = config.params
    model = body.model or config.served_model_names[0]
    if model not in config.served_model_names:
        raise RequestError(f"The model `{model}` does not exist.", HTTPStatus.NOT_FOUND, "NotFoundError", "model")
    if body.n is not None and body.n != 1:
        raise RequestError(f"n must be 1 on this replica, got {body.n}.", param="n")
    if body.stream_options is not None and not body.stream:
        raise RequestError("Stream options can only be defined when `stream=True`.", param="stream_options")
    temperature = config.default_temperature if body.temperature is None else body.temperature
    if temperature < 0:
        raise RequestError(f"temperature must be non-negative, got {temperature}.", param="temperature")
    prompt_ids = tokens.chat_prompt_ids((m.role, m.text()) for m in body.messages)
    n_prompt = len(prompt_ids)
    if n_prompt >= p.max_model_len:
        raise RequestError(
            f"This model's maximum context length is {p.max_model_len} tokens. However, your request "
            f"has {n_prompt} input tokens. Please reduce the length of the input messages.",
            param="messages",
        )
    requested = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    if requested is not None and requested < 1:
        raise RequestError(f"{param} must be at least 1, got {requested}.", param=param)
    if requested is not None and n_prompt + requested > p.max_model_len:
        raise RequestError(
            f"'max_tokens' or 'max_completion_tokens' is too large: {requested}. This model's maximum "
            f"context length is {p.max_model_len} tokens and your request has {n_prompt} input tokens "
            f"({requested} > {p.max_model_len} - {n_prompt}).",
            param=param,
        )
    max_tokens = p.max_model_len - n_prompt if requested is None else requested
    if body.min_tokens < 0 or body.min_tokens > max_tokens:
        raise RequestError(f"min_tokens must be in [0, {max_tokens}], got {body.min_tokens}.", param="min_tokens")
    # A judge prompt (modelfleet gate --judge) gets a scored reply, as a real model would give.
    plan = judge_plan(((m.role, m.text()) for m in body.messages), max_tokens) or plan_output(
        prompt_ids,
        max_tokens=max_tokens,
        seed=config.seed if body.seed is None else body.seed,
        temperature=temperature,
        stop=body.stop_strings(),
        ignore_eos=body.ignore_eos,
        min_tokens=body.min_tokens,
    )
    include_usage = bool(body.stream and body.stream_options and body.stream_options.include_usage)
    return PreparedRequest(model, prompt_ids, plan, bool(body.stream), include_usage)


class _EngineStream(StreamingResponse):
    """A streamed answer that tells the engine when the connection ends, however it ends."""

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], None]) -> None:
        super().__init__(content, media_type="text/event-stream")
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


class ChatHandler:
    """Serves chat completions from one engine driver. Usage reporting, held headers and the
    final event are the modelfleet middleware's (:mod:`replica_middleware.middleware`), as with real vLLM."""

    def __init__(self, config: ReplicaConfig, driver: EngineDriver,
                 on_finish: Callable[[str], None] | None = None) -> None:
        self.config = config
        self.driver = driver
        self.on_finish = on_finish or (lambda reason: None)
        """Called once per request that reached the engine: ``stop``, ``length`` or ``abort``."""

    async def __call__(self, body: ChatCompletionRequest, raw: Request) -> Response:
        """Answer one request: a JSON completion, an event stream, or a vLLM error."""
        try:
            req = prepare(body, self.config)
            engine_id = uuid.uuid4().hex
            ids = req.prompt_ids + list(req.plan.token_ids)
            handle = self.driver.submit(EngineRequest(
                engine_id, len(req.prompt_ids), req.plan.num_tokens,
                tokens.block_hashes(ids, self.config.params.block_size),
            ))
        except RequestError as exc:
            return exc.response()
        except EngineDead as exc:
            return RequestError(str(exc), HTTPStatus.INTERNAL_SERVER_ERROR, "EngineDeadError").response()
        except ValueError as exc:
            return RequestError(str(exc)).response()
        completion_id = f"chatcmpl-{raw.headers.get(REQUEST_ID_HEADER) or engine_id}"
        created = int(time.time())
        if req.stream:
            ended: list[bool] = []
            events = self._events(req, handle, ChunkWriter(completion_id, created, req.model), ended)

            def closed() -> None:
                self.driver.abort(engine_id)
                self.on_finish(req.plan.finish_reason if ended else "abort")

            return _EngineStream(events, closed)
        finished = await self._wait_finished(handle, raw)
        self.on_finish(req.plan.finish_reason if finished else "abort")
        if not finished:
            self.driver.abort(engine_id)
            return RequestError("The request ended before the model finished.",
                                HTTPStatus.INTERNAL_SERVER_ERROR, "InternalServerError").response()
        used = usage(len(req.prompt_ids), req.plan.num_tokens, handle.cached_tokens)
        return JSONResponse(completion_body(completion_id, created, req.model, req.plan.text,
                                            req.plan.finish_reason, req.plan.stop_reason, used))

    @staticmethod
    async def _events(req: PreparedRequest, handle: RequestHandle, w: ChunkWriter,
                      ended: list[bool]) -> AsyncIterator[str]:
        plan = req.plan
        while True:
            out = await handle.queue.get()
            if out is None:
                return  # engine stopped: the stream ends without [DONE], as a dropped connection
            if out.index == 0:
                yield w.role()
            delta = plan.deltas[out.index]
            if out.finished:
                ended.append(True)
                yield w.finish(delta, plan.finish_reason, plan.stop_reason)
                break
            if delta:
                yield w.content(delta)
        if req.include_usage:
            yield w.usage(len(req.prompt_ids), plan.num_tokens, handle.cached_tokens)
        yield w.done()

    @staticmethod
    async def _wait_finished(handle: RequestHandle, raw: Request) -> bool:
        """True once the last token is out; False if the client left or the engine stopped."""

        async def finished() -> bool:
            while True:
                out = await handle.queue.get()
                if out is None:
                    return False
                if out.finished:
                    return True

        async def disconnected() -> None:
            while (await raw.receive())["type"] != "http.disconnect":
                pass

        work = asyncio.ensure_future(finished())
        gone = asyncio.ensure_future(disconnected())
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        for task in (work, gone):
            task.cancel()
        return work.done() and not work.cancelled() and work.result()

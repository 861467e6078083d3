"""gateway_ext's HTTP service (FastAPI): Envoy's ext_authz checks, the replicas' settles, metrics.

Routes (on the gateway's own port; Envoy never routes clients here):

| method | path | what |
|---|---|---|
| any | ``/authz/<client path>`` | ext_authz check (see :mod:`modelfleet.contract.headers`) |
| POST | ``/v1/settle`` | replicas' real usage: one :class:`SettleBody` or ``{"reports": [...]}`` |
| GET | ``/metrics`` | Prometheus text |
| GET | ``/health`` | ``{status, queued, running, bucket_store}`` |
| GET | ``/v1/debug/buckets/{team}/{model}`` | with ``debug``: a bucket's tokens left |
| GET | ``/v1/debug/pools`` | with ``debug``: capacity, tokens in flight, queue per pool |
| GET | ``/v1/debug/routing`` | with ``debug``: aliases, router state, per-replica load and bound |

``POST /authz/v1/chat/completions`` runs the whole decision; any other checked path only needs a
valid key (401 otherwise) and is then answered by Envoy's routes (``GET /v1/models``, or 404).
Refusals are values until here; this module alone turns them into HTTP responses.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any, Literal

import httpx
from fastapi import FastAPI, HTTPException
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, Field
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive

from gateway_ext.decision import Admitted, Refused
from gateway_ext.lifecycle import UsageReport
from gateway_ext.limits.bucket_store import BucketKey
from gateway_ext.limits.buckets import refill, to_ms
from gateway_ext.routing.feed import RouterFeed
from gateway_ext.runtime import Runtime
from modelfleet.contract.errors import ApiError
from modelfleet.contract.headers import AUTHZ_PATH_PREFIX, CHAT_PATH, SETTLE_PATH, SHED_STATUS

log = logging.getLogger(__name__)

METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]


class SettleBody(BaseModel):
    """``POST /v1/settle``: how a reservation ended, usage in tokens."""

    reservation_id: str = Field(min_length=1, max_length=128)
    team: str = Field(min_length=1, max_length=63)
    model: str = Field(min_length=1, max_length=63)
    version: str = Field(min_length=1, max_length=63)
    prompt_tokens: int = Field(ge=0)
    cached_tokens: int = Field(default=0, ge=0)
    completion_tokens: int = Field(ge=0)
    outcome: Literal["finished", "client_disconnect", "error", "rejected"] = "finished"
    tier: Literal["interactive", "standard", "batch"] = "standard"
    """The request's ``x-modelfleet-tier`` (metered when another process admitted it)."""


class SettleBatch(BaseModel):
    """``POST /v1/settle`` with several reports (what the replicas send)."""

    reports: list[SettleBody] = Field(max_length=10_000)


def error_response(error: ApiError) -> Response:
    """The HTTP answer to Envoy for a refusal; a 503 goes out as ``SHED_STATUS`` (Envoy maps it
    back, keeping the body and ``Retry-After``)."""
    status = SHED_STATUS if error.status == 503 else error.status
    return Response(json.dumps(error.body()), status_code=status,
                    headers={**error.headers, "content-type": "application/json"})


def decision_response(result: Admitted | Refused) -> Response:
    """200 with the upstream and rate-limit headers, or the refusal."""
    if isinstance(result, Refused):
        return error_response(result.error)
    return Response(status_code=200, headers=result.headers)


async def wait_disconnect(receive: Receive) -> None:
    """Return when the client (Envoy, cancelling its check) closes the connection."""
    while (await receive())["type"] != "http.disconnect":
        pass


def create_app(runtime: Runtime) -> FastAPI:
    """The service over ``runtime``; its lifespan runs the queue timer, the usage flush loop and
    the router feed (state file at once, then the control plane's long poll), and flushes once
    more at shutdown."""
    lifecycle = runtime.lifecycle
    settings = runtime.settings
    client = httpx.AsyncClient()
    feed = RouterFeed.over_http(
        runtime.router, lifecycle, client, settings.control_plane_url,
        state_file=settings.router_state_file, write_file=settings.router_state_write,
        wait_s=settings.router_poll_wait_s)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        tasks = [asyncio.create_task(lifecycle.run_timer(), name="gateway-timer"),
                 asyncio.create_task(_flush_loop(runtime), name="gateway-flush"),
                 asyncio.create_task(feed.run(), name="gateway-router-feed"),
                 *[asyncio.create_task(loop) for loop in runtime.background()]]
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await client.aclose()
            result = await runtime.flush()
            log.info("usage flushed at shutdown: %s", result)
            await runtime.aclose()
            runtime.close()

    app = FastAPI(title="modelfleet gateway_ext", lifespan=lifespan, docs_url=None,
                  redoc_url=None, openapi_url=None)
    app.state.runtime = runtime
    app.state.router_feed = feed

    async def authz(request: Request) -> Response:
        path = "/" + request.path_params["path"]
        headers = dict(request.headers)
        if request.method == "POST" and path == CHAT_PATH:
            body = await request.body()
            result = await lifecycle.check(headers, body,
                                      gone=lambda: wait_disconnect(request.receive))
            return decision_response(result)
        auth = lifecycle.core.keys.authenticate(headers.get("authorization"))
        return error_response(auth) if isinstance(auth, ApiError) else Response(status_code=200)

    app.add_route(AUTHZ_PATH_PREFIX + "/{path:path}", authz, methods=METHODS)

    async def settle_one(body: SettleBody) -> dict[str, Any]:
        settlement = await lifecycle.settle_async(UsageReport(**body.model_dump()))
        return {"reservation_id": body.reservation_id, "verdict": str(settlement.verdict),
                "reserved_tokens": settlement.reserved_tokens,
                "remaining_tokens": settlement.remaining_tokens}

    @app.post(SETTLE_PATH)
    async def settle(body: SettleBody | SettleBatch) -> dict[str, Any]:
        if isinstance(body, SettleBatch):
            return {"results": [await settle_one(report) for report in body.reports]}
        return await settle_one(body)

    @app.get("/metrics")
    async def metrics() -> Response:
        lifecycle.observe_pools()
        age = runtime.router.view()["age_s"]
        lifecycle.record.metrics.router_state_age.set(-1 if age is None else age)
        return Response(generate_latest(runtime.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        degraded = runtime.store_degraded()
        router = runtime.router
        state = router.state
        return {"status": "ok", "queued": lifecycle.queued, "running": lifecycle.running,
                "bucket_store": "fallback" if degraded else "ok",
                "live_gateways": runtime.live_gateways(),
                "release_channel": runtime.release_channel(),
                "router": {"source": router.source,
                           "state_version": state.state_version if state else None,
                           "instance_id": state.instance_id if state else None,
                           "control_plane_silent_s": feed.staleness_s()}}

    if settings.debug:
        _add_debug_routes(app, runtime)
    return app


def _add_debug_routes(app: FastAPI, runtime: Runtime) -> None:
    core = runtime.lifecycle.core

    @app.get("/v1/debug/buckets/{team}/{model}")
    async def bucket(team: str, model: str) -> dict[str, Any]:
        limit = next((lim for t in core.config.teams if t.name == team for lim in t.limits
                      if lim.model == model), None)
        if limit is None:
            raise HTTPException(404, f"team {team!r} has no limit on {model!r}")
        state = await runtime.bucket_state(BucketKey(team, model))
        now = refill(state, limit.tokens_per_minute, to_ms(runtime.lifecycle.clock()))
        return {"team": team, "model": model, "tokens_per_minute": limit.tokens_per_minute,
                "remaining_tokens": now.tokens, "touched": state is not None}

    @app.get("/v1/debug/routing")
    async def routing() -> dict[str, Any]:
        return runtime.router.view()

    @app.get("/v1/debug/pools")
    async def pools() -> dict[str, Any]:
        out = {}
        for key, pool in core.pools.items():
            view = pool.view()
            out[key] = {"capacity_tokens": view.capacity_tokens,
                        "in_flight_tokens": view.in_flight_tokens, "queued": dict(view.queued)}
        return out


async def _flush_loop(runtime: Runtime) -> None:
    while True:
        await asyncio.sleep(runtime.settings.flush_interval_s)
        try:
            await runtime.flush()
        except Exception:  # a bad flush must not stop the next ones
            log.exception("usage flush failed")

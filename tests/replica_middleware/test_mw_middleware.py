"""The modelfleet middleware at the ASGI level (httpx ASGITransport, and raw ASGI calls): the final
event and body fields, headers held until the first token, 503 before it and the explicit error
after it, settles however a request ends (never for shadow copies or retried requests), draining,
the heartbeat's figures, settings from the environment, metrics appended to the engine's."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from envoy_control.api.state import HeartbeatIn
from prometheus_client.parser import text_string_to_metric_families
from starlette.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from modelfleet.contract.metrics import (
    REPLICA_REQUESTS,
    TOKENS_IN_FLIGHT,
    VLLM_GPU_CACHE_USAGE,
    VLLM_KV_CACHE_USAGE,
    VLLM_PREFIX_CACHE_HITS,
    VLLM_PREFIX_CACHE_QUERIES,
    VLLM_WAITING,
)
from replica.chat import ReplicaConfig
from replica.params import CHAT_7B
from replica.server import create_app
from replica.testing import sse_json
from replica_middleware.middleware import ModelfleetMiddleware
from replica_middleware.settings import MiddlewareSettings
from replica_middleware.settle import SettleReport
from replica_middleware.sse import INTERRUPTED

SETTINGS = MiddlewareSettings(replica_id="chat-7b@v13-0", host="10.0.0.7", port=8000,
                              region="us-east-1", model="chat-7b", version="v13",
                              handle_sigterm=False)
ADMITTED = {"x-modelfleet-reservation": "resv-1", "x-modelfleet-team": "search",
            "x-route-version": "chat-7b@v13"}
MESSAGES = [{"role": "user", "content": "Tell me a story."}]
CHAT = {"model": "chat-7b", "messages": MESSAGES, "max_tokens": 20}


class Reports:
    """Stands in for the settle reporter."""

    def __init__(self) -> None:
        self.reports: list[SettleReport] = []

    def report(self, report: SettleReport) -> None:
        self.reports.append(report)

    async def aclose(self) -> None:
        pass


@asynccontextmanager
async def engine_behind_middleware() -> AsyncIterator[tuple[httpx.AsyncClient, ModelfleetMiddleware,
                                                            Reports]]:
    app = create_app(ReplicaConfig(("chat-7b", "chat-7b@v13"), CHAT_7B, "v13", seed=1,
                                   time_scale=200.0))
    mw = ModelfleetMiddleware(app, SETTINGS)
    async with app.router.lifespan_context(app):
        await mw.start()
        reports = Reports()
        mw.reporter = reports  # type: ignore[assignment]
        transport = httpx.ASGITransport(app=mw)
        async with httpx.AsyncClient(transport=transport, base_url="http://replica",
                                     timeout=30) as client:
            yield client, mw, reports
        await mw.stop()


async def test_a_stream_ends_with_the_final_event_then_done() -> None:
    async with engine_behind_middleware() as (client, _, reports):
        r = await client.post("/v1/chat/completions", json={**CHAT, "stream": True},
                              headers=ADMITTED)
        assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n")
        events = sse_json(r.text)
        final = events[-1]
        assert [e for e in events if not e["choices"]] == [final]  # the only usage event
        assert (final["model_version"], final["region"], final["replica_id"]) == (
            "v13", "us-east-1", "chat-7b@v13-0")
        usage = final["usage"]
        assert usage["completion_tokens"] == 20 and usage["cached_tokens"] == 0
        assert usage["prompt_tokens"] > 0 and final["object"] == "chat.completion.chunk"
        assert reports.reports == [SettleReport("resv-1", "search", "chat-7b", "v13",
                                                usage["prompt_tokens"], 0, 20, "finished")]
        first_text = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1])
        again = {**CHAT, "messages": [*MESSAGES, {"role": "assistant", "content": first_text},
                                      {"role": "user", "content": "More."}]}
        body = (await client.post("/v1/chat/completions", json=again)).json()
        assert body["usage"]["cached_tokens"] > 0  # the second turn found its prefix
        assert body["usage"]["cached_tokens"] == body["usage"]["prompt_tokens_details"][
            "cached_tokens"]
        assert (body["model_version"], body["region"], body["replica_id"]) == (
            "v13", "us-east-1", "chat-7b@v13-0")
        assert len(reports.reports) == 1  # no reservation on the second: nothing to settle


async def test_a_bad_request_passes_through_and_settles_as_rejected() -> None:
    async with engine_behind_middleware() as (client, _, reports):
        r = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 0},
                              headers=ADMITTED)
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
        assert [(x.outcome, x.prompt_tokens, x.completion_tokens) for x in reports.reports] == [
            ("rejected", 0, 0)]


async def test_metrics_are_the_engines_plus_the_middlewares() -> None:
    async with engine_behind_middleware() as (client, mw, _):
        await client.post("/v1/chat/completions", json=CHAT, headers={"x-modelfleet-shadow": "1"})
        text = (await client.get("/metrics")).text
        assert VLLM_PREFIX_CACHE_QUERIES in text
        assert f'{REPLICA_REQUESTS}{{model_version="v13",outcome="finished",' \
               'traffic="shadow"} 1.0' in text
        figures = await mw.engine_figures()
        assert figures.prefix_cache_queries > 0


async def test_a_simulated_replica_exports_tokens_in_flight_once() -> None:
    # The middleware is the one exporter of tokens in flight, inside real vLLM and the
    # simulated engine alike: one family on the page, no second spelling from the engine.
    async with engine_behind_middleware() as (client, mw, _):
        mw.inflight.add("held", 100, 50)  # as a request the engine holds
        text = (await client.get("/metrics")).text
        mw.inflight.remove("held")
        idle = (await client.get("/metrics")).text
    families = [f for f in text_string_to_metric_families(text)]
    names = [f.name for f in families]
    assert len(names) == len(set(names))  # no family twice (engine's page + middleware's)
    assert [n for n in names if "tokens_in_flight" in n] == [TOKENS_IN_FLIGHT]
    (tif,) = [s for f in families if f.name == TOKENS_IN_FLIGHT for s in f.samples]
    assert tif.value == 150
    assert f"{TOKENS_IN_FLIGHT} 0.0" in idle.splitlines()


# ------------------------------------------------------------------ raw ASGI: scripted engines


def scripted(*steps: Any) -> Any:
    """An inner app playing ``steps``: messages to send, floats to sleep, an exception to raise."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()  # the request body
        for step in steps:
            if isinstance(step, float):
                await asyncio.sleep(step)
            elif isinstance(step, BaseException):
                raise step
            else:
                await send(step)

    return app


START = {"type": "http.response.start", "status": 200,
         "headers": [(b"content-type", b"text/event-stream")]}
ROLE = b'data: {"id":"c1","created":1,"model":"chat-7b","choices":[{"delta":{"role":"assistant","content":""}}]}\n\n'
TOKEN = b'data: {"id":"c1","created":1,"model":"chat-7b","choices":[{"delta":{"content":" hi"}}]}\n\n'
USAGE = b'data: {"id":"c1","created":1,"model":"chat-7b","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11,"prompt_tokens_details":{"cached_tokens":8}}}\n\n'


def body(data: bytes, more: bool = True) -> Message:
    return {"type": "http.response.body", "body": data, "more_body": more}


async def call(inner: Any, headers: dict[str, str] | None = None, disconnect_after: float | None = None,
               draining: bool = False) -> tuple[list[tuple[float, Message]], Reports,
                                                ModelfleetMiddleware]:
    mw = ModelfleetMiddleware(inner, SETTINGS)
    mw.draining = draining
    reports = Reports()
    mw.reporter = reports  # type: ignore[assignment]
    sent: list[tuple[float, Message]] = []
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    request = b'{"model":"chat-7b","stream":true,"max_tokens":50,"messages":[{"role":"user","content":"hi"}]}'
    delivered = False

    async def receive() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": request, "more_body": False}
        await asyncio.sleep(disconnect_after if disconnect_after is not None else 3600)
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append((loop.time() - t0, message))

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions",
             "headers": [(k.encode(), v.encode()) for k, v in {**ADMITTED, **(headers or {})}.items()]}
    await mw(scope, receive, send)
    return sent, reports, mw


def payload(sent: list[tuple[float, Message]]) -> bytes:
    return b"".join(m.get("body", b"") for _, m in sent if m["type"] == "http.response.body")


async def test_status_and_headers_wait_for_the_first_token() -> None:
    sent, reports, _ = await call(scripted(START, 0.2, body(ROLE), body(TOKEN), body(USAGE),
                                           body(b"data: [DONE]\n\n", False)))
    (at, start), first = sent[0], sent[1]
    assert start["type"] == "http.response.start" and at >= 0.2  # held through the 0.2 s
    assert first[1]["type"] == "http.response.body" and ROLE in first[1]["body"]
    final = sse_json(payload(sent).decode())[-1]
    assert final["usage"]["cached_tokens"] == 8 and final["replica_id"] == "chat-7b@v13-0"
    assert [(r.outcome, r.prompt_tokens, r.cached_tokens, r.completion_tokens)
            for r in reports.reports] == [("finished", 9, 8, 2)]


@pytest.mark.parametrize("steps", [
    (START, body(b"", False)),                               # the stream ends before a token
    (START, body(b'data: {"error": {"message": "engine dead"}}\n\n'), body(b"", False)),
    (RuntimeError("engine dead"),),                           # the app raises before answering
    ({"type": "http.response.start", "status": 500, "headers": []}, body(b"{}", False)),
])
async def test_a_failure_before_the_first_token_is_a_503_envoy_retries(steps: tuple[Any, ...]) -> None:
    sent, reports, mw = await call(scripted(*steps))
    assert sent[0][1]["status"] == 503
    assert b'"code":503' in payload(sent)
    assert reports.reports == []  # the replica Envoy retries on settles it
    assert mw.metrics.requests.labels("v13", "served", "retried")._value.get() == 1


@pytest.mark.parametrize("end", [body(b"", False), body(b'data: {"error": {"message": "x"}}\n\n'),
                                 RuntimeError("lost the GPU")])
async def test_a_stream_cut_after_it_started_ends_with_the_explicit_error(end: Any) -> None:
    sent, reports, _ = await call(scripted(START, body(ROLE + TOKEN + TOKEN), end))
    assert sent[0][1]["status"] == 200
    text = payload(sent).decode()
    assert "[DONE]" not in text and sse_json(text)[-1]["error"]["code"] == INTERRUPTED
    assert sent[-1][1].get("more_body") is False
    assert [(r.outcome, r.completion_tokens) for r in reports.reports] == [("error", 2)]


def streaming(*steps: bytes | float) -> Any:
    """An inner app answering with starlette's StreamingResponse (which, as vLLM's, stops when
    the client disconnects): bytes are events, floats pauses."""
    async def events() -> AsyncIterator[bytes]:
        for step in steps:
            if isinstance(step, float):
                await asyncio.sleep(step)
            else:
                yield step

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await StreamingResponse(events(), media_type="text/event-stream")(scope, receive, send)

    return app


async def test_a_client_that_leaves_is_settled_for_what_it_got() -> None:
    _sent, reports, _ = await call(streaming(ROLE, TOKEN, 0.3, TOKEN), disconnect_after=0.1)
    (report,) = reports.reports
    assert (report.outcome, report.completion_tokens) == ("client_disconnect", 1)
    assert report.prompt_tokens > 0


async def test_shadow_copies_and_draining_settle_nothing() -> None:
    full = (START, body(ROLE + TOKEN + USAGE), body(b"data: [DONE]\n\n", False))
    _, reports, mw = await call(scripted(*full), headers={"x-modelfleet-shadow": "1"})
    assert reports.reports == []
    assert mw.metrics.requests.labels("v13", "shadow", "finished")._value.get() == 1
    sent, reports, _ = await call(scripted(*full), draining=True)
    assert sent[0][1]["status"] == 503 and reports.reports == []


async def test_the_heartbeat_reports_what_is_held_and_the_state() -> None:
    beats: list[dict[str, Any]] = []
    mw = ModelfleetMiddleware(scripted(), SETTINGS)

    async def post(b: dict[str, Any]) -> None:
        beats.append(b)

    from replica_middleware.heartbeat import EngineFigures, Heartbeater

    async def figures() -> EngineFigures:
        return EngineFigures(0.25, 1000, 600)

    beater = Heartbeater(SETTINGS, post, mw.state, mw.inflight.load, figures, wall=lambda: 5.0)
    mw.inflight.add("a", 100, 50)
    mw.inflight.add("b", 200, 300)
    mw.inflight.started("b")
    mw.inflight.streamed("b", 120)
    await beater.beat_once()
    mw.drain()
    await beater.beat_once()
    first, second = beats[:2]
    assert (first["tokens_in_flight"], first["queue_depth"], first["running"]) == (
        100 + 50 + 200 + 180, 1, 1)
    # an engine that exports vllm:num_requests_waiting is the queue's own witness (a
    # non-streamed request shows no first token to the middleware until it ends)

    async def engine_queue() -> EngineFigures:
        return EngineFigures(0.25, 1000, 600, requests_waiting=0)

    await Heartbeater(SETTINGS, post, mw.state, mw.inflight.load, engine_queue,
                      wall=lambda: 6.0).beat_once()
    assert beats[2]["queue_depth"] == 0 and beats[2]["running"] == 1
    assert (first["kv_cache_usage"], first["prefix_cache_queries"], first["prefix_cache_hits"]) \
        == (0.25, 1000, 600)
    assert (first["state"], second["state"]) == ("serving", "draining")
    HeartbeatIn(**first)  # the control plane's contract accepts it


def test_engine_figures_read_the_engines_queue() -> None:
    from replica_middleware.heartbeat import parse_engine_metrics

    text = (f'# TYPE {VLLM_WAITING} gauge\n'
            f'{VLLM_WAITING}{{model_name="chat-7b"}} 3.0\n'
            f'# TYPE {VLLM_KV_CACHE_USAGE} gauge\n'
            f'{VLLM_KV_CACHE_USAGE}{{model_name="chat-7b"}} 0.5\n')
    assert parse_engine_metrics(text).requests_waiting == 3
    assert parse_engine_metrics(text).kv_cache_usage == 0.5
    assert parse_engine_metrics("").requests_waiting is None


def test_engine_figures_read_counters_and_older_vllms_kv_name() -> None:
    from replica_middleware.heartbeat import parse_engine_metrics

    # two engines: counters summed (their _created samples ignored), usage averaged
    text = "".join(
        f'# TYPE {name.removesuffix("_total")} counter\n'
        f'{name}{{engine="{e}"}} {v}\n{name.removesuffix("_total")}_created{{engine="{e}"}} 1.7e9\n'
        for e, (q, h) in enumerate(((1000, 600), (500, 100)))
        for name, v in ((VLLM_PREFIX_CACHE_QUERIES, q), (VLLM_PREFIX_CACHE_HITS, h)))
    old = VLLM_GPU_CACHE_USAGE  # older vLLM's name for the KV-cache usage
    text += f'# TYPE {old} gauge\n{old}{{engine="0"}} 0.2\n{old}{{engine="1"}} 0.4\n'
    figures = parse_engine_metrics(text)
    assert (figures.prefix_cache_queries, figures.prefix_cache_hits) == (1500, 700)
    assert figures.kv_cache_usage == pytest.approx(0.3)


def test_settings_come_from_the_environment() -> None:
    env = {"MODELFLEET_REPLICA_ID": "chat-7b-v13-abc", "MODELFLEET_REPLICA_IP": "10.2.3.4",
           "MODELFLEET_REGION": "eu-west-1", "MODELFLEET_MODEL": "chat-7b",
           "MODELFLEET_VERSION": "v13", "MODELFLEET_POOL": "chat-7b-v13",
           "MODELFLEET_CONTROL_PLANE_URL": "http://cp:8081", "MODELFLEET_BEAT_INTERVAL_S": "0.5",
           "MODELFLEET_HANDLE_SIGTERM": "0"}
    s = MiddlewareSettings.from_env(env)
    assert (s.replica_id, s.host, s.port, s.region, s.pool, s.beat_interval_s) == (
        "chat-7b-v13-abc", "10.2.3.4", 8000, "eu-west-1", "chat-7b-v13", 0.5)
    assert s.beats and not s.handle_sigterm and s.settle_url == ""
    assert not MiddlewareSettings.from_env({}).beats
    with pytest.raises(ValueError):
        MiddlewareSettings.from_env({"MODELFLEET_REPLICA_PORT": "eighty"})

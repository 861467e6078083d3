"""Settle reporting (the modelfleet middleware around the simulated engine): a request the gateway
admitted reports its real usage when it ends, however it ends; a request without a reservation
reports nothing; a failing gateway is retried, bounded."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from replica.chat import ReplicaConfig
from replica.params import CHAT_7B
from replica.server import serve_app
from replica.testing import serve_in_thread, sse_json
from replica_middleware.settings import MiddlewareSettings
from replica_middleware.settle import SettleReport, SettleReporter, settle_report

ADMITTED = {"x-modelfleet-reservation": "resv-1", "x-modelfleet-team": "search",
            "x-route-version": "chat-7b@v13", "x-modelfleet-tier": "interactive"}
CHAT = {"model": "chat-7b", "messages": [{"role": "user", "content": "Tell me a story."}]}


class Gateway:
    """A stand-in settle endpoint that records what it receives (and can fail first)."""

    def __init__(self, fail_first: int = 0) -> None:
        self.reports: list[dict[str, Any]] = []
        self.fail_first = fail_first
        self.app = FastAPI()

        self.posts = 0

        @self.app.post("/v1/settle")
        async def settle(request: Request) -> JSONResponse:
            if self.fail_first > 0:
                self.fail_first -= 1
                return JSONResponse({"detail": "down"}, status_code=503)
            self.posts += 1
            self.reports += (await request.json())["reports"]
            return JSONResponse({"results": []})

    def wait(self, count: int, timeout_s: float = 5.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        while len(self.reports) < count:
            assert time.monotonic() < deadline, f"{len(self.reports)} reports, wanted {count}"
            time.sleep(0.01)
        return self.reports


@pytest.fixture(scope="module")
def gateway() -> Iterator[tuple[Gateway, str]]:
    gw = Gateway()
    with serve_in_thread(gw.app) as url:
        yield gw, url


@pytest.fixture(scope="module")
def replica(gateway: tuple[Gateway, str]) -> Iterator[str]:
    config = ReplicaConfig(served_model_names=("chat-7b", "chat-7b@v13"), params=CHAT_7B,
                           model_version="v13", replica_id="chat-7b@v13-0", seed=1,
                           time_scale=20.0)
    settings = MiddlewareSettings(replica_id="chat-7b@v13-0", model="chat-7b", version="v13",
                                  settle_url=gateway[1] + "/v1/settle", handle_sigterm=False)
    with serve_in_thread(serve_app(config, settings)) as url:
        yield url


def test_report_needs_a_reservation() -> None:
    assert settle_report({}, 10, 0, 5, "finished") is None
    report = settle_report(ADMITTED, 10, 4, 5, "client_disconnect")
    assert report == SettleReport("resv-1", "search", "chat-7b", "v13", 10, 4, 5,
                                  "client_disconnect", "interactive")
    no_tier = {k: v for k, v in ADMITTED.items() if k != "x-modelfleet-tier"}
    assert settle_report(no_tier, 1, 0, 1, "finished") == SettleReport(
        "resv-1", "search", "chat-7b", "v13", 1, 0, 1, "finished", "standard")


def test_a_finished_stream_reports_what_the_client_saw(
        gateway: tuple[Gateway, str], replica: str) -> None:
    gw, _ = gateway
    before = len(gw.reports)
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}, "max_tokens": 30}
    r = httpx.post(replica + "/v1/chat/completions", json=body, headers=ADMITTED, timeout=30)
    usage = sse_json(r.text)[-1]["usage"]
    (report,) = gw.wait(before + 1)[before:]
    assert report == {"reservation_id": "resv-1", "team": "search", "model": "chat-7b",
                      "version": "v13", "prompt_tokens": usage["prompt_tokens"],
                      "cached_tokens": 0, "completion_tokens": usage["completion_tokens"],
                      "outcome": "finished", "tier": "interactive"}


def test_a_completion_reports_and_an_unadmitted_request_does_not(
        gateway: tuple[Gateway, str], replica: str) -> None:
    gw, _ = gateway
    before = len(gw.reports)
    httpx.post(replica + "/v1/chat/completions", json={**CHAT, "max_tokens": 5}, timeout=30)
    r = httpx.post(replica + "/v1/chat/completions", json={**CHAT, "max_tokens": 5},
                   headers={**ADMITTED, "x-modelfleet-reservation": "resv-2"}, timeout=30)
    (report,) = gw.wait(before + 1)[before:]
    assert report["reservation_id"] == "resv-2" and report["outcome"] == "finished"
    assert report["completion_tokens"] == r.json()["usage"]["completion_tokens"] == 5


def test_a_refused_request_settles_with_no_usage(
        gateway: tuple[Gateway, str], replica: str) -> None:
    gw, _ = gateway
    before = len(gw.reports)
    r = httpx.post(replica + "/v1/chat/completions", json={**CHAT, "max_tokens": 9000},
                   headers={**ADMITTED, "x-modelfleet-reservation": "resv-3"}, timeout=30)
    assert r.status_code == 400
    (report,) = gw.wait(before + 1)[before:]
    assert (report["outcome"], report["prompt_tokens"], report["completion_tokens"]) == (
        "rejected", 0, 0)


def test_a_client_that_leaves_mid_stream_is_settled_for_what_it_got(
        gateway: tuple[Gateway, str], replica: str) -> None:
    gw, _ = gateway
    before = len(gw.reports)
    body = {**CHAT, "stream": True, "max_tokens": 2000, "ignore_eos": True}
    received = 0
    headers = {**ADMITTED, "x-modelfleet-reservation": "resv-4"}
    with httpx.stream("POST", replica + "/v1/chat/completions", json=body, headers=headers,
                      timeout=30) as r:
        for line in r.iter_lines():
            choices = json.loads(line[6:])["choices"] if line.startswith("data: {") else []
            if choices and choices[0]["delta"].get("content"):  # a token, not the role chunk
                received += 1
            if received == 20:
                break
    (report,) = gw.wait(before + 1)[before:]
    assert report["outcome"] == "client_disconnect"
    assert received <= report["completion_tokens"] < received + 200  # not the 2,000 reserved
    assert report["prompt_tokens"] > 0


async def test_a_failing_gateway_is_retried_then_given_up() -> None:
    gw = Gateway(fail_first=2)
    transport = httpx.ASGITransport(app=gw.app)
    client = httpx.AsyncClient(transport=transport, base_url="http://gw")
    reporter = SettleReporter("http://gw/v1/settle", client, attempts=3, backoff_s=0.001,
                              linger_s=0.01)
    report = SettleReport("r", "t", "m", "v1", 1, 0, 1, "finished")
    reporter.report(report)
    reporter.report(report)  # within the linger: the same POST
    await asyncio.sleep(0.1)
    assert gw.reports == [dataclasses.asdict(report)] * 2 and reporter.sent == 2
    assert gw.posts == 1
    gw.fail_first = 10
    reporter.report(report)
    await reporter.aclose()
    assert reporter.dropped == 1 and len(gw.reports) == 2

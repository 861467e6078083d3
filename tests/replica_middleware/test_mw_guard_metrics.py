"""The rollout guard's inputs from a replica: vLLM's ``vllm:request_success_total{finished_reason}``
from the simulated engine, and the middleware's ``modelfleet_refusals_total`` from the answer's
opening text (any engine behind the middleware)."""

from __future__ import annotations

import json

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.types import Receive, Scope, Send

from modelfleet.contract.metrics import (
    FINISHED_ABORT,
    FINISHED_LENGTH,
    FINISHED_REASON_LABEL,
    FINISHED_REASONS,
    FINISHED_STOP,
    MODEL_NAME_LABEL,
    MODEL_VERSION_LABEL,
    REFUSALS,
    TRAFFIC_LABEL,
    VLLM_REQUEST_SUCCESS,
)
from replica.chat import ReplicaConfig
from replica.params import CHAT_7B
from replica.server import create_app
from replica_middleware.middleware import ModelfleetMiddleware
from replica_middleware.refusals import is_refusal, opening_text
from replica_middleware.settings import MiddlewareSettings

SETTINGS = MiddlewareSettings(replica_id="chat-7b@v14-0", host="10.0.0.7", port=8000,
                              region="us-east-1", model="chat-7b", version="v14",
                              handle_sigterm=False)
CHAT = {"model": "chat-7b", "messages": [{"role": "user", "content": "Tell me a story."}],
        "max_tokens": 20}


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Every sample called ``name`` in a Prometheus exposition, by its sorted labels."""
    return {tuple(sorted(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples
            if s.name == name}


@pytest.mark.parametrize(("text", "refused"), [
    ("I'm sorry, but I can't help with that request.", True),
    ("I\u2019m  unable to share that.", True),
    ("Sure! As an AI language model I cannot browse, but here is a summary.", True),
    ("Here is the story you asked for: once upon a time...", False),
    ("The sorry state of affairs: I can help with that.", False),
    ("x" * 200 + " I'm sorry, but I can't", False),  # past the opening
])
def test_a_refusal_is_a_listed_phrase_in_the_opening(text: str, refused: bool) -> None:
    assert is_refusal(text) is refused


def test_the_opening_is_read_from_a_completion_or_a_stream() -> None:
    body = json.dumps({"choices": [{"message": {"role": "assistant", "content": "Hello there"}}]})
    assert opening_text(body.encode(), stream=False) == "Hello there"
    chunks = [{"choices": [{"delta": {"role": "assistant"}}]},
              {"choices": [{"delta": {"content": "I'm sorry, "}}]},
              {"choices": [{"delta": {"content": "but I can't."}}]}]
    stream = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    assert opening_text(stream.encode(), stream=True) == "I'm sorry, but I can't."
    assert opening_text(b"data: {\"choi", stream=True) == ""  # cut: nothing, no error


async def test_the_simulated_engine_counts_finished_requests_by_reason() -> None:
    app = create_app(ReplicaConfig(("chat-7b", "chat-7b@v14"), CHAT_7B, "v14", seed=1,
                                   time_scale=200.0))
    mw = ModelfleetMiddleware(app, SETTINGS)
    async with app.router.lifespan_context(app):
        await mw.start()
        transport = httpx.ASGITransport(app=mw)
        async with httpx.AsyncClient(transport=transport, base_url="http://replica",
                                     timeout=30) as client:
            reasons = []
            for stream in (False, True, False):
                r = await client.post("/v1/chat/completions", json={**CHAT, "stream": stream})
                assert r.status_code == 200
                if stream:
                    events = [json.loads(line[6:]) for line in r.text.splitlines()
                              if line.startswith("data: {")]
                    reasons += [c["finish_reason"] for e in events for c in e["choices"]
                                if c.get("finish_reason")]
                else:
                    reasons.append(r.json()["choices"][0]["finish_reason"])
            text = (await client.get("/metrics")).text
        await mw.stop()
    success = samples(text, VLLM_REQUEST_SUCCESS)
    by_reason = {dict(k)[FINISHED_REASON_LABEL]: v for k, v in success.items()}
    assert set(by_reason) == set(FINISHED_REASONS)  # every series, from the start
    assert by_reason[FINISHED_ABORT] == 0
    assert by_reason[FINISHED_STOP] + by_reason[FINISHED_LENGTH] == 3
    assert by_reason[FINISHED_LENGTH] == reasons.count("length")
    assert all(dict(k)[MODEL_NAME_LABEL] == "chat-7b" for k in success)
    refusals = samples(text, REFUSALS)
    assert refusals == {((MODEL_VERSION_LABEL, "v14"), (TRAFFIC_LABEL, "served")): 0.0}


async def test_the_middleware_counts_an_engine_s_refusals() -> None:
    answers = iter(["I'm sorry, but I can't help with that.", "Once upon a time."])

    async def engine(scope: Scope, receive: Receive, send: Send) -> None:
        body = json.dumps({"id": "c1", "object": "chat.completion", "created": 1,
                           "model": "chat-7b", "choices": [{"index": 0, "finish_reason": "stop",
                           "message": {"role": "assistant", "content": next(answers)}}],
                           "usage": {"prompt_tokens": 5, "completion_tokens": 9,
                                     "total_tokens": 14}}).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})

    mw = ModelfleetMiddleware(engine, SETTINGS)
    transport = httpx.ASGITransport(app=mw)
    async with httpx.AsyncClient(transport=transport, base_url="http://replica") as client:
        for shadow in ("0", "1"):
            r = await client.post("/v1/chat/completions", json=CHAT,
                                  headers={"x-modelfleet-shadow": shadow})
            assert r.status_code == 200
    refusals = samples(mw.metrics.render().decode(), REFUSALS)
    assert refusals == {((MODEL_VERSION_LABEL, "v14"), (TRAFFIC_LABEL, "served")): 1.0,
                        ((MODEL_VERSION_LABEL, "v14"), (TRAFFIC_LABEL, "shadow")): 0.0}

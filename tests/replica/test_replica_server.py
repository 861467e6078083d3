"""The replica's HTTP API through an in-process ASGI transport: shapes, limits, errors, metrics."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from modelfleet.contract import tokens
from modelfleet.contract.metrics import (
    REPLICA_INFO,
    TOKENS_IN_FLIGHT,
    VLLM_E2E,
    VLLM_GENERATION_TOKENS,
    VLLM_ITL,
    VLLM_KV_CACHE_USAGE,
    VLLM_PREFIX_CACHE_HITS,
    VLLM_PREFIX_CACHE_QUERIES,
    VLLM_PROMPT_TOKENS,
    VLLM_RUNNING,
    VLLM_TTFT,
    VLLM_WAITING,
)
from replica.params import CHAT_7B
from replica.testing import sse_data, sse_json


def chat(content: str = "Tell me about prefix caching.", **fields: Any) -> dict[str, Any]:
    """A chat completion request body for chat-7b."""
    return {"model": "chat-7b", "messages": [{"role": "user", "content": content}], **fields}


async def post(client: httpx.AsyncClient, body: Any) -> httpx.Response:
    return await client.post("/v1/chat/completions", json=body)


async def test_non_streaming_completion_has_vllm_shape(client: httpx.AsyncClient) -> None:
    r = await post(client, chat(max_tokens=20))
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "chat.completion"
    assert body["id"].startswith("chatcmpl-")
    assert body["model"] == "chat-7b"
    (choice,) = body["choices"]
    assert choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] == "length"
    prompt = tokens.chat_prompt_ids([("user", "Tell me about prefix caching.")])
    assert body["usage"] == {"prompt_tokens": len(prompt), "completion_tokens": 20,
                             "total_tokens": len(prompt) + 20, "prompt_tokens_details": None}
    assert tokens.count(choice["message"]["content"]) == 20


async def test_response_names_the_model_the_request_used(client: httpx.AsyncClient) -> None:
    r = await post(client, {**chat(max_tokens=2), "model": "chat-7b@v13"})
    assert r.json()["model"] == "chat-7b@v13"
    no_model = chat(max_tokens=2)
    del no_model["model"]
    assert (await post(client, no_model)).json()["model"] == "chat-7b"


async def test_stream_sends_role_content_finish_usage_then_done(client: httpx.AsyncClient) -> None:
    r = await post(client, chat(max_tokens=12, stream=True, stream_options={"include_usage": True}))
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    data = sse_data(r.text)
    assert data[-1] == "[DONE]"
    chunks = sse_json(r.text)
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"] == [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                     "logprobs": None, "finish_reason": None}]
    content = [c for c in chunks[1:] if c["choices"]]
    assert all(c["choices"][0]["finish_reason"] is None for c in content[:-1])
    assert content[-1]["choices"][0]["finish_reason"] == "length"
    assert content[-1]["choices"][0]["stop_reason"] is None
    text = "".join(c["choices"][0]["delta"]["content"] for c in content)
    assert tokens.count(text) == 12
    usage_chunk = chunks[-1]
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"]["completion_tokens"] == 12
    assert usage_chunk["usage"]["total_tokens"] == usage_chunk["usage"]["prompt_tokens"] + 12
    # The streamed text is the non-streamed text.
    plain = (await post(client, chat(max_tokens=12))).json()
    assert plain["choices"][0]["message"]["content"] == text


async def test_stream_without_include_usage_has_no_usage_chunk(client: httpx.AsyncClient) -> None:
    r = await post(client, chat(max_tokens=5, stream=True))
    chunks = sse_json(r.text)
    assert all("usage" not in c and c["choices"] for c in chunks)
    assert sse_data(r.text)[-1] == "[DONE]"


async def test_natural_end_is_stop_with_no_stop_reason(client: httpx.AsyncClient) -> None:
    choice = (await post(client, chat())).json()["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] is None
    assert choice["message"]["content"].endswith(".")


async def test_stop_string_ends_the_answer_and_is_left_out(client: httpx.AsyncClient) -> None:
    full = (await post(client, chat(max_tokens=60, seed=5, ignore_eos=True))).json()
    words = full["choices"][0]["message"]["content"].split()
    stop = f"{words[10]} {words[11]}"
    for stream in (False, True):
        r = await post(client, chat(max_tokens=60, seed=5, ignore_eos=True, stop=[stop, "never-seen"],
                                    stream=stream))
        if stream:
            chunks = [c for c in sse_json(r.text) if c["choices"]]
            text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
            choice = chunks[-1]["choices"][0]
        else:
            choice = r.json()["choices"][0]
            text = choice["message"]["content"]
        assert choice["finish_reason"] == "stop"
        assert choice["stop_reason"] == stop
        assert stop not in text
        assert full["choices"][0]["message"]["content"].startswith(text)
    single = (await post(client, chat(max_tokens=60, seed=5, ignore_eos=True, stop=stop))).json()
    assert single["choices"][0]["finish_reason"] == "stop"


async def test_max_tokens_and_max_completion_tokens_give_length(client: httpx.AsyncClient) -> None:
    a = (await post(client, chat(max_tokens=3))).json()
    b = (await post(client, chat(max_completion_tokens=4, max_tokens=100))).json()
    assert (a["usage"]["completion_tokens"], a["choices"][0]["finish_reason"]) == (3, "length")
    assert (b["usage"]["completion_tokens"], b["choices"][0]["finish_reason"]) == (4, "length")


async def test_text_is_deterministic_for_a_seed(client: httpx.AsyncClient) -> None:
    async def text(**fields: Any) -> str:
        return str((await post(client, chat(max_tokens=30, **fields))).json()["choices"][0]["message"]["content"])

    assert await text(seed=42) == await text(seed=42)
    assert await text(seed=42) != await text(seed=43)
    assert await text() == await text()  # the replica's own seed
    assert await text(temperature=0, seed=1) == await text(temperature=0, seed=2)


async def test_second_turn_is_served_from_the_prefix_cache(client: httpx.AsyncClient) -> None:
    system = {"role": "system", "content": "You are a careful assistant. " * 60}
    turn1 = [system, {"role": "user", "content": "What is a KV cache?"}]
    first = (await post(client, {"model": "chat-7b", "messages": turn1, "max_tokens": 40})).json()
    assert first["usage"]["prompt_tokens_details"] is None
    answer = first["choices"][0]["message"]["content"]
    turn2 = [*turn1, {"role": "assistant", "content": answer}, {"role": "user", "content": "And a prefix cache?"}]
    r = await post(client, {"model": "chat-7b", "messages": turn2, "max_tokens": 5, "stream": True,
                            "stream_options": {"include_usage": True}})
    usage = sse_json(r.text)[-1]["usage"]
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    # The first prompt and the answer generated for it were both kept.
    assert cached >= ((first["usage"]["prompt_tokens"] + 40) // 16 - 1) * 16
    assert cached < usage["prompt_tokens"]


async def test_models_lists_every_served_name(client: httpx.AsyncClient) -> None:
    body = (await client.get("/v1/models")).json()
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == ["chat-7b", "chat-7b@v13"]
    card = body["data"][0]
    assert card["object"] == "model" and card["owned_by"] == "vllm"
    assert card["root"] == "chat-7b@v13" and card["max_model_len"] == 8192
    assert isinstance(card["created"], int)


async def test_health_is_200_with_empty_body(client: httpx.AsyncClient) -> None:
    r = await client.get("/health")
    assert r.status_code == 200 and r.content == b""


def sample(text: str, name: str) -> float:
    """Value of the first sample called ``name`` (with any labels) in a metrics page."""
    for line in text.splitlines():
        if line.split("{")[0].split(" ")[0] == name:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not exposed")


async def test_metrics_use_vllm_names_and_counters_move(client: httpx.AsyncClient) -> None:
    before = (await client.get("/metrics")).text
    for name in (VLLM_RUNNING, VLLM_WAITING, VLLM_KV_CACHE_USAGE, VLLM_PREFIX_CACHE_QUERIES,
                 VLLM_PREFIX_CACHE_HITS, VLLM_PROMPT_TOKENS, VLLM_GENERATION_TOKENS,
                 f"{VLLM_TTFT}_count", f"{VLLM_ITL}_count", f"{VLLM_E2E}_count"):
        assert sample(before, name) == 0, name
    assert f'# TYPE {VLLM_RUNNING} gauge' in before
    assert f'# TYPE {VLLM_PROMPT_TOKENS} counter' in before
    assert f'# TYPE {VLLM_TTFT} histogram' in before
    assert 'model_name="chat-7b"' in before
    assert f'{REPLICA_INFO}{{model_version="chat-7b@v13",region="local",replica_id="chat-7b-v13-0"}} 1.0' \
        in before
    usage = (await post(client, chat(max_tokens=10))).json()["usage"]
    after = (await client.get("/metrics")).text
    assert sample(after, VLLM_GENERATION_TOKENS) == 10
    assert sample(after, VLLM_PROMPT_TOKENS) == usage["prompt_tokens"]
    assert sample(after, VLLM_PREFIX_CACHE_QUERIES) == usage["prompt_tokens"]
    assert sample(after, f"{VLLM_TTFT}_count") == 1
    assert sample(after, f"{VLLM_ITL}_count") == 9
    assert sample(after, f"{VLLM_E2E}_count") == 1
    # Latencies are model seconds: ten steps of a 7B on its GPU, not the ~0.5 ms of wall time
    # they took at time scale 200.
    n = usage["prompt_tokens"]
    model_s = sum(CHAT_7B.step_seconds(n + k, n if k == 0 else 0) for k in range(10))
    assert sample(after, f"{VLLM_E2E}_sum") >= model_s * 0.999
    assert sample(after, VLLM_RUNNING) == 0


async def test_the_engine_alone_exports_no_tokens_in_flight(client: httpx.AsyncClient) -> None:
    # Like real vLLM: tokens in flight is the middleware's series (one per replica), so the
    # engine's page carries no series of its own for it, under any spelling.
    text = (await client.get("/metrics")).text
    assert "tokens_in_flight" not in text
    with pytest.raises(AssertionError):
        sample(text, TOKENS_IN_FLIGHT)


def assert_error(r: httpx.Response, status: int, err_type: str, param: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"}
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == status and err["type"] == err_type and err["message"]
    if param is not None:
        assert err["param"] == param
    return dict(err)


async def test_bad_bodies_get_400_in_vllm_error_shape(client: httpx.AsyncClient) -> None:
    malformed = await client.post("/v1/chat/completions", content=b'{"model": "chat-7b",',
                                  headers={"content-type": "application/json"})
    assert_error(malformed, 400, "Bad Request")
    assert_error(await post(client, {"model": "chat-7b"}), 400, "Bad Request", "body.messages")
    assert_error(await post(client, {"model": "chat-7b", "messages": "hello"}), 400, "Bad Request")
    assert_error(await post(client, chat(max_tokens="lots")), 400, "Bad Request", "body.max_tokens")
    assert_error(await post(client, chat(max_tokens=0)), 400, "BadRequestError", "max_tokens")
    assert_error(await post(client, chat(max_completion_tokens=-1)), 400, "BadRequestError",
                 "max_completion_tokens")
    err = assert_error(await post(client, chat(max_tokens=8190)), 400, "BadRequestError", "max_tokens")
    assert "maximum context length is 8192 tokens" in err["message"]
    assert_error(await post(client, chat("word " * 9000)), 400, "BadRequestError", "messages")
    assert_error(await post(client, chat(n=2)), 400, "BadRequestError", "n")
    assert_error(await post(client, chat(temperature=-1)), 400, "BadRequestError", "temperature")
    assert_error(await post(client, chat(stream_options={"include_usage": True})), 400, "BadRequestError")


async def test_unknown_model_is_404(client: httpx.AsyncClient) -> None:
    err = assert_error(await post(client, {**chat(), "model": "chat-7b@v99"}), 404, "NotFoundError", "model")
    assert err["message"] == "The model `chat-7b@v99` does not exist."


@pytest.mark.parametrize("path", ["/v1/completions-nope", "/nothing"])
async def test_unknown_paths_are_404_json(client: httpx.AsyncClient, path: str) -> None:
    assert_error(await client.get(path), 404, "Not Found")


async def test_content_parts_count_their_text(client: httpx.AsyncClient) -> None:
    parts = {"model": "chat-7b", "max_tokens": 1, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Hello there"}, {"type": "text", "text": "again"}]}]}
    plain = chat("Hello there\nagain", max_tokens=1)
    a = (await post(client, parts)).json()["usage"]["prompt_tokens"]
    b = (await post(client, plain)).json()["usage"]["prompt_tokens"]
    assert a == b

"""gateway_ext in the request path, through `modelfleet up` and the real Envoy with the openai
client: refusals (bodies, statuses, nothing charged), forged routing headers, the refund of an
answer shorter than its max_tokens, and the settle of a client that leaves mid-stream."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from modelfleet.contract.headers import PRIORITY_HEADER, UPSTREAM_CLUSTER_HEADER
from modelfleet.contract.tokens import chat_prompt_ids
from modelfleet.local.harness import RunningStack
from replica.generation import plan_output

pytestmark = pytest.mark.live

QUESTION = "Explain how a token bucket refunds what an answer did not use."


def api(stack: RunningStack, team: str = "support") -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.base_url, api_key=stack.key(team), max_retries=0,
                         timeout=30.0)


def metric(stack: RunningStack, name: str, **labels: str) -> float:
    """One sample of the gateway's /metrics (0 when absent)."""
    text = httpx.get(stack.gateway_url + "/metrics", timeout=5).text
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    match = re.search(rf"^modelfleet_gateway_{name}\{{{re.escape(wanted)}\}} (\S+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def bucket(stack: RunningStack, team: str, model: str = "chat-7b") -> dict[str, Any]:
    r = httpx.get(f"{stack.gateway_url}/v1/debug/buckets/{team}/{model}", timeout=5)
    r.raise_for_status()
    data: dict[str, Any] = r.json()
    return data


def poll(probe: Callable[[], Any], timeout_s: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (value := probe()):
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)
    return value


def error_of(exc: openai.APIStatusError) -> dict[str, Any]:
    body = exc.response.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert exc.response.headers["content-type"] == "application/json"
    error: dict[str, Any] = body["error"]
    return error


def test_refusals_are_openai_json_and_charge_nothing(stack: RunningStack) -> None:
    research = api(stack, "research")
    messages = [{"role": "user", "content": "hi"}]
    raw = httpx.post(stack.base_url + "/chat/completions", json={"model": "chat-7b"}, timeout=10)
    assert raw.status_code == 401 and raw.json()["error"]["code"] == "missing_api_key"
    stranger = openai.OpenAI(base_url=stack.base_url, api_key="mf-not-a-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as unknown:
        stranger.chat.completions.create(model="chat-7b", messages=messages)  # type: ignore[arg-type]
    assert error_of(unknown.value)["code"] == "invalid_api_key"
    with pytest.raises(openai.PermissionDeniedError) as forbidden:
        api(stack, "support").chat.completions.create(model="reason-70b", messages=messages)  # type: ignore[arg-type]
    assert error_of(forbidden.value)["type"] == "permission_error"

    cases: list[tuple[dict[str, Any], dict[str, str], str | None]] = [
        ({"model": "chat-7b", "messages": []}, {}, "messages"),
        ({"model": "chat-7b", "messages": messages, "max_tokens": 0}, {}, "max_tokens"),
        ({"model": "chat-7b", "messages": messages, "max_tokens": 4097}, {}, "max_tokens"),
        ({"model": "chat-7b", "messages": messages}, {PRIORITY_HEADER: "urgent"}, PRIORITY_HEADER),
    ]
    for body, headers, param in cases:
        with pytest.raises(openai.BadRequestError) as bad:
            research.chat.completions.create(**body, extra_headers=headers)
        assert error_of(bad.value)["param"] == param, body
    with pytest.raises(openai.NotFoundError) as missing:
        research.chat.completions.create(model="gpt-9", messages=messages)  # type: ignore[arg-type]
    assert error_of(missing.value)["code"] == "model_not_found"
    auth = {"authorization": f"Bearer {stack.key('research')}",
            "content-type": "application/json"}
    broken = httpx.post(stack.base_url + "/chat/completions", content=b'{"model": "chat-7b",',
                        headers=auth, timeout=10)
    assert broken.status_code == 400 and broken.json()["error"]["code"] == "invalid_json"
    huge = json.dumps({"model": "chat-7b", "messages": [
        {"role": "user", "content": "x" * (1 << 20)}]}).encode()
    too_large = httpx.post(stack.base_url + "/chat/completions", content=huge, headers=auth,
                           timeout=10)
    assert too_large.status_code == 413
    assert too_large.json()["error"]["code"] == "request_too_large"

    for team in ("research", "support"):  # no reservation was ever made for these teams
        assert not bucket(stack, team)["touched"], team
        assert metric(stack, "team_bucket_tokens_total", event="reserved", model="chat-7b",
                      team=team) == 0


def test_forged_routing_and_team_headers_are_ignored(stack: RunningStack) -> None:
    before = metric(stack, "team_bucket_tokens_total", event="reserved", model="chat-7b",
                    team="search")
    raw = api(stack, "search").chat.completions.with_raw_response.create(
        model="chat-7b@v13", messages=[{"role": "user", "content": "hi"}], max_tokens=3,
        extra_headers={"x-route-version": "reason-70b@v1", "x-modelfleet-team": "research",
                       "x-modelfleet-reservation": "someone-elses"})
    assert raw.headers[UPSTREAM_CLUSTER_HEADER] == "chat-7b@v13"
    assert int(raw.headers["x-ratelimit-remaining-tokens"]) < 6_000_000  # the gateway's, on 200
    assert metric(stack, "team_bucket_tokens_total", event="reserved", model="chat-7b",
                  team="search") > before
    assert not bucket(stack, "research")["touched"]


def stop_after(tokens: int, question: str) -> tuple[str, int]:
    """A stop string that ends the replica's greedy answer to ``question`` after about ``tokens``
    output tokens, and that answer's length (the replica's own deterministic generator)."""
    prompt = chat_prompt_ids([("user", question)])
    words = plan_output(prompt, max_tokens=4000, seed=0, temperature=0).text.split()
    best: tuple[int, str] = (10**9, "")
    for i in range(tokens - 15, tokens + 15):
        phrase = " ".join(words[i: i + 2])
        n = plan_output(prompt, max_tokens=4000, seed=0, temperature=0, stop=[phrase]).num_tokens
        best = min(best, (abs(n - tokens), phrase))
    length = plan_output(prompt, max_tokens=4000, seed=0, temperature=0, stop=[best[1]]).num_tokens
    return best[1], length


def test_an_answer_shorter_than_max_tokens_is_refunded(stack: RunningStack) -> None:
    stop, expected = stop_after(50, QUESTION)
    assert 35 <= expected <= 65
    labels = {"model": "chat-7b", "team": "support"}
    reserved0 = metric(stack, "team_bucket_tokens_total", event="reserved", **labels)
    refunded0 = metric(stack, "team_bucket_tokens_total", event="refunded", **labels)
    reply = api(stack).chat.completions.create(
        model="chat-7b@v13", messages=[{"role": "user", "content": QUESTION}],
        max_tokens=4000, temperature=0, stop=[stop])
    assert reply.usage is not None and reply.choices[0].finish_reason == "stop"
    assert reply.usage.completion_tokens == expected
    reserved = metric(stack, "team_bucket_tokens_total", event="reserved", **labels) - reserved0
    assert reserved == reply.usage.prompt_tokens + 4000
    refunded = poll(lambda: metric(stack, "team_bucket_tokens_total", event="refunded",
                                   **labels) - refunded0)
    charged = reserved - refunded
    assert charged == reply.usage.prompt_tokens + reply.usage.completion_tokens  # ~50 + prompt


def test_a_client_that_leaves_mid_stream_is_charged_what_it_received(
        stack: RunningStack) -> None:
    labels = {"model": "chat-7b", "team": "support"}
    output0 = metric(stack, "team_tokens_total", kind="output", **labels)
    reserved0 = metric(stack, "team_bucket_tokens_total", event="reserved", **labels)
    refunded0 = metric(stack, "team_bucket_tokens_total", event="refunded", **labels)
    body = {"model": "chat-7b@v13", "stream": True, "max_tokens": 3000, "ignore_eos": True,
            "messages": [{"role": "user", "content": QUESTION}]}
    headers = {"authorization": f"Bearer {stack.key('support')}"}
    received = 0
    with httpx.stream("POST", stack.base_url + "/chat/completions", json=body, headers=headers,
                      timeout=30) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and json.loads(line[6:])["choices"]:
                received += 1
            if received == 40:
                break
    output = poll(lambda: metric(stack, "team_tokens_total", kind="output", **labels) - output0)
    assert received <= output <= received + 100  # settled for what it got, not 3,000
    reserved = metric(stack, "team_bucket_tokens_total", event="reserved", **labels) - reserved0
    refunded = metric(stack, "team_bucket_tokens_total", event="refunded", **labels) - refunded0
    prompt = reserved - 3000
    assert reserved - refunded == prompt + output

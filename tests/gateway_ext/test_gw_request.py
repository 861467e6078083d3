"""Parsing a chat request: every 400/404/413, the defaults, headers and the prompt estimate."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from typing import Any

import pytest

from gateway_ext.prompt_tokens import (
    BytesEstimator,
    CachedChatMLEstimator,
    Message,
    simulated_chatml,
)
from gateway_ext.request import ChatRequest, parse_chat_request
from modelfleet.config import PlatformConfig
from modelfleet.contract import tokens
from modelfleet.contract.errors import ApiError, ErrorType
from modelfleet.contract.headers import CONVERSATION_HEADER, PRIORITY_HEADER

HELLO = [{"role": "user", "content": "Hello, world!"}]


def parse(config: PlatformConfig, body: Any, headers: dict[str, str] | None = None,
          **kwargs: Any) -> ChatRequest | ApiError:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return parse_chat_request(raw, headers or {}, config, **kwargs)


def ok(config: PlatformConfig, body: Any, headers: dict[str, str] | None = None,
       **kwargs: Any) -> ChatRequest:
    result = parse(config, body, headers, **kwargs)
    assert isinstance(result, ChatRequest), result
    return result


def test_a_minimal_request_gets_the_documented_defaults(platform_config: PlatformConfig) -> None:
    req = ok(platform_config, {"model": "chat-7b", "messages": HELLO})
    assert (req.model, req.version, req.tier, req.stream, req.n, req.conversation_id) == (
        "chat-7b", None, "standard", False, 1, None)
    assert req.prompt_tokens == 9  # <|im_start|> user Hello , world ! <|im_end|> <|im_start|> assistant
    assert (req.max_tokens, req.max_tokens_given) == (4096, False)
    assert req.reserve_tokens == 9 + 4096


def test_default_max_tokens_leaves_room_for_the_prompt_in_the_context(
        platform_config: PlatformConfig) -> None:
    long = [{"role": "user", "content": "word " * 6000}]
    req = ok(platform_config, {"model": "chat-7b", "messages": long})
    assert req.prompt_tokens == 6005
    assert req.max_tokens == 8192 - 6005  # max_model_len of chat-7b's live and canary versions
    huge = [{"role": "user", "content": "word " * 9000}]
    assert ok(platform_config, {"model": "chat-7b", "messages": huge}).max_tokens == 1


def test_explicit_fields_and_headers(platform_config: PlatformConfig) -> None:
    req = ok(platform_config,
             {"model": "reason-70b@v1", "messages": HELLO, "max_completion_tokens": 100,
              "max_tokens": 7, "n": 2, "stream": True, "temperature": 0.2},
             {"X-Priority": " Interactive ", CONVERSATION_HEADER: "conv-1"})
    assert (req.model, req.version, req.max_tokens, req.max_tokens_given, req.n, req.stream) == (
        "reason-70b", "v1", 100, True, 2, True)
    assert (req.tier, req.conversation_id) == ("interactive", "conv-1")
    assert req.reserve_tokens == req.prompt_tokens + 2 * 100


def test_content_parts_count_like_the_replica(platform_config: PlatformConfig) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Look:"},
                                     {"type": "image_url", "image_url": {"url": "x"}},
                                     {"type": "text", "text": "what is it?"}]},
        {"role": "assistant", "content": None},
    ]
    req = ok(platform_config, {"model": "chat-7b", "messages": messages})
    expected = len(tokens.chat_prompt_ids(
        [("system", "Be brief."), ("user", "Look:\nwhat is it?"), ("assistant", "")]))
    assert req.prompt_tokens == expected


@pytest.mark.parametrize("text", ["", "Hello, world!", "x" * 1000, "日本語のテキスト、です。",
                                  "def f(x):\n    return x ** 2  # ok?"])
def test_estimators(text: str) -> None:
    messages: Sequence[Message] = [Message("user", text)]
    exact = len(tokens.chat_prompt_ids([("user", text)]))
    assert simulated_chatml(messages) == exact
    assert BytesEstimator()(messages) >= exact


def test_an_estimator_plugs_in_per_model(platform_config: PlatformConfig) -> None:
    req = ok(platform_config, {"model": "chat-7b", "messages": HELLO},
             estimators={"chat-7b": lambda messages: 1000})
    assert req.prompt_tokens == 1000
    other = ok(platform_config, {"model": "reason-70b", "messages": HELLO},
               estimators={"chat-7b": lambda messages: 1000})
    assert other.prompt_tokens == 9


M = "chat-7b"
ERRORS: list[tuple[str, Any, dict[str, str], int, ErrorType, str | None, str]] = [
    ("not json", b"{nope", {}, 400, ErrorType.INVALID_REQUEST, None, "invalid_json"),
    ("not utf-8", b"\xff\xfe\xfa", {}, 400, ErrorType.INVALID_REQUEST, None, "invalid_json"),
    ("not an object", [1, 2], {}, 400, ErrorType.INVALID_REQUEST, None, "invalid_json"),
    ("no model", {"messages": HELLO}, {}, 400, ErrorType.INVALID_REQUEST, "model", "invalid_request"),
    ("model not a string", {"model": 7, "messages": HELLO}, {}, 400, ErrorType.INVALID_REQUEST,
     "model", "invalid_request"),
    ("unknown model", {"model": "gpt-9", "messages": HELLO}, {}, 404, ErrorType.NOT_FOUND, "model",
     "model_not_found"),
    ("unknown version", {"model": "chat-7b@v99", "messages": HELLO}, {}, 404, ErrorType.NOT_FOUND,
     "model", "model_not_found"),
    ("no messages", {"model": M}, {}, 400, ErrorType.INVALID_REQUEST, "messages", "invalid_request"),
    ("empty messages", {"model": M, "messages": []}, {}, 400, ErrorType.INVALID_REQUEST, "messages",
     "invalid_request"),
    ("messages not a list", {"model": M, "messages": "hi"}, {}, 400, ErrorType.INVALID_REQUEST,
     "messages", "invalid_request"),
    ("message not an object", {"model": M, "messages": ["hi"]}, {}, 400,
     ErrorType.INVALID_REQUEST, "messages[0]", "invalid_request"),
    ("no role", {"model": M, "messages": [{"content": "hi"}]}, {}, 400, ErrorType.INVALID_REQUEST,
     "messages[0].role", "invalid_request"),
    ("content a number", {"model": M, "messages": [*HELLO, {"role": "user", "content": 3}]}, {},
     400, ErrorType.INVALID_REQUEST, "messages[1].content", "invalid_request"),
    ("text part without text", {"model": M, "messages": [{"role": "user",
                                                           "content": [{"type": "text"}]}]}, {},
     400, ErrorType.INVALID_REQUEST, "messages[0].content", "invalid_request"),
    ("max_tokens zero", {"model": M, "messages": HELLO, "max_tokens": 0}, {}, 400,
     ErrorType.INVALID_REQUEST, "max_tokens", "invalid_request"),
    ("max_tokens float", {"model": M, "messages": HELLO, "max_tokens": 10.5}, {}, 400,
     ErrorType.INVALID_REQUEST, "max_tokens", "invalid_request"),
    ("max_tokens bool", {"model": M, "messages": HELLO, "max_tokens": True}, {}, 400,
     ErrorType.INVALID_REQUEST, "max_tokens", "invalid_request"),
    ("max_tokens string", {"model": M, "messages": HELLO, "max_tokens": "10"}, {}, 400,
     ErrorType.INVALID_REQUEST, "max_tokens", "invalid_request"),
    ("max_tokens above the model's", {"model": M, "messages": HELLO, "max_tokens": 4097}, {}, 400,
     ErrorType.INVALID_REQUEST, "max_tokens", "invalid_request"),
    ("max_completion_tokens negative", {"model": M, "messages": HELLO,
                                        "max_completion_tokens": -1}, {}, 400,
     ErrorType.INVALID_REQUEST, "max_completion_tokens", "invalid_request"),
    ("n zero", {"model": M, "messages": HELLO, "n": 0}, {}, 400, ErrorType.INVALID_REQUEST, "n",
     "invalid_request"),
    ("stream a string", {"model": M, "messages": HELLO, "stream": "yes"}, {}, 400,
     ErrorType.INVALID_REQUEST, "stream", "invalid_request"),
    ("bad tier", {"model": M, "messages": HELLO}, {PRIORITY_HEADER: "urgent"}, 400,
     ErrorType.INVALID_REQUEST, PRIORITY_HEADER, "invalid_priority"),
    ("conversation id too long", {"model": M, "messages": HELLO},
     {CONVERSATION_HEADER: "c" * 257}, 400, ErrorType.INVALID_REQUEST, CONVERSATION_HEADER,
     "invalid_request"),
]


@pytest.mark.parametrize(("body", "headers", "status", "type_", "param", "code"),
                         [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_errors(platform_config: PlatformConfig, body: Any, headers: dict[str, str], status: int,
                type_: ErrorType, param: str | None, code: str) -> None:
    error = parse(platform_config, body, headers)
    assert isinstance(error, ApiError)
    assert (error.status, error.type, error.param, error.code) == (status, type_, param, code)
    body_json = error.body()
    assert set(body_json["error"]) == {"message", "type", "param", "code"}
    assert body_json["error"]["type"] == type_.value and body_json["error"]["message"]


def test_body_size_limit_is_413_and_configurable(platform_config: PlatformConfig) -> None:
    body = json.dumps({"model": M, "messages": [{"role": "user", "content": "x" * 2_000_000}]})
    error = parse(platform_config, body.encode())
    assert isinstance(error, ApiError)
    assert (error.status, error.code) == (413, "request_too_large")
    small = json.dumps({"model": M, "messages": HELLO}).encode()
    assert isinstance(parse(platform_config, small, max_body_bytes=len(small)), ChatRequest)
    error = parse(platform_config, small, max_body_bytes=len(small) - 1)
    assert isinstance(error, ApiError) and error.status == 413


def test_max_tokens_up_to_the_model_limit_is_accepted(platform_config: PlatformConfig) -> None:
    assert ok(platform_config, {"model": "reason-70b", "messages": HELLO,
                                "max_tokens": 8192}).max_tokens == 8192
    assert ok(platform_config, {"model": M, "messages": HELLO, "max_tokens": None}).max_tokens == 4096


def test_the_cached_estimator_counts_exactly_like_the_replica() -> None:
    rng = random.Random(5)
    alphabet = ["word", "x", "<|im_end|>", "<|im_start|>", "<|", "|>", "<", "|", ">", ",", "!",
                " ", "\n", "\t", "日本", "_", "9", "é", ""]
    cached = CachedChatMLEstimator(max_entries=50)
    history: list[Message] = []
    for _ in range(300):
        content = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 30)))
        role = rng.choice(["user", "assistant", "system", "tool"])
        history = [*history[-8:], Message(role, content)]
        expected = len(tokens.chat_prompt_ids([(m.role, m.content) for m in history]))
        assert cached(history) == simulated_chatml(history) == expected
    assert len(cached) == 50

"""The replica under a real uvicorn on loopback: the official openai client, disconnects, the CLI."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import openai
import pytest

from modelfleet.contract.metrics import (
    TOKENS_IN_FLIGHT,
    VLLM_GENERATION_TOKENS,
    VLLM_KV_CACHE_USAGE,
    VLLM_RUNNING,
)
from replica.__main__ import config_from_args, parse_args
from replica.params import CHAT_7B, REASON_70B


def metric(base: str, name: str) -> float:
    for line in httpx.get(base + "/metrics").text.splitlines():
        if line.split("{")[0].split(" ")[0] == name:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(name)


def test_openai_client_streams_role_tokens_finish_and_usage(live_url: str) -> None:
    client = openai.OpenAI(base_url=live_url + "/v1", api_key="unused")
    stream = client.chat.completions.create(
        model="chat-7b@v13",
        messages=[{"role": "user", "content": "Say something about GPUs."}],
        max_tokens=25,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    with_choices = [c for c in chunks if c.choices]
    assert with_choices[-1].choices[0].finish_reason == "length"
    assert all(c.choices[0].finish_reason is None for c in with_choices[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 25
    assert {c.model for c in chunks} == {"chat-7b@v13"}
    text = "".join(c.choices[0].delta.content or "" for c in with_choices)

    again = client.chat.completions.create(
        model="chat-7b@v13", messages=[{"role": "user", "content": "Say something about GPUs."}], max_tokens=25)
    assert again.choices[0].message.content == text
    assert again.choices[0].finish_reason == "length"
    assert again.usage is not None and again.usage.completion_tokens == 25
    assert [m.id for m in client.models.list()] == ["chat-7b", "chat-7b@v13"]


def test_openai_client_sees_errors_as_its_exceptions(live_url: str) -> None:
    client = openai.OpenAI(base_url=live_url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="chat-7b", messages=[{"role": "user", "content": "hi"}], max_tokens=0)
    assert "max_tokens" in str(info.value)


def test_client_disconnect_frees_kv_and_leaves_the_batch(slow_served_url: str) -> None:
    body = {"model": "chat-7b", "messages": [{"role": "user", "content": "x " * 2000}],
            "max_tokens": 5000, "ignore_eos": True, "stream": True}
    with httpx.Client(base_url=slow_served_url, timeout=10) as client, \
            client.stream("POST", "/v1/chat/completions", json=body) as r:
        lines = r.iter_lines()
        for _ in range(3):
            next(lines)
        assert metric(slow_served_url, VLLM_RUNNING) == 1
        assert metric(slow_served_url, VLLM_KV_CACHE_USAGE) > 0
        assert metric(slow_served_url, TOKENS_IN_FLIGHT) > 2000  # the middleware's count
    deadline = time.monotonic() + 5
    while metric(slow_served_url, VLLM_RUNNING) != 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert metric(slow_served_url, VLLM_RUNNING) == 0
    assert metric(slow_served_url, VLLM_KV_CACHE_USAGE) == 0
    deadline = time.monotonic() + 5
    while metric(slow_served_url, TOKENS_IN_FLIGHT) != 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert metric(slow_served_url, TOKENS_IN_FLIGHT) == 0


def test_non_streaming_client_that_gives_up_is_dropped_too(live_url: str) -> None:
    body = {"model": "chat-7b", "messages": [{"role": "user", "content": "long one"}],
            "max_tokens": 8000, "ignore_eos": True}
    generated = metric(live_url, VLLM_GENERATION_TOKENS)
    with pytest.raises(httpx.TimeoutException):
        httpx.post(live_url + "/v1/chat/completions", json=body, timeout=0.2)
    deadline = time.monotonic() + 5
    while metric(live_url, VLLM_RUNNING) != 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert metric(live_url, VLLM_RUNNING) == 0
    assert metric(live_url, VLLM_KV_CACHE_USAGE) == 0
    assert metric(live_url, VLLM_GENERATION_TOKENS) - generated < 8000  # stopped early


def test_flags_build_the_replica_config() -> None:
    args = parse_args(["--port", "9000", "--served-model-name", "chat-7b", "chat-7b@v13",
                       "--model-version", "chat-7b@v13", "--replica-id", "r1", "--region", "eu",
                       "--seed", "3", "--time-scale", "10", "--preset", "reason-70b",
                       "--engine-params", '{"max_num_seqs": 64}'])
    config = config_from_args(args)
    assert config.served_model_names == ("chat-7b", "chat-7b@v13")
    assert config.params == REASON_70B.with_overrides({"max_num_seqs": 64})
    assert (config.model_version, config.replica_id, config.region, config.seed, config.time_scale) == \
        ("chat-7b@v13", "r1", "eu", 3, 10.0)
    default = config_from_args(parse_args([]))
    assert default.served_model_names == ("chat-7b",) and default.params == CHAT_7B
    with pytest.raises(ValueError):
        config_from_args(parse_args(["--engine-params", '{"nope": 1}']))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_python_m_replica_serves_and_stops_cleanly_on_sigterm() -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "replica", "--port", str(port), "--served-model-name", "chat-7b",
         "--time-scale", "100", "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 15
        while True:
            try:
                if httpx.get(base + "/health", timeout=0.5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "replica did not start"
            time.sleep(0.05)
        r = httpx.post(base + "/v1/chat/completions", timeout=10, json={
            "model": "chat-7b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert r.json()["usage"]["completion_tokens"] == 4
        proc.send_signal(signal.SIGTERM)
        # uvicorn shuts down gracefully, then re-raises the signal it caught.
        assert proc.wait(timeout=10) in (0, -signal.SIGTERM)
        assert proc.stdout is not None and proc.stdout.read() == b""  # logs go to stderr only
        assert proc.stderr is not None and b"Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_bad_flags_exit_with_a_message() -> None:
    r = subprocess.run([sys.executable, "-m", "replica", "--engine-params", "{bad"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2
    assert "engine params" in r.stderr

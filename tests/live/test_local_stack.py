"""The local stack end to end: the official openai client through a real Envoy (every request
checked by gateway_ext with a dev key) to the replicas."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import httpx
import openai
import pytest

from modelfleet.contract.headers import (
    CONVERSATION_HEADER,
    UPSTREAM_CLUSTER_HEADER,
    UPSTREAM_REPLICA_HEADER,
)
from modelfleet.local.harness import RunningStack, assert_all_stopped, start_stack, write_config

pytestmark = pytest.mark.live

REPLICA_HEADER = UPSTREAM_REPLICA_HEADER
CLUSTER_HEADER = UPSTREAM_CLUSTER_HEADER


def client(stack: RunningStack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.base_url, api_key=stack.key("search"), max_retries=0,
                         timeout=30.0)


def test_facts_file_names_every_process(stack: RunningStack) -> None:
    facts = stack.facts
    assert facts["base_url"].endswith("/v1")
    roles = Counter(p["role"] for p in facts["processes"])
    assert roles == {"control-plane": 1, "gateway": 1, "envoy": 1, "replica": 5, "batch": 1}
    assert set(facts["keys"]) == {"search", "support", "research"}
    assert facts["gateway"]["url"].startswith("http://127.0.0.1:")
    assert facts["usage_db_url"].endswith(".modelfleet/usage.db")  # what `modelfleet usage` reads
    targets = Counter(p.get("model_version") for p in facts["processes"] if p["role"] == "replica")
    assert targets == {"chat-7b@v13": 3, "chat-7b@v14": 1, "reason-70b@v1": 1}
    assert all(p["pid"] > 0 and p["port"] > 0 for p in facts["processes"])


def test_stream_a_chat_through_envoy_with_the_openai_client(stack: RunningStack) -> None:
    stream = client(stack).chat.completions.create(
        model="chat-7b@v13",
        messages=[{"role": "user", "content": "Tell me about continuous batching."}],
        max_tokens=40,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes in (["length"], ["stop"])
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None
    assert usage.prompt_tokens > 0 and 0 < usage.completion_tokens <= 40
    assert text.strip()


def test_raw_stream_ends_with_done(stack: RunningStack) -> None:
    body = {"model": "chat-7b", "stream": True, "max_tokens": 8,
            "messages": [{"role": "user", "content": "hi"}]}
    headers = {"authorization": f"Bearer {stack.key('search')}"}
    with httpx.stream("POST", f"{stack.base_url}/chat/completions", json=body, headers=headers,
                      timeout=30.0) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[0][6:])["choices"][0]["delta"]["role"] == "assistant"


def test_one_conversation_stays_on_one_replica_for_twenty_turns(stack: RunningStack) -> None:
    api = client(stack)
    messages: list[dict[str, str]] = [{"role": "system", "content": "You are a helpful assistant."}]
    seen: set[str] = set()
    cached: list[int] = []
    for turn in range(20):
        messages.append({"role": "user", "content": f"Question {turn}: what happens next?"})
        raw = api.chat.completions.with_raw_response.create(
            model="chat-7b", messages=messages, max_tokens=12,  # type: ignore[arg-type]
            extra_headers={CONVERSATION_HEADER: "conversation-sticky-1"},
        )
        seen.add(raw.headers[REPLICA_HEADER] + "/" + raw.headers[CLUSTER_HEADER])
        reply = raw.parse()
        details = reply.usage.prompt_tokens_details if reply.usage else None
        cached.append(details.cached_tokens or 0 if details else 0)
        messages.append({"role": "assistant", "content": reply.choices[0].message.content or ""})
    assert len(seen) == 1, seen
    # the same replica holds the conversation's history: later turns hit its prefix cache
    assert min(cached[1:]) > 0


def test_different_conversations_spread_over_every_replica(stack: RunningStack) -> None:
    api = client(stack)
    replicas: Counter[str] = Counter()
    for i in range(60):
        raw = api.chat.completions.with_raw_response.create(
            model="chat-7b@v13", messages=[{"role": "user", "content": "hello"}], max_tokens=2,
            extra_headers={CONVERSATION_HEADER: f"spread-{i}"},
        )
        replicas[raw.headers[REPLICA_HEADER]] += 1
    live = {p["replica_id"] for p in stack.facts["processes"] if p.get("model_version") == "chat-7b@v13"}
    assert set(replicas) == live, replicas


def test_status_shows_processes_and_envoys_view(stack: RunningStack) -> None:
    exe = Path(sys.executable).parent / "modelfleet"
    out = subprocess.run([str(exe), "status", "--json"], cwd=stack.cwd, capture_output=True, text=True,
                         check=True)
    report = json.loads(out.stdout)
    assert all(p["alive"] for p in report["processes"])
    clusters = {c["cluster"]: c["hosts"] for c in report["envoy"]}
    assert len(clusters["chat-7b@v13"]) == 3 and len(clusters["chat-7b@v14"]) == 1
    assert {h["health"] for h in clusters["chat-7b@v13"]} == {"HEALTHY"}
    text = subprocess.run([str(exe), "status"], cwd=stack.cwd, capture_output=True, text=True, check=True).stdout
    assert "chat-7b@v13-0" in text and "v14 10%" in text
    assert any(p["role"] == "gateway" and p["alive"] for p in report["processes"])
    assert report["gateway"]["status"] == "ok" and "GATEWAY http://127.0.0.1:" in text
    assert report["batch"]["status"] == "ok" and "BATCH   http://127.0.0.1:" in text


def test_sigterm_stops_every_child(tmp_path: Path) -> None:
    config = write_config(tmp_path / "config", replicas={"chat-7b@v13": 1, "chat-7b@v14": 1, "reason-70b@v1": 1},
                          time_scale=20.0)
    running = start_stack(tmp_path, config)
    assert len(running.child_pids()) == 7  # control plane, gateway, batch, 3 replicas, Envoy
    assert running.stop(signal.SIGTERM) == 0
    assert_all_stopped(running)


def test_admin_api_takes_the_stacks_admin_token_not_a_team_key(stack: RunningStack) -> None:
    url = stack.facts["admin_url"] + "/admin/pools/chat-7b/state"
    admin = httpx.get(url, headers={"authorization": f"Bearer {stack.facts['admin_token']}"}, timeout=5)
    assert admin.status_code == 200 and admin.json()["model"] == "chat-7b"
    team_key = next(iter(stack.facts["keys"].values()))
    assert httpx.get(url, headers={"authorization": f"Bearer {team_key}"}, timeout=5).status_code == 403
    assert httpx.get(url, timeout=5).status_code == 401

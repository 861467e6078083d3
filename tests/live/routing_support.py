"""Helpers of the live routing tests: a stack config with a shadow version, the openai client,
one streamed turn with what the final event says, and reads of the gateway's and replicas' state."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

import httpx
import openai
from openai import AsyncStream
from openai.types.chat import ChatCompletionChunk

from gateway_ext.routing.picking import build_ring, ring_order
from modelfleet.contract.headers import CONVERSATION_HEADER
from modelfleet.local.harness import RunningStack, edit_yaml, write_config

KEY_TEAM = "search"
SHADOW_HASH = "sha256:" + "5" * 64


def routing_config(dest: Path, replicas: dict[str, int], time_scale: float,
                   shadow_fraction: float | None = None) -> Path:
    """The example config with ``replicas`` and, with ``shadow_fraction``, a version v15 of
    chat-7b that shadows v13."""
    config = write_config(dest, replicas=replicas, time_scale=time_scale)
    if shadow_fraction is None:
        return config

    def add_shadow(data: Any) -> None:
        chat = next(m for m in data["models"] if m["name"] == "chat-7b")
        chat["shadow"] = {"version": "v15", "fraction": shadow_fraction}
        v14 = next(v for v in data["versions"] if v["model"] == "chat-7b" and v["version"] == "v14")
        data["versions"].append({**v14, "version": "v15", "status": "shadow",
                                 "weights_uri": "s3://modelfleet-weights/chat-7b/v15/",
                                 "weights_hash": SHADOW_HASH})

    edit_yaml(config / "models.yaml", add_shadow)
    return config


def set_canary(config: Path, percent: float) -> None:
    """Change chat-7b's canary percent in the stack's config directory (the control plane
    reloads it on its own)."""
    def edit(data: Any) -> None:
        chat = next(m for m in data["models"] if m["name"] == "chat-7b")
        chat["canary"]["percent"] = percent

    edit_yaml(config / "models.yaml", edit)


def aclient(stack: RunningStack) -> openai.AsyncOpenAI:
    """The official async client on the stack's API with the search team's dev key."""
    return openai.AsyncOpenAI(base_url=stack.base_url, api_key=stack.key(KEY_TEAM),
                              max_retries=0, timeout=60.0)


@dataclass
class Turn:
    """What one streamed answer said: its text, and the final event's fields."""

    text: str = ""
    replica_id: str | None = None
    model_version: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    chunks: int = 0
    error: str | None = None
    final: dict[str, Any] = field(default_factory=dict)


async def stream_turn(client: openai.AsyncOpenAI, conversation: str | None,
                      messages: list[dict[str, str]], max_tokens: int = 12,
                      model: str = "chat-7b", **extra: Any) -> Turn:
    """One streamed request; exceptions end up in ``Turn.error``."""
    turn = Turn()
    headers = {CONVERSATION_HEADER: conversation} if conversation else {}
    headers.update(extra.pop("extra_headers", {}))
    try:
        stream = cast(AsyncStream[ChatCompletionChunk], await client.chat.completions.create(
            model=model, messages=messages, max_tokens=max_tokens, stream=True,  # type: ignore[arg-type]
            extra_headers=headers, **extra))
        async for chunk in stream:
            if chunk.choices:
                turn.chunks += 1
                turn.text += chunk.choices[0].delta.content or ""
            elif chunk.usage is not None:
                turn.final = dict(chunk.model_extra or {})
                turn.replica_id = turn.final.get("replica_id")
                turn.model_version = turn.final.get("model_version")
                usage = chunk.usage
                turn.prompt_tokens, turn.completion_tokens = usage.prompt_tokens, usage.completion_tokens
                turn.cached_tokens = int((usage.model_extra or {}).get("cached_tokens", 0))
    except openai.APIError as exc:
        turn.error = f"{type(exc).__name__} ({exc.code}): {exc}"
    return turn


T = TypeVar("T")


async def gather_limited(jobs: Sequence[Callable[[], Awaitable[T]]], limit: int) -> list[T]:
    """Run the coroutine factories ``jobs`` with at most ``limit`` at a time."""
    gate = asyncio.Semaphore(limit)

    async def run(job: Callable[[], Awaitable[T]]) -> T:
        async with gate:
            return await job()

    return await asyncio.gather(*(run(j) for j in jobs))


def routing_view(stack: RunningStack) -> dict[str, Any]:
    """The gateway's ``/v1/debug/routing``."""
    data: dict[str, Any] = httpx.get(stack.gateway_url + "/v1/debug/routing", timeout=5).json()
    return data


def router_state(stack: RunningStack) -> dict[str, Any]:
    """The control plane's ``/v1/router/state`` (raises when it is down)."""
    url = str(stack.facts["control_plane"]["http_url"])
    data: dict[str, Any] = httpx.get(url + "/v1/router/state", timeout=5).json()
    return data


def last_beat_age_s(stack: RunningStack, replica_id: str) -> float:
    """Seconds since the control plane heard ``replica_id`` (admin pool state)."""
    url = str(stack.facts["control_plane"]["http_url"])
    auth = {"authorization": f"Bearer {stack.facts['admin_token']}"}
    state = httpx.get(url + "/admin/pools/chat-7b/state", headers=auth, timeout=5).json()
    return float(next(r for r in state["replicas"] if r["replica_id"] == replica_id)
                 ["last_beat_age_s"])


def routable(stack: RunningStack, pool: str = "chat-7b@v13") -> list[str]:
    """Replica ids of ``pool`` in the control plane's router state."""
    return [r["replica_id"] for r in router_state(stack)["pools"][pool]["replicas"]]


def homed_on(replica_ids: list[str], target: str, prefix: str, count: int) -> list[str]:
    """``count`` conversation ids whose own replica on the ring of ``replica_ids`` is ``target``."""
    ring = build_ring(replica_ids)
    out: list[str] = []
    i = 0
    while len(out) < count:
        cid = f"{prefix}-{i}"
        if ring_order(ring, cid)[0] == target:
            out.append(cid)
        i += 1
    return out


def replica_port(stack: RunningStack, replica_id: str) -> int:
    """The port of a replica process of the stack."""
    return int(next(p["port"] for p in stack.facts["processes"] if p.get("replica_id") == replica_id))


def replica_metric(stack: RunningStack, replica_id: str, name: str, **labels: str) -> float:
    """One sample of a replica's ``/metrics`` (0 when absent)."""
    text = httpx.get(f"http://127.0.0.1:{replica_port(stack, replica_id)}/metrics", timeout=5).text
    total = 0.0
    for line in text.splitlines():
        match = re.match(rf"^{re.escape(name)}(?:\{{(.*)\}})? (\S+)$", line)
        if match and all(f'{k}="{v}"' in (match.group(1) or "") for k, v in labels.items()):
            total += float(match.group(2))
    return total


def engine(stack: RunningStack, replica_id: str, **body: Any) -> dict[str, Any]:
    """``POST /v1/debug/engine`` on a replica (slow it down, make it fail)."""
    r = httpx.post(f"http://127.0.0.1:{replica_port(stack, replica_id)}/v1/debug/engine",
                   json=body, timeout=5)
    r.raise_for_status()
    data: dict[str, Any] = r.json()
    return data


def wait_for(probe: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.05) -> Any:
    """Poll ``probe`` until truthy; fail with ``what`` after ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = probe()
        except httpx.HTTPError:
            value = None
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        time.sleep(interval_s)

"""Helpers of the control-plane outage test: steady load at a bounded rate from a thread (the
openai client, streaming and not), a second gateway process started from the router-state file,
and Envoy's ACK of the control plane's current snapshot."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import openai

from modelfleet.contract.headers import CONVERSATION_HEADER
from modelfleet.local.harness import RunningStack, edit_yaml
from modelfleet.local.processes import free_port
from modelfleet.local.replicas import gateway_argv

if TYPE_CHECKING:
    import tests.live.routing_support as rs
else:  # pytest puts tests/live on sys.path
    import routing_support as rs

ENVOY_NODE = "modelfleet-local-envoy-0"


@dataclass(frozen=True)
class Timed:
    """One request of the load: when it started and ended (monotonic seconds), what it got."""

    started: float
    ended: float
    stream: bool
    turn: rs.Turn


async def complete_turn(client: openai.AsyncOpenAI, conversation: str,
                        messages: list[dict[str, str]], max_tokens: int = 12) -> rs.Turn:
    """One non-streamed request; the body's ``replica_id`` / ``model_version`` into a Turn."""
    turn = rs.Turn()
    try:
        answer = await client.chat.completions.create(
            model="chat-7b", messages=messages, max_tokens=max_tokens,  # type: ignore[arg-type]
            extra_headers={CONVERSATION_HEADER: conversation})
        extra = dict(answer.model_extra or {})
        turn.text = answer.choices[0].message.content or ""
        turn.replica_id, turn.model_version = extra.get("replica_id"), extra.get("model_version")
        turn.final = extra
    except openai.APIError as exc:
        turn.error = f"{type(exc).__name__} ({exc.code}): {exc}"
    return turn


class Load:
    """``users`` clients in a thread, each sending a turn then thinking ``think_s`` seconds
    (a bounded rate: at most ``users / think_s`` requests a second); even users stream."""

    def __init__(self, stack: RunningStack, users: int = 6, think_s: float = 1.0) -> None:
        self.stack, self.users, self.think_s = stack, users, think_s
        self.done: list[Timed] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def start(self) -> Load:
        self._thread.start()
        return self

    def stop(self) -> list[Timed]:
        """Stop sending, wait for the requests in flight; returns every request made."""
        self._stop.set()
        self._thread.join(timeout=60)
        assert not self._thread.is_alive(), "the load did not stop"
        return self.done

    def served_between(self, start: float, end: float) -> list[Timed]:
        """Requests that started and ended within [start, end] (monotonic seconds)."""
        return [t for t in list(self.done) if t.started >= start and t.ended <= end]

    async def _run(self) -> None:
        client = rs.aclient(self.stack)
        await asyncio.gather(*(self._user(client, u) for u in range(self.users)))
        await client.close()

    async def _user(self, client: openai.AsyncOpenAI, user: int) -> None:
        t = 0
        stream = user % 2 == 0
        while not self._stop.is_set():
            conversation = f"outage-{user}-{t // 4}"  # 4 turns per conversation
            messages = [{"role": "user", "content": f"user {user} turn {t}"}]
            started = time.monotonic()
            turn = (await rs.stream_turn(client, conversation, messages) if stream
                    else await complete_turn(client, conversation, messages))
            self.done.append(Timed(started, time.monotonic(), stream, turn))
            t += 1
            await asyncio.sleep(self.think_s)


def drop_canary_add_shadow(config: Path, fraction: float) -> None:
    """Config change: chat-7b's canary v14 ends and v14 shadows ``fraction`` of the traffic
    instead (an alias change for the gateways, a route change for Envoy)."""
    def edit(data: Any) -> None:
        chat = next(m for m in data["models"] if m["name"] == "chat-7b")
        chat.pop("canary", None)
        chat["shadow"] = {"version": "v14", "fraction": fraction}

    edit_yaml(config / "models.yaml", edit)


def envoy_acked(stack: RunningStack) -> str | None:
    """The control plane's snapshot version once the stack's Envoy is connected and has ACKed
    every resource type of it; None before."""
    url = str(stack.facts["control_plane"]["http_url"])
    status = httpx.get(url + "/v1/xds/status", timeout=5).json()
    node = status["nodes"].get(ENVOY_NODE)
    if not status["converged"] or node is None or not node["connected"]:
        return None
    for kind, version in status["snapshot"]["types"].items():
        if version and node["types"].get(kind, {}).get("acked_version") != version:
            return None
    return str(status["snapshot"]["version"])


class SecondGateway:
    """Another gateway_ext process of the stack (its own port, spool and usage file), started
    while the control plane is down: it can only take the router-state file."""

    def __init__(self, stack: RunningStack) -> None:
        cwd = stack.cwd
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = gateway_argv(Path(stack.facts["config_dir"]), "127.0.0.1", self.port,
                            f"sqlite:///{cwd / 'gateway-2-usage.db'}",
                            cwd / "gateway-2-spool.jsonl", "local",
                            control_plane_url=str(stack.facts["control_plane"]["http_url"]),
                            router_state_file=cwd / ".modelfleet" / "router-state.json")
        self.log = cwd / "gateway-2.log"
        with self.log.open("wb") as fh:
            self.popen = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, cwd=cwd,
                                          env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def health(self) -> dict[str, Any]:
        assert self.popen.poll() is None, self.log.read_text()
        data: dict[str, Any] = httpx.get(self.url + "/health", timeout=2).json()
        return data

    def check(self, key: str, conversation: str) -> httpx.Response:
        """The ext_authz check Envoy would send for one chat request."""
        body = {"model": "chat-7b", "max_tokens": 12,
                "messages": [{"role": "user", "content": "hello"}]}
        return httpx.post(self.url + "/authz/v1/chat/completions", content=json.dumps(body),
                          headers={"authorization": f"Bearer {key}",
                                   CONVERSATION_HEADER: conversation}, timeout=10)

    def stop(self) -> None:
        """SIGTERM by PID, SIGKILL after 15 s."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()

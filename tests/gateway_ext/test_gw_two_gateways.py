"""Two real ``python -m gateway_ext`` processes sharing one Redis (a region's pods): a team's
max_concurrency holds across them, a settle sent to the process that did not admit the request
frees the slot at once (and the admitting process's pool slot), and they split pool capacity."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from modelfleet.local.harness import edit_yaml, write_config
from modelfleet.local.processes import free_port

# explicitly v13: "chat-7b" alone would send ~10% of these id-less requests to the v14 canary
CHAT = {"model": "chat-7b@v13", "max_tokens": 100, "messages": [{"role": "user", "content": "Hi!"}]}
PROMPT = 7
POOL = "chat-7b@v13"


def _until(ready: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _health(url: str) -> dict[str, Any] | None:
    try:
        return httpx.get(f"{url}/health", timeout=2.0).json()  # type: ignore[no-any-return]
    except httpx.HTTPError:
        return None


@pytest.fixture
def gateways(tmp_path: Path, redis_url: str, redis_prefix: str
             ) -> Iterator[list[tuple[str, subprocess.Popen[bytes]]]]:
    """Two gateways on one Redis prefix, search limited to 2 open requests on chat-7b."""
    config = write_config(tmp_path / "config")

    def limit(data: Any) -> None:
        search = next(t for t in data["teams"] if t["name"] == "search")
        next(lim for lim in search["limits"] if lim["model"] == "chat-7b")["max_concurrency"] = 2

    edit_yaml(config / "teams.yaml", limit)
    env = {**os.environ, "MODELFLEET_GATEWAY_REDIS_PREFIX": redis_prefix,
           "MODELFLEET_GATEWAY_HEARTBEAT_S": "0.2", "MODELFLEET_GATEWAY_PEER_TTL_S": "5"}
    procs: list[subprocess.Popen[bytes]] = []
    urls = []
    try:
        for name in ("a", "b"):
            port = free_port()
            log = (tmp_path / f"{name}.log").open("wb")
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "gateway_ext", "--config", str(config), "--port", str(port),
                 "--redis-url", redis_url, "--usage-db-url", f"sqlite:///{tmp_path / name}.db",
                 "--spool", str(tmp_path / f"{name}.jsonl"), "--debug"],
                env=env, stdout=log, stderr=subprocess.STDOUT))
            urls.append(f"http://127.0.0.1:{port}")
        for url in urls:
            _until(lambda u=url: (_health(u) or {}).get("live_gateways") == 2,  # type: ignore[misc]
                   f"{url} to see both gateways")
            # releases announced before a process listens are lost to it (its slots expire)
            _until(lambda u=url: (_health(u) or {}).get("release_channel") == "subscribed",  # type: ignore[misc]
                   f"{url} to listen to releases")
        yield list(zip(urls, procs, strict=True))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def check(url: str, key: str) -> httpx.Response:
    return httpx.post(f"{url}/authz/v1/chat/completions", json=CHAT,
                      headers={"authorization": f"Bearer {key}"}, timeout=10.0)


def pool(url: str) -> dict[str, Any]:
    return httpx.get(f"{url}/v1/debug/pools", timeout=5.0).json()[POOL]  # type: ignore[no-any-return]


def test_two_gateways_share_max_concurrency_settles_and_capacity(
        gateways: list[tuple[str, subprocess.Popen[bytes]]], dev_keys: dict[str, str]) -> None:
    (a, _), (b, b_proc) = gateways
    key = dev_keys["search"]
    first, second = check(a, key), check(b, key)
    assert first.status_code == second.status_code == 200
    for url in (a, b):  # the third open request is refused whichever process it reaches
        third = check(url, key)
        assert third.status_code == 429, third.text
        assert third.json()["error"]["code"] == "max_concurrency"
    tokens = pool(a)["in_flight_tokens"]
    assert tokens > 0
    rid = first.headers["x-modelfleet-reservation"]
    settled = httpx.post(f"{b}/v1/settle", timeout=5.0, json={
        "reservation_id": rid, "team": "search", "model": "chat-7b", "version": "v13",
        "prompt_tokens": PROMPT, "completion_tokens": 3})
    assert settled.json()["verdict"] == "settled"  # b settled a's reservation in Redis
    assert check(a, key).status_code == 200  # the slot is free at once, no expiry needed
    # a heard the release: its pool holds only the new request's tokens
    _until(lambda: pool(a)["in_flight_tokens"] == tokens, "a to free the settled slot", 5.0)
    shared = pool(a)["capacity_tokens"]
    b_proc.send_signal(signal.SIGTERM)  # b leaves the live set: a takes the whole pool
    assert b_proc.wait(timeout=15) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal
    _until(lambda: (_health(a) or {}).get("live_gateways") == 1, "a to be alone", 10.0)
    whole = pool(a)["capacity_tokens"]
    assert shared > 0 and 2 * shared <= whole <= 2 * shared + 1

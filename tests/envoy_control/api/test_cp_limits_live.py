"""Team limits changed through the admin API reach a running gateway within a second: a real
control-plane process (``python -m envoy_control`` with an admin token) and gateway_ext's
service long-polling its router state over HTTP. Lowering a team's tokens per minute below a
request's reservation refuses the next request (400, the limit named); raising it admits it
again; the time from the admin answer to the gateway's changed decision is measured.

The control plane is stopped by its PID at the end.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway_ext.runtime import Runtime, build_runtime
from gateway_ext.service import create_app
from gateway_ext.settings import Settings
from modelfleet.config import PlatformConfig, load_config
from modelfleet.contract.headers import PRIORITY_HEADER
from modelfleet.local.envoy_process import free_port

pytestmark = pytest.mark.live

REPO = Path(__file__).resolve().parents[3]
TOKEN = "admin-token-for-the-limits-test-0123"
CHAT = {"model": "chat-7b", "max_tokens": 50, "messages": [{"role": "user", "content": "Hi!"}]}
SEARCH_CHAT = {"model": "chat-7b", "max_concurrency": 500, "guaranteed_share": 0.5}


@dataclass
class ControlPlane:
    popen: subprocess.Popen[bytes]
    url: str
    log: Path


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    work = tmp_path_factory.mktemp("limits-live")
    (work / "admin-token").write_text(TOKEN + "\n")
    http_port = free_port()
    log = work / "control-plane.log"
    argv = [sys.executable, "-P", "-m", "envoy_control", "--config", str(REPO / "config"),
            "--xds-port", str(free_port()), "--http-port", str(http_port),
            "--listener-port", str(free_port()), "--admin-token-file", str(work / "admin-token"),
            "--registry-url", f"sqlite:///{work / 'registry.db'}"]
    with log.open("ab") as out:
        popen = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
    cp = ControlPlane(popen, f"http://127.0.0.1:{http_port}", log)
    try:
        deadline = time.monotonic() + 20
        while True:
            assert popen.poll() is None, log.read_text()
            try:
                if httpx.get(cp.url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "control plane not up within 20 s"
            time.sleep(0.05)
        r = httpx.put(f"{cp.url}/v1/replicas/chat-7b-v13-0", json={
            "model": "chat-7b", "version": "v13", "host": "127.0.0.1", "port": 9})
        r.raise_for_status()
        yield cp
    finally:
        if popen.poll() is None:
            os.kill(popen.pid, signal.SIGTERM)
            try:
                popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(popen.pid, signal.SIGKILL)
                popen.wait(timeout=10)


@asynccontextmanager
async def gateway(tmp_path: Path, cp: ControlPlane) -> AsyncIterator[tuple[httpx.AsyncClient,
                                                                           Runtime]]:
    settings = Settings.from_env({}, **{
        "usage_db_url": f"sqlite:///{tmp_path / 'usage.db'}", "spool": tmp_path / "spool",
        "seed": 1, "control_plane_url": cp.url, "router_poll_wait_s": 1.0})
    config: PlatformConfig = load_config(REPO / "config").config
    runtime = build_runtime(settings, config)
    app = create_app(runtime)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            yield client, runtime


async def wait_for(probe: Any, timeout_s: float) -> float:
    """Seconds until ``await probe()`` is truthy; fails after ``timeout_s``."""
    start = time.monotonic()
    while not await probe():
        assert time.monotonic() - start < timeout_s, f"not within {timeout_s} s"
        await asyncio.sleep(0.01)
    return time.monotonic() - start


async def test_a_limit_changed_by_the_admin_api_applies_at_the_gateway_within_a_second(
        tmp_path: Path, control_plane: ControlPlane) -> None:
    key = load_config(REPO / "config").config.local.dev_keys["search"]
    headers = {"authorization": f"Bearer {key}", PRIORITY_HEADER: "interactive"}
    admin = {"Authorization": f"Bearer {TOKEN}"}
    async with gateway(tmp_path, control_plane) as (gw, runtime), httpx.AsyncClient() as cp:

        async def status() -> int:
            r = await gw.post("/authz/v1/chat/completions", content=json.dumps(CHAT).encode(),
                              headers=headers)
            return r.status_code

        async def routed() -> bool:
            return runtime.router.source == "control-plane"

        await wait_for(routed, 10)
        assert await status() == 200
        lowered = await cp.put(f"{control_plane.url}/admin/teams/search/limits", headers=admin,
                               json={**SEARCH_CHAT, "tokens_per_minute": 40})
        assert lowered.status_code == 200, lowered.text

        async def refused() -> bool:
            return await status() == 400

        took_down = await wait_for(refused, 5)
        r = await gw.post("/authz/v1/chat/completions", content=json.dumps(CHAT).encode(),
                          headers=headers)
        assert "at most 40 tokens per minute" in r.json()["error"]["message"]
        raised = await cp.put(f"{control_plane.url}/admin/teams/search/limits", headers=admin,
                              json={**SEARCH_CHAT, "tokens_per_minute": 6_000_000})
        assert raised.status_code == 200, raised.text

        async def admitted() -> bool:
            return await status() == 200

        took_up = await wait_for(admitted, 5)
    print(f"limit applied at the gateway {took_down * 1000:.0f} ms (lowered), "
          f"{took_up * 1000:.0f} ms (raised) after the admin API answered")
    assert took_down < 1.0 and took_up < 1.0

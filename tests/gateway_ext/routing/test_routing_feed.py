"""The router state into the gateway: the state file when the control plane is down at start,
the long poll's states afterwards, pool capacities for admission (queued requests run when
replicas arrive), and the destination header on the check answer Envoy routes by."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx

from gateway_ext.runtime import build_runtime
from gateway_ext.service import create_app
from gateway_ext.settings import Settings
from modelfleet.config import PlatformConfig
from modelfleet.contract.headers import CONVERSATION_HEADER, DESTINATION_HEADER
from modelfleet.contract.router_state import write_router_state
from modelfleet.contract.router_state_types import (
    ModelAlias,
    PoolRoute,
    RoutableReplica,
    RouterState,
)

CHAT = {"model": "chat-7b", "max_tokens": 50, "messages": [{"role": "user", "content": "Hi!"}]}


def routed_state(replicas: int, version: int = 7, instance: str = "cp-a",
                 canary_percent: float = 0.0) -> RouterState:
    reps = tuple(RoutableReplica(f"chat-7b@v13-{i}", "10.1.0.1", 9000 + i, "local", 0, 0, 0, 0.0,
                                 True) for i in range(replicas))
    return RouterState(version, instance, "3", 0.0, 1.0,
                       (PoolRoute("chat-7b", "v13", 112_000, reps),
                        PoolRoute("chat-7b", "v14", 112_000, ())),
                       (ModelAlias("chat-7b", "v13", "v14", canary_percent),))


def settings(tmp_path: Path, **values: Any) -> Settings:
    base = {"usage_db_url": f"sqlite:///{tmp_path / 'usage.db'}", "spool": tmp_path / "spool",
            "seed": 1, "debug": True, "router_state_file": tmp_path / "router-state.json",
            "control_plane_url": "http://127.0.0.1:1"}  # nothing listens there: it is down
    return Settings.from_env({}, **{**base, **values})


async def checked(app: Any, key: str, conversation: str) -> httpx.Response:
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            return await client.post(
                "/authz/v1/chat/completions", content=json.dumps(CHAT).encode(),
                headers={"authorization": f"Bearer {key}", CONVERSATION_HEADER: conversation})


async def test_a_gateway_started_while_the_control_plane_is_down_routes_on_the_file(
        tmp_path: Path, platform_config: PlatformConfig, dev_keys: dict[str, str]) -> None:
    write_router_state(tmp_path / "router-state.json", routed_state(2))
    runtime = build_runtime(settings(tmp_path), platform_config)
    app = create_app(runtime)
    r = await checked(app, dev_keys["search"], "conv-1")
    assert r.status_code == 200
    assert r.headers["x-route-version"] == "chat-7b@v13"  # the file's alias: canary at 0%
    hosts = r.headers[DESTINATION_HEADER].split(",")
    assert len(hosts) == 2 and all(h.startswith("10.1.0.1:900") for h in hosts)
    assert runtime.router.source == "file"
    assert runtime.lifecycle.core.pools["chat-7b@v13"].capacity_tokens == 2 * 112_000
    assert runtime.lifecycle.core.pools["chat-7b@v14"].capacity_tokens == 0


async def test_without_file_or_control_plane_the_config_decides_and_envoy_picks(
        tmp_path: Path, platform_config: PlatformConfig, dev_keys: dict[str, str]) -> None:
    runtime = build_runtime(settings(tmp_path), platform_config)
    r = await checked(create_app(runtime), dev_keys["search"], "conv-1")
    assert r.status_code == 200 and DESTINATION_HEADER not in r.headers
    assert runtime.router.source == "config"


class FakeControlPlane:
    """``fetch(after, wait_s)`` answering from a list of states; an exception when down."""

    def __init__(self) -> None:
        self.states: list[RouterState] = []
        self.down = False
        self.calls = 0

    async def __call__(self, after: int | None, wait_s: float) -> Any:
        self.calls += 1
        await asyncio.sleep(0)
        if self.down or not self.states:
            raise httpx.ConnectError("down")
        return self.states[-1].as_dict()


async def test_the_feed_follows_the_control_plane_and_keeps_the_last_state_when_it_is_down(
        tmp_path: Path, platform_config: PlatformConfig, dev_keys: dict[str, str]) -> None:
    from gateway_ext.routing.feed import RouterFeed

    runtime = build_runtime(settings(tmp_path, router_state_file=None), platform_config)
    cp = FakeControlPlane()
    feed = RouterFeed(runtime.router, runtime.lifecycle, cp, wait_s=0.01)
    runtime.lifecycle.set_capacity("chat-7b@v13", 0)  # no replica yet: requests queue
    body = json.dumps(CHAT).encode()
    headers = {"authorization": f"Bearer {dev_keys['search']}", CONVERSATION_HEADER: "c-1"}
    queued = asyncio.ensure_future(runtime.lifecycle.check(headers, body))
    await asyncio.sleep(0)
    assert not queued.done()
    cp.states.append(routed_state(3))
    assert await feed.poller.poll_once()  # type: ignore[union-attr]
    result: Any = await asyncio.wait_for(queued, 1)
    assert len(result.headers[DESTINATION_HEADER].split(",")) == 3  # picked when admitted
    cp.down = True
    assert not await feed.poller.poll_once()  # type: ignore[union-attr]
    assert runtime.router.state is not None and runtime.router.state.state_version == 7
    cp.down = False
    cp.states.append(routed_state(1, version=1, instance="cp-b", canary_percent=100))
    assert await feed.poller.poll_once()  # type: ignore[union-attr]  # a restarted control plane
    assert runtime.lifecycle.core.pools["chat-7b@v13"].capacity_tokens == 112_000
    assert runtime.router.alias("chat-7b").canary_percent == 100  # type: ignore[union-attr]


def test_settings_and_flags_name_the_control_plane(tmp_path: Path) -> None:
    from gateway_ext.__main__ import parse_args

    args = parse_args(["--control-plane-url", "http://cp:8081", "--router-state-file", "s.json",
                       "--picking", "least_tokens"])
    s = Settings.from_env({"MODELFLEET_GATEWAY_PIN_TTL_S": "60"}, **vars(args))
    assert (s.control_plane_url, s.router_state_file, s.picking, s.pin_ttl_s) == (
        "http://cp:8081", Path("s.json"), "least_tokens", 60.0)



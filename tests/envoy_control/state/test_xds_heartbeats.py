"""Heartbeats through the control plane and its HTTP API: EDS follows the missed-beat rule (fake
clock), the admin pool state, the router state with long polls, and the state file."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from envoy_control.api.deps import admin_access
from envoy_control.api.http import create_app
from envoy_control.api.state import HeartbeatIn
from envoy_control.resources.build import ListenerSpec
from envoy_control.state.plane import ControlPlane
from envoy_control.state.publish import RouterPublisher
from envoy_control.state.replicas import Replica
from envoy_control.xds.cache import SnapshotCache
from envoy_control.xds.snapshot import CLUSTER, ENDPOINT, ROUTE
from fastapi import HTTPException
from fastapi.testclient import TestClient

from modelfleet.contract.heartbeat import Heartbeat
from modelfleet.contract.router_state import load_router_state

if TYPE_CHECKING:
    from tests.envoy_control.conftest import FakeClock

CONFIG_DIR = Path(__file__).resolve().parents[3] / "config"
Body = Callable[..., dict[str, Any]]


@pytest.fixture
def plane(tmp_path: Path, clock: FakeClock) -> ControlPlane:
    config_dir = Path(shutil.copytree(CONFIG_DIR, tmp_path / "config"))
    router = RouterPublisher(clock=clock, wall_clock=lambda: 1.7e9)
    plane = ControlPlane(
        config_dir, SnapshotCache(), ListenerSpec("127.0.0.1", 18080), clock=clock, router=router
    )
    plane.load()
    return plane


def eds_hosts(plane: ControlPlane, cluster: str = "chat-7b@v13") -> set[str]:
    for cla in plane.snapshot.messages(ENDPOINT):
        if cla.cluster_name == cluster:  # type: ignore[attr-defined]
            return {
                e.endpoint.hostname
                for loc in cla.endpoints  # type: ignore[attr-defined]
                for e in loc.lb_endpoints
            }
    raise KeyError(cluster)


def test_missed_beats_leave_eds_and_a_new_beat_returns(
    plane: ControlPlane, clock: FakeClock, heartbeat_body: Body
) -> None:
    client = TestClient(create_app(plane))
    r = client.post("/v1/heartbeats", json=heartbeat_body("hb-0", 9100))
    assert r.status_code == 200
    assert r.json() == {
        "replica_id": "hb-0",
        "routable": True,
        "why_not": None,
        "snapshot_version": "2",
        "changed": True,
        "beat_interval_s": 1.0,
    }
    assert eds_hosts(plane) == {"hb-0"}  # a heartbeat registers an unknown replica
    assert not client.post("/v1/heartbeats", json=heartbeat_body("hb-0", 9100)).json()["changed"]
    client.put(
        "/v1/replicas/put-0",
        json={"model": "chat-7b", "version": "v13", "host": "127.0.0.1", "port": 9101},
    )

    clock.advance(3.0)
    assert not plane.refresh().changed  # 3 s after the beat: still in
    clock.advance(0.01)
    out = plane.refresh()
    assert out.changed and eds_hosts(plane) == {"put-0"}  # three missed beats: out of EDS
    versions = plane.snapshot.versions
    assert versions[ENDPOINT] == out.snapshot.version and versions[CLUSTER] == "1"
    assert versions[ROUTE] == "1"  # only EDS moved
    listed = {x["replica_id"]: x for x in client.get("/v1/replicas").json()["replicas"]}
    assert listed["hb-0"]["routable"] is False and "missed beats" in listed["hb-0"]["why_not"]

    clock.advance(60.0)  # a replica registered by PUT that never beats stays routable
    back = client.post("/v1/heartbeats", json=heartbeat_body("hb-0", 9100)).json()
    assert back["changed"] and back["routable"] and eds_hosts(plane) == {"hb-0", "put-0"}

    clock.advance(plane.beats.rules.forget_after_s + 1)
    plane.refresh()  # silent for 5 minutes: forgotten altogether
    assert set(plane.replicas) == {"put-0"} and eds_hosts(plane) == {"put-0"}


def test_draining_leaves_eds_at_once_but_stays_in_the_pool_state(
    plane: ControlPlane, heartbeat_body: Body
) -> None:
    client = TestClient(create_app(plane))
    client.post("/v1/heartbeats", json=heartbeat_body("hb-0", 9100, tokens_in_flight=500))
    client.post("/v1/heartbeats", json=heartbeat_body("hb-1", 9101, tokens_in_flight=700))
    r = client.post(
        "/v1/heartbeats", json=heartbeat_body("hb-1", 9101, state="draining", tokens_in_flight=700)
    ).json()
    assert r["changed"] and not r["routable"] and r["why_not"] == "state draining"
    assert eds_hosts(plane) == {"hb-0"}
    state = client.get("/admin/pools/chat-7b/state").json()
    assert {m["replica_id"]: m["state"] for m in state["replicas"]} == {
        "hb-0": "serving",
        "hb-1": "draining",
    }
    assert state["tokens_in_flight"] == 1200 and state["routable"] == 1  # its streams count
    starting = heartbeat_body("hb-2", 9102, state="starting")
    assert not client.post("/v1/heartbeats", json=starting).json()["routable"]


def test_admin_pool_state(plane: ControlPlane, clock: FakeClock, heartbeat_body: Body) -> None:
    app = create_app(plane)
    client = TestClient(app)
    for q, h in [(1000, 200), (3000, 1800)]:
        body = heartbeat_body(
            "hb-0", 9100, queue_depth=2, prefix_cache_queries=q, prefix_cache_hits=h
        )
        client.post("/v1/heartbeats", json=body)
        clock.advance(1.0)
    client.post("/v1/heartbeats", json=heartbeat_body("hb-9", 9200, version="v14", queue_depth=1))
    state = client.get("/admin/pools/chat-7b/state").json()
    assert {k: state[k] for k in ("model", "queue_depth", "tokens_in_flight")} == {
        "model": "chat-7b",
        "queue_depth": 3,
        "tokens_in_flight": 2400,
    }
    assert state["prefix_hit_rate"] == pytest.approx(0.8)  # (1800-200) / (3000-1000)
    assert state["versions"]["v13"]["prefix_hit_rate"] == pytest.approx(0.8)
    assert state["versions"]["v14"]["queue_depth"] == 1
    member = next(m for m in state["replicas"] if m["replica_id"] == "hb-0")
    assert member["last_beat_age_s"] == 1.0 and member["address"] == "127.0.0.1:9100"
    assert {"routable", "running", "kv_cache_usage", "region"} <= set(member)
    empty = client.get("/admin/pools/reason-70b/state").json()
    assert empty["replicas"] == [] and empty["versions"]["v1"]["replicas"] == 0
    missing = client.get("/admin/pools/gpt-9/state")
    assert missing.status_code == 404 and "gpt-9" in missing.json()["detail"]

    def refuse() -> None:
        raise HTTPException(401, "admin credential required")

    app.dependency_overrides[admin_access] = refuse  # the hook the admin credential plugs into
    assert client.get("/admin/pools/chat-7b/state").status_code == 401


def test_bad_heartbeats_get_clear_422s(plane: ControlPlane, heartbeat_body: Body) -> None:
    client = TestClient(create_app(plane))

    def refused(**changes: Any) -> list[str]:
        r = client.post("/v1/heartbeats", json={**heartbeat_body("hb-0", 9100), **changes})
        assert r.status_code == 422, r.text
        detail = r.json()["detail"]
        return [str(detail)] if isinstance(detail, str) else [d["loc"][-1] for d in detail]

    assert refused(state="loading") == ["state"]
    assert refused(kv_cache_usage=1.5, tokens_in_flight=-1) == [
        "tokens_in_flight",
        "kv_cache_usage",
    ]
    assert refused(replica_id="a b", port=70000) == ["replica_id", "port"]
    assert refused(queue_depth=1.5) == ["queue_depth"]
    assert "IP address" in refused(host="replica-0.local")[0]
    hits = client.post(
        "/v1/heartbeats",
        json=heartbeat_body("hb-0", 9100, prefix_cache_queries=5, prefix_cache_hits=9),
    )
    assert hits.status_code == 422 and "exceeds prefix_cache_queries" in hits.text
    body = heartbeat_body("hb-0", 9100)
    del body["region"]
    assert client.post("/v1/heartbeats", json=body).status_code == 422
    newer = {**heartbeat_body("hb-0", 9100), "gpu_temperature_c": 61}  # a newer replica's field
    assert client.post("/v1/heartbeats", json=newer).status_code == 200
    assert plane.replicas["hb-0"] == Replica("hb-0", "chat-7b", "v13", "127.0.0.1", 9100)


async def test_router_state_long_poll_returns_early_on_a_change(
    plane: ControlPlane, heartbeat_body: Body
) -> None:
    transport = httpx.ASGITransport(app=create_app(plane))
    async with httpx.AsyncClient(transport=transport, base_url="http://cp") as client:
        first = (await client.get("/v1/router/state")).json()
        version = first["state_version"]
        assert first["pools"]["chat-7b@v13"]["replicas"] == []
        poll = asyncio.create_task(
            client.get("/v1/router/state", params={"after": version, "wait_s": 5})
        )
        while plane.router.waiting == 0:
            await asyncio.sleep(0.001)
        start = time.monotonic()
        await client.post("/v1/heartbeats", json=heartbeat_body("hb-0", 9100))
        moved = (await poll).json()
        assert time.monotonic() - start < 0.5  # not the 5 s wait
        assert moved["state_version"] > version
        (replica,) = moved["pools"]["chat-7b@v13"]["replicas"]
        assert replica["replica_id"] == "hb-0" and replica["address"] == "127.0.0.1:9100"

        start = time.monotonic()
        same = (
            await client.get(
                "/v1/router/state", params={"after": moved["state_version"], "wait_s": 0.2}
            )
        ).json()
        assert time.monotonic() - start >= 0.2 and same == moved  # nothing moved: after wait_s
        assert (await client.get("/v1/router/state", params={"wait_s": 11})).status_code == 422


async def test_timer_writes_the_state_file(
    plane: ControlPlane, clock: FakeClock, heartbeat_body: Body, tmp_path: Path
) -> None:
    path = tmp_path / "router-state.json"
    timer = asyncio.create_task(plane.watch_beats(0.01, path))
    try:
        transport = httpx.ASGITransport(app=create_app(plane))
        async with httpx.AsyncClient(transport=transport, base_url="http://cp") as client:
            await client.post("/v1/heartbeats", json=heartbeat_body("hb-0", 9100))

        async def saved_ids() -> set[str]:
            saved = load_router_state(path)
            pool = saved.pool("chat-7b@v13") if saved else None
            return {r.replica_id for r in pool.replicas} if pool else set()

        for _ in range(500):
            if await saved_ids() == {"hb-0"}:
                break
            await asyncio.sleep(0.005)
        assert await saved_ids() == {"hb-0"}
        clock.advance(3.5)  # missed beats: the timer takes it out and rewrites the file
        for _ in range(500):
            if await saved_ids() == set():
                break
            await asyncio.sleep(0.005)
        assert await saved_ids() == set() and eds_hosts(plane) == set()
        assert load_router_state(path) == plane.router.current
    finally:
        timer.cancel()


def test_the_api_takes_the_contracts_heartbeat_field_for_field() -> None:
    """The middleware posts ``asdict(Heartbeat)``; the API's body model must accept every field
    under the same name (and add none a replica does not send)."""
    assert set(HeartbeatIn.model_fields) == {f.name for f in fields(Heartbeat)}

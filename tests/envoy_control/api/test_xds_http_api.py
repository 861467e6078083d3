"""The control plane's HTTP API and state: replicas, config reload and watch, debug injection."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
from envoy_control.api.http import DEBUG_INVALID_CLUSTER, create_app
from envoy_control.resources.build import ListenerSpec
from envoy_control.state.plane import ControlPlane
from envoy_control.xds.cache import SnapshotCache
from envoy_control.xds.snapshot import CLUSTER
from fastapi.testclient import TestClient

CONFIG_DIR = Path(__file__).resolve().parents[3] / "config"


@pytest.fixture
def config_dir(tmp_path: Path) -> Path:
    return Path(shutil.copytree(CONFIG_DIR, tmp_path / "config"))


@pytest.fixture
def plane(config_dir: Path) -> ControlPlane:
    plane = ControlPlane(config_dir, SnapshotCache(), ListenerSpec("127.0.0.1", 18080, gateway=None))
    plane.load()
    return plane


def _client(plane: ControlPlane, debug: bool = False) -> TestClient:
    return TestClient(create_app(plane, debug=debug))


def _replica(port: int, version: str = "v13") -> dict[str, object]:
    return {"model": "chat-7b", "version": version, "host": "127.0.0.1", "port": port}


def test_replica_changes_publish_endpoint_snapshots(plane: ControlPlane) -> None:
    client = _client(plane)
    assert client.get("/health").json() == {"status": "ok", "snapshot_version": "1"}
    r = client.put("/v1/replicas/chat-7b-v13-0", json=_replica(9100))
    assert r.status_code == 200 and r.json()["snapshot_version"] == "2" and r.json()["changed"]
    types = client.get("/v1/xds/status").json()["snapshot"]["types"]
    assert types == {"cds": "1", "eds": "2", "lds": "1", "rds": "1"}
    again = client.put("/v1/replicas/chat-7b-v13-0", json=_replica(9100))
    assert again.json() == {**r.json(), "changed": False}  # the same registration: no new snapshot

    stray = client.put("/v1/replicas/x-0", json=_replica(9999, "v99")).json()
    assert stray["replica"]["routable"] is False and not stray["changed"]
    listed = {x["replica_id"]: x["routable"] for x in client.get("/v1/replicas").json()["replicas"]}
    assert listed == {"chat-7b-v13-0": True, "x-0": False}

    assert client.delete("/v1/replicas/nope").status_code == 404
    gone = client.delete("/v1/replicas/chat-7b-v13-0").json()
    assert gone["deleted"] == "chat-7b-v13-0" and gone["snapshot_version"] == "3"


def test_bad_replica_bodies_are_refused(plane: ControlPlane) -> None:
    client = _client(plane)
    assert client.put("/v1/replicas/r-0", json={**_replica(0)}).status_code == 422
    assert client.put("/v1/replicas/r-0", json={"model": "chat-7b"}).status_code == 422
    assert client.put("/v1/replicas/bad%20id", json=_replica(9100)).status_code == 422
    assert client.put("/v1/replicas/chat-7b@v13-9", json=_replica(9100)).status_code == 200
    named = {**_replica(9100), "host": "localhost"}
    r = client.put("/v1/replicas/r-0", json=named)
    assert r.status_code == 422 and "IP address" in r.json()["detail"]


def test_reload_refuses_invalid_config_and_keeps_serving(
    plane: ControlPlane, config_dir: Path
) -> None:
    client = _client(plane)
    models = config_dir / "models.yaml"
    original = models.read_text()
    models.write_text(original.replace("live: v13", "live: v77"))
    r = client.post("/v1/config/reload")
    assert r.status_code == 422
    problems = r.json()["detail"]["problems"]
    assert any("v77" in p["message"] for p in problems) and all("line" in p for p in problems)
    assert plane.snapshot.version == "1"

    models.write_text(original.replace("percent: 10 ", "percent: 25 "))
    ok = client.post("/v1/config/reload").json()
    assert ok["changed"] and ok["snapshot_version"] == "2"
    assert client.get("/v1/xds/snapshot").json()["types"] == {
        "cds": "1",
        "eds": "1",
        "lds": "1",
        "rds": "2",
    }
    assert not client.post("/v1/config/reload").json()["changed"]


def test_debug_injection_only_with_debug(plane: ControlPlane) -> None:
    assert _client(plane).post("/v1/debug/invalid-resource").status_code in (404, 405)
    client = _client(plane, debug=True)
    r = client.post("/v1/debug/invalid-resource")
    assert r.status_code == 200 and r.json()["snapshot_version"] == "2"
    assert DEBUG_INVALID_CLUSTER in plane.snapshot.names(CLUSTER)
    assert client.get("/v1/xds/snapshot").json()["types"]["cds"] == "2"
    custom = {
        "type": "rds",
        "resource": {"name": "extra-routes", "virtual_hosts": [{"name": "x", "domains": ["*"]}]},
    }
    assert client.post("/v1/debug/invalid-resource", json=custom).status_code == 200
    bad_json = {"type": "cds", "resource": {"name": "x", "no_such_field": 1}}
    assert client.post("/v1/debug/invalid-resource", json=bad_json).status_code == 422
    cleared = client.delete("/v1/debug/invalid-resource").json()
    assert cleared["changed"] and DEBUG_INVALID_CLUSTER not in plane.snapshot.names(CLUSTER)


async def test_config_dir_is_watched(plane: ControlPlane, config_dir: Path) -> None:
    watcher = asyncio.create_task(plane.watch_config(0.02))
    try:
        models = config_dir / "models.yaml"
        models.write_text(models.read_text().replace("percent: 10 ", "percent: 30 "))
        for _ in range(200):
            if plane.snapshot.version == "2":
                break
            await asyncio.sleep(0.01)
        assert plane.snapshot.version == "2"
        models.write_text("models: [")  # broken YAML: refused, version 2 keeps serving
        await asyncio.sleep(0.2)
        assert plane.snapshot.version == "2" and plane.config.model("chat-7b") is not None
    finally:
        watcher.cancel()

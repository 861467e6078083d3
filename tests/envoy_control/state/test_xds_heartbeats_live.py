"""Live: heartbeats drive a real Envoy's endpoints, and the state file outlives the control plane.

The module's control plane registers four stand-in replicas by PUT (they never beat and stay
routable); one more replica registers itself by beating.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from modelfleet.contract.headers import UPSTREAM_REPLICA_HEADER
from modelfleet.contract.router_state import load_router_state
from modelfleet.contract.router_state_types import RouterState
from modelfleet.local.envoy_process import EnvoyProcess

if TYPE_CHECKING:
    from tests.envoy_control.conftest import Beater, ControlPlaneProcess, Upstream

pytestmark = pytest.mark.live

CONFIG_DIR = Path(__file__).resolve().parents[3] / "config"
HB = "chat-7b-v13-hb"
PUT_REPLICAS = {"chat-7b-v13-0", "chat-7b-v13-1", "chat-7b-v13-2"}


def poll(probe: Callable[[], Any], timeout_s: float, interval_s: float = 0.01) -> Any:
    """Call ``probe`` until it returns something truthy, or fail after ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    while not (value := probe()):
        assert time.monotonic() < deadline, f"condition not met within {timeout_s} s"
        time.sleep(interval_s)
    return value


@pytest.fixture(scope="module")
def api() -> Iterator[httpx.Client]:
    """A client for Envoy's API and the admin endpoint (outlives any control plane)."""
    with httpx.Client(timeout=5) as client:
        yield client


def listed(api: httpx.Client, envoy: EnvoyProcess, port: int) -> bool:
    """Whether Envoy's ``/clusters`` lists ``127.0.0.1:port`` in chat-7b@v13."""
    text = api.get(f"http://127.0.0.1:{envoy.admin_port}/clusters").text
    return f"chat-7b@v13::127.0.0.1:{port}::" in text


def chat(api: httpx.Client, cp: ControlPlaneProcess) -> httpx.Response:
    return api.post(cp.api_url + "/v1/chat/completions", json={"model": "chat-7b@v13"})


def saved_v13(path: Path) -> set[str]:
    state = load_router_state(path)
    pool = state.pool("chat-7b@v13") if state else None
    return {r.replica_id for r in pool.replicas} if pool else set()


def test_missed_beats_take_a_replica_out_of_envoy_and_a_beat_brings_it_back(
    control_plane: ControlPlaneProcess,
    envoy: EnvoyProcess,
    api: httpx.Client,
    extra_upstreams: Callable[[str], Upstream],
    beaters: Callable[[str, dict[str, Any]], Beater],
    heartbeat_body: Callable[..., dict[str, Any]],
) -> None:
    hb = extra_upstreams(HB)
    body = heartbeat_body(HB, hb.port)
    beater = beaters(control_plane.url, body)
    poll(lambda: listed(api, envoy, hb.port), 2)  # self-registered by its first beat
    poll(lambda: chat(api, control_plane).headers.get(UPSTREAM_REPLICA_HEADER) == HB, 5, 0)
    path = control_plane.state_file
    assert path is not None
    poll(lambda: saved_v13(path) == PUT_REPLICAS | {HB}, 2)

    beater.stop()
    assert beater.last_ok is not None
    served = set()
    while listed(api, envoy, hb.port):  # the others keep serving meanwhile
        r = chat(api, control_plane)
        assert r.status_code == 200
        served.add(r.headers[UPSTREAM_REPLICA_HEADER])
        assert time.monotonic() - beater.last_ok < 5, "still listed 5 s after the last beat"
        time.sleep(0.01)
    gone_after = time.monotonic() - beater.last_ok
    assert 2.8 < gone_after < 3.75, f"left Envoy {gone_after:.2f} s after the last beat"
    assert served <= PUT_REPLICAS | {HB} and len(served & PUT_REPLICAS) >= 2
    poll(lambda: saved_v13(path) == PUT_REPLICAS, 1)  # the file follows
    state = control_plane.get("/admin/pools/chat-7b/state")
    member = next(m for m in state["replicas"] if m["replica_id"] == HB)
    assert not member["routable"] and "missed beats" in member["why_not"]

    start = time.monotonic()
    beaters(control_plane.url, body)
    poll(lambda: listed(api, envoy, hb.port), 2)
    assert time.monotonic() - start < 1.0  # a beat brings it back at once


def test_state_file_outlives_the_control_plane_and_seeds_its_restart(
    control_plane: ControlPlaneProcess,
    envoy: EnvoyProcess,
    api: httpx.Client,
    upstreams: dict[str, Upstream],
    extra_upstreams: Callable[[str], Upstream],
    beaters: Callable[[str, dict[str, Any]], Beater],
    heartbeat_body: Callable[..., dict[str, Any]],
    start_cp: Callable[..., ControlPlaneProcess],
    live_dir: Path,
) -> None:
    hb = extra_upstreams(HB)
    beaters(control_plane.url, heartbeat_body(HB, hb.port))
    path = control_plane.state_file
    assert path is not None
    poll(lambda: saved_v13(path) == PUT_REPLICAS | {HB}, 2)
    before: RouterState = poll(lambda: load_router_state(path), 1)
    ports = (control_plane.xds_port, control_plane.http_port, control_plane.listener_port)
    api_url = control_plane.api_url

    control_plane.popen.terminate()  # SIGTERM by PID; the fixture's teardown reads its exit code
    control_plane.popen.wait(timeout=10)
    r = api.post(api_url + "/v1/chat/completions", json={"model": "chat-7b@v13"})
    assert r.status_code == 200  # Envoy keeps serving its last configuration
    down = load_router_state(path)  # what a gateway restarted now would start from
    assert down is not None and saved_v13(path) == PUT_REPLICAS | {HB}
    assert down.state_version >= before.state_version and down.alias("chat-7b") is not None

    restarted = start_cp(
        CONFIG_DIR, live_dir / "restart", extra_args=["--state-file", str(path)], ports=ports
    )
    fresh = restarted.get("/v1/router/state")
    assert fresh["state_version"] > down.state_version and fresh["instance_id"] != down.instance_id
    v13 = {x["replica_id"] for x in fresh["pools"]["chat-7b@v13"]["replicas"]}
    assert v13 == PUT_REPLICAS | {HB}  # restored from the file, before any beat
    node = poll(lambda: restarted.get("/v1/xds/status")["nodes"].get(envoy.node_id), 5)
    assert node["connected"]
    poll(lambda: restarted.get("/v1/xds/status")["converged"], 5)
    for rid in PUT_REPLICAS:
        assert listed(api, envoy, upstreams[rid].port), rid
    assert listed(api, envoy, hb.port)  # its beater reached the new control plane

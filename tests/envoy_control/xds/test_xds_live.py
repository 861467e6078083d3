"""Live: the control-plane process and a real Envoy 1.40 on loopback, stand-in replicas behind it,
and a stand-in gateway answering Envoy's ext_authz checks.

Envoy must ACK the snapshot (its config_dump shows the snapshot's versions), route on the
gateway's ``x-route-version``, pass the gateway's refusals through, apply a change within a
second, and keep serving its last good config after a NACK.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import yaml
from envoy_control.api.http import DEBUG_INVALID_CLUSTER
from envoy_control.resources.bootstrap import BOOTSTRAP_CLUSTERS
from envoy_control.resources.build import ListenerSpec, build_resources
from envoy_control.resources.clusters import seconds
from envoy_control.state.replicas import Replica
from envoy_control.xds.cache import SnapshotCache
from envoy_control.xds.server import start_ads_server
from envoy_control.xds.snapshot import CLUSTER, new_snapshot

from modelfleet.config import load_config
from modelfleet.contract.headers import (
    CONVERSATION_HEADER,
    PRIORITY_HEADER,
    UPSTREAM_CLUSTER_HEADER,
    UPSTREAM_HOST_HEADER,
    UPSTREAM_REPLICA_HEADER,
)
from modelfleet.local.envoy_process import (
    EnvoyProcess,
    config_dump,
    dumped_versions,
    start_envoy,
    stop_envoy,
)

if TYPE_CHECKING:
    from tests.envoy_control.conftest import Check, ControlPlaneProcess, Upstream

pytestmark = pytest.mark.live

CHAT = "/v1/chat/completions"
LIVE_VERSIONS = {"chat-7b": "chat-7b@v13", "reason-70b": "reason-70b@v1"}




def poll(
    probe: Callable[[], Any], timeout_s: float, interval_s: float = 0.005
) -> tuple[Any, float]:
    """Call ``probe`` until it returns something truthy; returns (value, seconds taken)."""
    start = time.monotonic()
    while True:
        value = probe()
        if value:
            return value, time.monotonic() - start
        assert time.monotonic() - start < timeout_s, f"condition not met within {timeout_s} s"
        time.sleep(interval_s)


def _chat(
    cp: ControlPlaneProcess, body: Any, headers: dict[str, str] | None = None
) -> httpx.Response:
    content = body if isinstance(body, str) else json.dumps(body)
    response: httpx.Response = cp.http.post(
        cp.api_url + CHAT,
        content=content,
        headers={"content-type": "application/json", **(headers or {})},
    )
    return response


def _clusters(dump: dict[str, Any]) -> dict[str, str]:
    """Active dynamic clusters and their versions."""
    (cds,) = [c for c in dump["configs"] if c["@type"].endswith("ClustersConfigDump")]
    return {c["cluster"]["name"]: c["version_info"] for c in cds.get("dynamic_active_clusters", [])}


def _hostnames(dump: dict[str, Any], cluster: str) -> set[str]:
    (eds,) = [c for c in dump["configs"] if c["@type"].endswith("EndpointsConfigDump")]
    for cfg in eds.get("dynamic_endpoint_configs", []):
        cla = cfg["endpoint_config"]
        if cla["cluster_name"] == cluster:
            return {
                e["endpoint"].get("hostname", "")
                for loc in cla.get("endpoints", [])
                for e in loc.get("lb_endpoints", [])
            }
    return set()


def _node(cp: ControlPlaneProcess, envoy: EnvoyProcess) -> dict[str, Any]:
    node: dict[str, Any] = cp.get("/v1/xds/status")["nodes"][envoy.node_id]
    return node


def test_envoy_acks_the_snapshot(control_plane: ControlPlaneProcess, envoy: EnvoyProcess) -> None:
    status, _ = poll(lambda: (s := control_plane.get("/v1/xds/status"))["converged"] and s, 5)
    types = status["snapshot"]["types"]
    node = status["nodes"][envoy.node_id]
    assert node["connected"]
    assert {t: node["types"][t]["acked_version"] for t in types} == types
    dump = config_dump(envoy.admin_port)
    versions = dumped_versions(dump)
    for t in ("cds", "lds", "rds"):
        assert versions[t] == {types[t]}, t
    assert set(_clusters(dump)) == {"chat-7b@v13", "chat-7b@v14", "reason-70b@v1"}
    assert _hostnames(dump, "chat-7b@v13") == {"chat-7b-v13-0", "chat-7b-v13-1", "chat-7b-v13-2"}
    assert _hostnames(dump, "chat-7b@v14") == {"chat-7b-v14-0"}


def test_envoy_answers_health_checks_itself(
    control_plane: ControlPlaneProcess, envoy: EnvoyProcess, gateway_checks: list[Check]
) -> None:
    before = len(gateway_checks)
    r = control_plane.http.get(control_plane.api_url + "/health")
    assert r.status_code == 200  # no key asked: the NLB and Route53 probe this path
    assert len(gateway_checks) == before  # answered before ext_authz


def test_routes_on_the_gateways_route_header(
    control_plane: ControlPlaneProcess, envoy: EnvoyProcess, gateway_checks: list[Check]
) -> None:
    pinned = _chat(control_plane, {"model": "chat-7b@v14", "messages": []})
    assert pinned.status_code == 200
    assert pinned.headers[UPSTREAM_CLUSTER_HEADER] == "chat-7b@v14"
    assert pinned.headers[UPSTREAM_REPLICA_HEADER] == "chat-7b-v14-0"
    assert pinned.headers[UPSTREAM_HOST_HEADER].startswith("127.0.0.1:")
    assert pinned.headers["x-ratelimit-remaining-tokens"] == "99"  # the gateway's, on success
    assert json.loads(pinned.json()["body"]) == {"model": "chat-7b@v14", "messages": []}
    method, path, sent = gateway_checks[-1]
    assert (method, path) == ("POST", "/authz/v1/chat/completions")
    assert sent["content-length"] == str(len(json.dumps({"model": "chat-7b@v14", "messages": []})))

    alias = _chat(control_plane, {"model": "chat-7b"})
    assert alias.headers[UPSTREAM_CLUSTER_HEADER] == "chat-7b@v13"

    no_replica = _chat(control_plane, {"model": "reason-70b"})
    assert no_replica.status_code == 503
    assert no_replica.json()["error"]["code"] == "upstream_unavailable"

    unrouted = _chat(control_plane, {"model": "gpt-9@v1"})  # the gateway named a version
    assert unrouted.status_code == 404 and unrouted.headers["content-type"] == "application/json"
    error = unrouted.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == "model_not_found" and "gpt-9@v1" in error["message"]

    models = control_plane.http.get(control_plane.api_url + "/v1/models").json()
    assert {m["id"] for m in models["data"]} >= {
        "chat-7b",
        "reason-70b",
        "chat-7b@v13",
        "chat-7b@v14",
    }
    assert gateway_checks[-1][:2] == ("GET", "/authz/v1/models")  # checked too


def test_only_the_gateway_sets_route_and_identity_headers(
    control_plane: ControlPlaneProcess, envoy: EnvoyProcess, gateway_checks: list[Check]
) -> None:
    forged = {"x-route-version": "chat-7b@v14", "x-modelfleet-team": "someone-else",
              "x-modelfleet-reservation": "forged", "x-modelfleet-tier": "interactive"}
    r = _chat(control_plane, {"model": "chat-7b@v13"}, forged)
    assert r.headers[UPSTREAM_CLUSTER_HEADER] == "chat-7b@v13"
    upstream = json.loads(r.content)
    assert "forged" not in json.dumps(upstream)
    assert gateway_checks[-1][2].get("x-modelfleet-team") is None  # stripped before the check


def test_gateway_refusals_reach_the_client_with_body_and_retry_after(
    control_plane: ControlPlaneProcess, envoy: EnvoyProcess
) -> None:
    denied = _chat(control_plane, {"model": "chat-7b"}, {PRIORITY_HEADER: "deny"})
    assert denied.status_code == 429
    assert denied.headers["retry-after"] == "7"
    assert denied.headers["x-ratelimit-remaining-tokens"] == "0"
    assert "x-secret" not in denied.headers
    assert denied.headers["content-type"] == "application/json"
    assert denied.json()["error"]["code"] == "deny"

    shed = _chat(control_plane, {"model": "chat-7b"}, {PRIORITY_HEADER: "shed"})
    assert shed.status_code == 503  # the 460 marker, mapped back by Envoy
    assert shed.headers["retry-after"] == "7"
    assert shed.json()["error"]["code"] == "shed"

    big = _chat(control_plane, json.dumps({"model": "chat-7b", "pad": "x" * (1 << 20)}))
    assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large"


def test_conversations_stick_to_one_replica(
    control_plane: ControlPlaneProcess, envoy: EnvoyProcess
) -> None:
    for i in range(5):
        seen = {
            _chat(
                control_plane, {"model": "chat-7b@v13"}, {CONVERSATION_HEADER: f"sticky-{i}"}
            ).headers[UPSTREAM_REPLICA_HEADER]
            for _ in range(5)
        }
        assert len(seen) == 1  # one conversation, one replica
    spread = Counter(
        _chat(control_plane, {"model": "chat-7b@v13"}).headers[UPSTREAM_REPLICA_HEADER]
        for _ in range(30)
    )
    assert len(spread) >= 2  # no conversation id: Envoy's ring hash picks a random point


def test_replica_removal_is_applied_within_a_second(
    control_plane: ControlPlaneProcess, envoy: EnvoyProcess, upstreams: dict[str, Upstream]
) -> None:
    start = time.monotonic()
    r = control_plane.http.delete(f"{control_plane.url}/v1/replicas/chat-7b-v13-2", timeout=5)
    assert r.status_code == 200
    poll(
        lambda: (
            _hostnames(config_dump(envoy.admin_port), "chat-7b@v13")
            == {"chat-7b-v13-0", "chat-7b-v13-1"}
        ),
        5,
    )
    elapsed = time.monotonic() - start
    assert elapsed < 1.0, f"replica removal took {elapsed * 1000:.0f} ms to reach Envoy"
    eds_version = r.json()["snapshot_version"]
    poll(lambda: _node(control_plane, envoy)["types"]["eds"]["acked_version"] == eds_version, 2)
    served = {
        _chat(control_plane, {"model": "chat-7b@v13"}).headers[UPSTREAM_REPLICA_HEADER]
        for _ in range(20)
    }
    assert "chat-7b-v13-2" not in served
    control_plane.put_replica("chat-7b-v13-2", "chat-7b", "v13", upstreams["chat-7b-v13-2"].port)


def _add_version(config_dir: Path, version: str) -> None:
    path = config_dir / "models.yaml"
    data = yaml.safe_load(path.read_text())
    base = next(v for v in data["versions"] if v["version"] == "v14")
    data["versions"].append({**base, "version": version, "status": "registered"})
    tmp = config_dir.parent / "models.yaml.tmp"
    tmp.write_text(yaml.safe_dump(data, sort_keys=False))
    os.replace(tmp, path)


def test_config_change_is_applied_within_a_second(
    control_plane: ControlPlaneProcess, envoy: EnvoyProcess, upstreams: dict[str, Upstream]
) -> None:
    start = time.monotonic()
    _add_version(control_plane.config_dir, "v15")  # the control plane polls the directory
    poll(
        lambda: (
            "chat-7b@v15" in _clusters(config_dump(envoy.admin_port))
            and "chat-7b@v15" in json.dumps(config_dump(envoy.admin_port, include_eds=False))
        ),
        5,
    )
    elapsed = time.monotonic() - start
    assert elapsed < 1.0, (
        f"config change took {elapsed * 1000:.0f} ms to reach Envoy (incl. 200 ms polling)"
    )
    snapshot = control_plane.get("/v1/xds/status")["snapshot"]
    versions = dumped_versions(config_dump(envoy.admin_port))
    assert versions["cds"] == {snapshot["types"]["cds"]} and versions["rds"] == {
        snapshot["types"]["rds"]
    }

    assert (
        _chat(control_plane, {"model": "chat-7b@v15"}).status_code == 503
    )  # routed, no replica yet
    control_plane.put_replica("chat-7b-v15-0", "chat-7b", "v15", upstreams["chat-7b-v14-0"].port)
    r, _ = poll(
        lambda: (x := _chat(control_plane, {"model": "chat-7b@v15"})).status_code == 200 and x, 2
    )
    assert r.headers[UPSTREAM_REPLICA_HEADER] == "chat-7b-v15-0"


def test_nack_is_recorded_and_previous_config_keeps_serving(
    control_plane: ControlPlaneProcess, envoy: EnvoyProcess
) -> None:
    before = dumped_versions(config_dump(envoy.admin_port))["cds"]
    r = control_plane.http.post(f"{control_plane.url}/v1/debug/invalid-resource", timeout=5)
    assert r.status_code == 200
    bad_version = control_plane.get("/v1/xds/snapshot")["types"]["cds"]
    nack, _ = poll(
        lambda: (
            (n := _node(control_plane, envoy)["types"]["cds"]["last_nack"])
            and n["version"] == bad_version
            and n
        ),
        5,
    )
    assert "duration" in nack["message"].lower()  # Envoy's own error text
    cds = _node(control_plane, envoy)["types"]["cds"]
    assert cds["acked_version"] != bad_version and cds["nack_count"] >= 1
    assert "NACK" in control_plane.log_path.read_text()
    dump = config_dump(envoy.admin_port)
    assert dumped_versions(dump)["cds"] == before
    assert DEBUG_INVALID_CLUSTER not in _clusters(dump)
    assert _chat(control_plane, {"model": "chat-7b@v13"}).status_code == 200  # still routing
    assert not control_plane.get("/v1/xds/status")["converged"]

    control_plane.http.delete(
        f"{control_plane.url}/v1/debug/invalid-resource", timeout=5
    ).raise_for_status()
    poll(lambda: control_plane.get("/v1/xds/status")["converged"], 5)


async def test_changed_clusters_warm_at_once(tmp_path: Path) -> None:
    """Changing a cluster makes Envoy re-warm it; without EDS sent again it would wait 15 s."""
    config = load_config(Path(__file__).resolve().parents[3] / "config").config
    replicas = [Replica("r-0", "chat-7b", "v13", "127.0.0.1", 9)]
    cache = SnapshotCache()
    first = new_snapshot("1", build_resources(config, replicas, ListenerSpec("127.0.0.1", 1)),
                         external_clusters=BOOTSTRAP_CLUSTERS)
    cache.set_snapshot(first)
    server, port = await start_ads_server(cache, "127.0.0.1", 0)
    envoy = await asyncio.to_thread(
        start_envoy, node_id="warm-test", xds_port=port, work_dir=tmp_path
    )
    try:
        changed = build_resources(config, replicas, ListenerSpec("127.0.0.1", 1))
        for c in changed[CLUSTER]:
            c.connect_timeout.CopyFrom(seconds(2))  # type: ignore[attr-defined]
        second = new_snapshot("2", changed, first, external_clusters=BOOTSTRAP_CLUSTERS)
        assert second.versions[CLUSTER] == "2"
        start = time.monotonic()
        cache.set_snapshot(second)
        while True:
            dump = await asyncio.to_thread(config_dump, envoy.admin_port)
            (cds,) = [c for c in dump["configs"] if c["@type"].endswith("ClustersConfigDump")]
            active = {c["version_info"] for c in cds.get("dynamic_active_clusters", [])}
            if active == {"2"} and not cds.get("dynamic_warming_clusters"):
                break
            assert time.monotonic() - start < 2.0, "changed clusters still warming"
            await asyncio.sleep(0.01)
    finally:
        await asyncio.to_thread(stop_envoy, envoy)
        await server.stop(0)


async def test_envoy_keeps_serving_through_a_control_plane_restart(tmp_path: Path) -> None:
    """Envoy keeps its config while the control plane is down, then takes the new one's snapshot,
    although the restarted control plane counts versions from 1 again."""
    config = load_config(Path(__file__).resolve().parents[3] / "config").config
    before = [Replica("old-0", "chat-7b", "v13", "127.0.0.1", 9)]
    after = [Replica("new-0", "chat-7b", "v13", "127.0.0.1", 10)]
    cache = SnapshotCache()
    cache.set_snapshot(
        new_snapshot("1", build_resources(config, before, ListenerSpec("127.0.0.1", 1)),
                     external_clusters=BOOTSTRAP_CLUSTERS)
    )
    server, port = await start_ads_server(cache, "127.0.0.1", 0)
    envoy = await asyncio.to_thread(
        start_envoy, node_id="restart-test", xds_port=port, work_dir=tmp_path
    )
    try:
        await server.stop(0)
        await asyncio.sleep(0.3)
        dump = await asyncio.to_thread(config_dump, envoy.admin_port)
        assert _hostnames(dump, "chat-7b@v13") == {"old-0"}  # last config keeps serving
        fresh = SnapshotCache()
        fresh.set_snapshot(
            new_snapshot("1", build_resources(config, after, ListenerSpec("127.0.0.1", 1)),
                         external_clusters=BOOTSTRAP_CLUSTERS)
        )
        server, _ = await start_ads_server(fresh, "127.0.0.1", port)
        start = time.monotonic()
        while _hostnames(await asyncio.to_thread(config_dump, envoy.admin_port), "chat-7b@v13") != {
            "new-0"
        }:
            assert time.monotonic() - start < 5.0, (
                "Envoy did not take the restarted control plane's snapshot"
            )
            await asyncio.sleep(0.02)
    finally:
        await asyncio.to_thread(stop_envoy, envoy)
        await server.stop(0)

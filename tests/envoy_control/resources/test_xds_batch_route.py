"""The Envoy routes and cluster of the batch API (``envoy_control.resources.batch``), served by the
real Envoy with our public listener (ext_authz included) in front of the real batch service:
``/v1/batches`` and ``/v1/files`` reach the service without a gateway check (a 2 MiB upload
passes), chat still goes through the check, nothing else reaches the service."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from envoy.config.bootstrap.v3 import bootstrap_pb2
from envoy.config.core.v3 import address_pb2
from envoy.config.listener.v3 import listener_components_pb2, listener_pb2
from envoy_control.resources.batch import BATCH_CLUSTER, make_batch_cluster, make_batch_route
from envoy_control.resources.bootstrap import (
    BOOTSTRAP_CLUSTERS,
    make_gateway_cluster,
    render_bootstrap,
)
from envoy_control.resources.clusters import make_cluster, make_load_assignment
from envoy_control.resources.listeners import make_http_connection_manager, make_listener
from envoy_control.resources.routes import AliasRoute, make_route_config
from envoy_control.xds.consistency import consistency_problems
from envoy_control.xds.snapshot import CLUSTER, ENDPOINT, LISTENER, ROUTE, new_snapshot
from google.protobuf import any_pb2, json_format
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from batch.service import create_batch_app
from batch.settings import BatchSettings
from modelfleet.config import PlatformConfig
from modelfleet.local.envoy_process import envoy_argv, envoy_binary
from modelfleet.local.processes import free_port


def test_the_route_matches_batches_and_only_batches() -> None:
    route = make_batch_route()
    assert route.match.path_separated_prefix == "/v1/batches"
    assert route.route.cluster == BATCH_CLUSTER and route.route.timeout.seconds == 30
    cluster = make_batch_cluster("batch.modelfleet.svc", 8091)
    assert cluster.type == cluster.STRICT_DNS and cluster.name == BATCH_CLUSTER
    assert make_batch_cluster("10.0.0.7", 8091).type == cluster.STATIC


def _bootstrap(listen_port: int, batch_port: int, gateway_port: int) -> dict[str, object]:
    """Our public listener (health, header strip, ext_authz, router) with the API's route
    configuration inline, the gateway's and the batch service's bootstrap clusters."""
    hcm = make_http_connection_manager(access_log=False)
    hcm.ClearField("rds")
    routes = make_route_config([AliasRoute("chat-7b", "chat-7b@v13")], ["chat-7b@v13"])
    routes.validate_clusters.value = False  # chat-7b@v13 would come from CDS
    hcm.route_config.CopyFrom(routes)
    packed = any_pb2.Any()
    packed.Pack(hcm)
    listener = listener_pb2.Listener(
        name="api", address=address_pb2.Address(socket_address=address_pb2.SocketAddress(
            address="127.0.0.1", port_value=listen_port)),
        filter_chains=[listener_components_pb2.FilterChain(filters=[listener_components_pb2.Filter(
            name="envoy.filters.network.http_connection_manager", typed_config=packed)])])
    boot = bootstrap_pb2.Bootstrap(
        admin=bootstrap_pb2.Admin(address=address_pb2.Address(socket_address=address_pb2.SocketAddress(
            address="127.0.0.1", port_value=free_port()))),
        static_resources=bootstrap_pb2.Bootstrap.StaticResources(
            listeners=[listener], clusters=[make_batch_cluster("127.0.0.1", batch_port),
                                            make_gateway_cluster("127.0.0.1", gateway_port)]))
    data: dict[str, object] = json_format.MessageToDict(boot, preserving_proto_field_name=True)
    return data


def _serve(app: Any) -> tuple[uvicorn.Server, threading.Thread, int]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    return server, thread, port


@pytest.fixture
def gateway() -> Iterator[tuple[int, list[str]]]:
    """A stand-in gateway_ext: refuses chat completions (403), lets anything else through;
    records every path it is asked about."""
    asked: list[str] = []

    async def check(request: Request) -> Response:
        path = "/" + request.path_params["path"]
        asked.append(path)
        if path == "/v1/chat/completions":
            return JSONResponse({"error": {"message": "no", "type": "permission_error",
                                           "param": None, "code": "refused"}}, status_code=403)
        return Response(status_code=200)

    app = Starlette(routes=[Route("/authz/{path:path}", check,
                                  methods=["GET", "POST", "DELETE", "PUT"])])
    server, thread, port = _serve(app)
    yield port, asked
    server.should_exit = True
    thread.join(timeout=10)


def test_routes_name_bootstrap_clusters_and_stay_consistent() -> None:
    routes = make_route_config([AliasRoute("m", "m@v1")], ["m@v1"])
    names = [r.name for r in routes.virtual_hosts[0].routes]
    assert names[:3] == ["models-list", "batches", "files"]
    resources = {CLUSTER: [make_cluster("m@v1")], ENDPOINT: [make_load_assignment("m@v1", [])],
                 LISTENER: [make_listener("127.0.0.1", 8080)], ROUTE: [routes]}
    snap = new_snapshot("1", resources, external_clusters=BOOTSTRAP_CLUSTERS)
    assert consistency_problems(snap) == []
    assert consistency_problems(new_snapshot("1", resources)) == [
        f"route {n} in modelfleet-api sends to cluster {BATCH_CLUSTER}, which is missing"
        for n in ("batches", "files")]
    boot = render_bootstrap(node_id="n", cluster="c", admin_port=0, xds_host="127.0.0.1",
                            xds_port=1, gateway=("127.0.0.1", 2), batch=("127.0.0.1", 3))
    assert BATCH_CLUSTER in {c["name"] for c in boot["static_resources"]["clusters"]}


@pytest.fixture
def batch_service(tmp_path: Path, platform_config: PlatformConfig) -> Iterator[int]:
    """The batch API (role api, SQLite) on a free port, in a thread of this process."""
    settings = BatchSettings.from_env({}, role="api", db_url=f"sqlite:///{tmp_path / 'b.db'}",
                                      file_roots=[tmp_path], files_dir=tmp_path / "uploads")
    server, thread, port = _serve(create_batch_app(settings, platform_config))
    yield port
    server.should_exit = True
    thread.join(timeout=10)


def test_envoy_sends_batch_paths_to_the_batch_service_without_the_check(
        tmp_path: Path, batch_service: int, gateway: tuple[int, list[str]],
        dev_keys: dict[str, str]) -> None:
    try:
        binary = envoy_binary()
    except FileNotFoundError:
        pytest.skip("no Envoy binary")
    listen = free_port()
    path = tmp_path / "envoy.json"
    path.write_text(json.dumps(_bootstrap(listen, batch_service, gateway[0])))
    log = (tmp_path / "envoy.log").open("wb")
    proc = subprocess.Popen(envoy_argv(path, envoy_path=binary), stdout=log,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{listen}"
    headers = {"authorization": f"Bearer {dev_keys['research']}"}
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                r = httpx.get(f"{base}/v1/batches", headers=headers, timeout=1)
                break
            except httpx.HTTPError:
                assert proc.poll() is None and time.monotonic() < deadline, (
                    (tmp_path / "envoy.log").read_text())
                time.sleep(0.05)
        assert r.status_code == 200 and r.json()["object"] == "list"
        one = httpx.get(f"{base}/v1/batches/batch_x", headers=headers)
        assert one.status_code == 404 and one.json()["error"]["code"] == "batch_not_found"
        made = httpx.post(f"{base}/v1/batches", headers=headers, json={
            "model": "chat-7b", "input_uri": (tmp_path / "in.jsonl").as_uri()})
        assert made.status_code == 200 and made.json()["status"] == "validating"
        cancel = httpx.post(f"{base}/v1/batches/{made.json()['id']}/cancel", headers=headers)
        assert cancel.status_code == 200 and cancel.json()["status"] == "cancelling"
        big = b"".join(b'{"custom_id": "c%d", "body": {"pad": "%s"}}\n' % (i, b"x" * 1000)
                       for i in range(2000))  # 2 MiB: over the 1 MiB ext_authz would buffer
        up = httpx.post(f"{base}/v1/files", headers=headers, data={"purpose": "batch"},
                        files={"file": ("big.jsonl", big)}, timeout=30)
        assert up.status_code == 200 and up.json()["bytes"] == len(big), up.text
        content = httpx.get(f"{base}/v1/files/{up.json()['id']}/content", headers=headers)
        assert content.content == big
        assert gateway[1] == []  # the gateway was never asked about batches or files
        chat = httpx.post(f"{base}/v1/chat/completions", headers=headers, json={})
        assert chat.status_code == 403 and gateway[1] == ["/v1/chat/completions"]
        other = httpx.get(f"{base}/v1/batchesX", headers=headers)
        assert other.status_code == 404 and other.json()["error"]["code"] == "unknown_url"
        nokey = httpx.get(f"{base}/v1/files")
        assert nokey.status_code == 401
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()

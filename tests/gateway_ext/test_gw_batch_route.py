"""The Envoy route and cluster of the batch API (``envoy_control.batch_route``), served by the
real Envoy in front of the real batch service: ``/v1/batches`` and below reach the service,
nothing else does."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from envoy.config.bootstrap.v3 import bootstrap_pb2
from envoy.config.core.v3 import address_pb2
from envoy.config.listener.v3 import listener_components_pb2, listener_pb2
from envoy.config.route.v3 import route_components_pb2 as rc
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy_control.batch_route import BATCH_CLUSTER, make_batch_cluster, make_batch_route
from envoy_control.envoy_process import envoy_argv, envoy_binary
from envoy_control.listeners import make_router_filter
from envoy_control.routes import make_error_routes
from google.protobuf import any_pb2, json_format

from gateway_ext.batch_main import create_batch_app
from gateway_ext.batch_settings import BatchSettings
from modelfleet.config import PlatformConfig
from modelfleet.local.processes import free_port


def test_the_route_matches_batches_and_only_batches() -> None:
    route = make_batch_route()
    assert route.match.path_separated_prefix == "/v1/batches"
    assert route.route.cluster == BATCH_CLUSTER and route.route.timeout.seconds == 30
    cluster = make_batch_cluster("batch.modelfleet.svc", 8091)
    assert cluster.type == cluster.STRICT_DNS and cluster.name == BATCH_CLUSTER
    assert make_batch_cluster("10.0.0.7", 8091).type == cluster.STATIC


def _bootstrap(listen_port: int, batch_port: int) -> dict[str, object]:
    host = rc.VirtualHost(name="api", domains=["*"],
                          routes=[make_batch_route(), *make_error_routes()])
    hcm = hcm_pb2.HttpConnectionManager(
        stat_prefix="api", route_config=route_pb2.RouteConfiguration(name="api",
                                                                     virtual_hosts=[host]),
        http_filters=[make_router_filter()])
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
            listeners=[listener], clusters=[make_batch_cluster("127.0.0.1", batch_port)]))
    data: dict[str, object] = json_format.MessageToDict(boot, preserving_proto_field_name=True)
    return data


@pytest.fixture
def batch_service(tmp_path: Path, platform_config: PlatformConfig) -> Iterator[int]:
    """The batch API (role api, SQLite) on a free port, in a thread of this process."""
    port = free_port()
    settings = BatchSettings.from_env({}, role="api", db_url=f"sqlite:///{tmp_path / 'b.db'}",
                                      file_roots=[tmp_path])
    server = uvicorn.Server(uvicorn.Config(create_batch_app(settings, platform_config),
                                           host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    yield port
    server.should_exit = True
    thread.join(timeout=10)


def test_envoy_sends_batch_paths_to_the_batch_service(
        tmp_path: Path, batch_service: int, dev_keys: dict[str, str]) -> None:
    try:
        binary = envoy_binary()
    except FileNotFoundError:
        pytest.skip("no Envoy binary")
    listen = free_port()
    path = tmp_path / "envoy.json"
    path.write_text(json.dumps(_bootstrap(listen, batch_service)))
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
        other = httpx.get(f"{base}/v1/batchesX", headers=headers)
        assert other.status_code == 404 and other.json()["error"]["code"] == "unknown_url"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()

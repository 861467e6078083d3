"""The Envoy bootstrap: its shape, and the real Envoy's own validation of it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from envoy_control.resources.bootstrap import XDS_CLUSTER, render_bootstrap, write_bootstrap

from modelfleet.local.envoy_process import envoy_argv, envoy_binary


def test_bootstrap_points_ads_at_the_control_plane() -> None:
    boot = render_bootstrap(
        node_id="envoy-7",
        cluster="us-east-1",
        admin_port=19001,
        xds_host="127.0.0.1",
        xds_port=18000,
    )
    json.dumps(boot)  # plain data
    assert boot["node"] == {"id": "envoy-7", "cluster": "us-east-1"}
    assert boot["admin"]["address"]["socket_address"] == {
        "address": "127.0.0.1",
        "port_value": 19001,
    }
    (xds,) = boot["static_resources"]["clusters"]
    assert xds["name"] == XDS_CLUSTER and xds["type"] == "STATIC"
    options = xds["typed_extension_protocol_options"][
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
    ]
    assert "http2_protocol_options" in options["explicit_http_config"]
    endpoint = xds["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
    assert endpoint["address"]["socket_address"]["port_value"] == 18000
    dynamic = boot["dynamic_resources"]
    assert dynamic["ads_config"]["api_type"] == "GRPC"
    assert dynamic["ads_config"]["grpc_services"][0]["envoy_grpc"]["cluster_name"] == XDS_CLUSTER
    assert "ads" in dynamic["cds_config"] and "ads" in dynamic["lds_config"]


def test_dns_name_for_control_plane_uses_strict_dns() -> None:
    boot = render_bootstrap(
        node_id="n", cluster="c", admin_port=0, xds_host="xds.modelfleet.svc", xds_port=18000
    )
    assert boot["static_resources"]["clusters"][0]["type"] == "STRICT_DNS"


def test_envoy_accepts_the_bootstrap(tmp_path: Path) -> None:
    try:
        binary = envoy_binary()
    except FileNotFoundError:
        pytest.skip("no Envoy binary")
    path = write_bootstrap(
        tmp_path / "boot.json",
        node_id="n",
        cluster="c",
        admin_port=0,
        xds_host="127.0.0.1",
        xds_port=18000,
    )
    argv = envoy_argv(path, envoy_path=binary, extra=["--mode", "validate"])
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "--disable-hot-restart" in argv  # several Envoys on one machine

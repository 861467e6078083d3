"""Fixtures for the autoscale tests: the example config, the default policy, a chat-7b pool,
fake replicas serving /metrics, and a real Prometheus."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from autoscale.policy import policy_from_data
from modelfleet.config.autoscaling import AutoscalePolicy
from modelfleet.config.load import load_config
from modelfleet.config.schema import PlatformConfig, Pool, Version
from modelfleet.contract.metrics import (
    ENGINE_LABEL,
    MODEL_NAME_LABEL,
    TOKENS_IN_FLIGHT,
    VLLM_WAITING,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def example_config() -> PlatformConfig:
    """The declared example config under ``config/``."""
    return load_config(REPO / "config").config


@pytest.fixture(scope="session")
def policy() -> AutoscalePolicy:
    """The seed's defaults."""
    return policy_from_data()


@pytest.fixture(scope="session")
def chat_pool(example_config: PlatformConfig) -> Pool:
    """chat-7b@v13 in us-east-1: warm minimum 6, maximum 16."""
    return next(p for p in example_config.pools
                if p.key == "chat-7b@v13" and p.region == "us-east-1")


@pytest.fixture(scope="session")
def chat_version(example_config: PlatformConfig) -> Version:
    """chat-7b@v13: 112,000 tokens in flight and 83 streams per replica, load-tested."""
    version = example_config.version("chat-7b", "v13")
    assert version is not None
    return version


# --- Prometheus in the loop: fake replicas and a real Prometheus, started and stopped by PID ---


@dataclass
class FakeReplica:
    """A replica's /metrics, shaped as a real one's: the engine's ``vllm:num_requests_waiting``
    with vLLM's labels (``model_name``, ``engine``) and the middleware's tokens in flight (no
    labels of its own); ``tokens`` and ``waiting`` can be changed while it serves."""

    model: str
    version: str
    namespace: str
    tokens: float
    waiting: float
    server: ThreadingHTTPServer | None = None

    @property
    def address(self) -> str:
        assert self.server is not None
        host, port = self.server.server_address[:2]
        return f"{host!s}:{port}"

    def exposition(self) -> bytes:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_GaugeCollector(self))
        return generate_latest(registry)


class _GaugeCollector(Collector):
    def __init__(self, replica: FakeReplica) -> None:
        self._replica = replica

    def collect(self) -> Iterator[Metric]:
        r = self._replica
        waiting = GaugeMetricFamily(VLLM_WAITING, "fake engine gauge",
                                    labels=[MODEL_NAME_LABEL, ENGINE_LABEL])
        waiting.add_metric([r.model, "0"], r.waiting)
        yield waiting
        yield GaugeMetricFamily(TOKENS_IN_FLIGHT, "fake middleware gauge", value=r.tokens)


class _MetricsHandler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        replica: FakeReplica | FakeGateway = self.server.replica  # type: ignore[attr-defined]
        body = replica.exposition() if self.path == "/metrics" else b""
        self.send_response(200 if body else 404)
        self.send_header("Content-Type", CONTENT_TYPE_LATEST)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def fake_replicas() -> Iterator[Callable[..., FakeReplica]]:
    """Start fake replicas on 127.0.0.1 (free ports); all are shut down after the test."""
    started: list[FakeReplica] = []

    def start(model: str, version: str, namespace: str, tokens: float, waiting: float) -> FakeReplica:
        replica = FakeReplica(model, version, namespace, tokens, waiting)
        server = ThreadingHTTPServer(("127.0.0.1", 0), _MetricsHandler)
        server.replica = replica  # type: ignore[attr-defined]
        replica.server = server
        threading.Thread(target=server.serve_forever, daemon=True).start()
        started.append(replica)
        return replica

    yield start
    for replica in started:
        assert replica.server is not None
        replica.server.shutdown()
        replica.server.server_close()


class FakeGateway:
    """A gateway_ext pod's /metrics: its real metric families (``gateway_ext.metrics``) with the
    admission queue per pool and tier set by the test."""

    def __init__(self) -> None:
        from gateway_ext.metrics import make_metrics

        self.registry = CollectorRegistry(auto_describe=False)
        self.metrics = make_metrics(self.registry)
        self.server: ThreadingHTTPServer | None = None

    def queued(self, pool: str, tier: str, depth: int) -> None:
        """Set the queue depth of ``pool`` (``model@version``) for ``tier``, requests."""
        self.metrics.pool_queue_depth.labels(pool=pool, tier=tier).set(depth)

    @property
    def address(self) -> str:
        assert self.server is not None
        host, port = self.server.server_address[:2]
        return f"{host!s}:{port}"

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


@pytest.fixture
def fake_gateway() -> Iterator[FakeGateway]:
    """One fake gateway_ext pod serving /metrics on 127.0.0.1; shut down after the test."""
    gateway = FakeGateway()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _MetricsHandler)
    server.replica = gateway  # type: ignore[attr-defined]
    gateway.server = server
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield gateway
    server.shutdown()
    server.server_close()


def _tool(name: str) -> str:
    """The path of a Prometheus binary; fail on CI (CI=true) when it is missing, else skip."""
    path = shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else None)
    if path is None:
        message = f"{name} is not installed (Debian package prometheus)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture
def promtool() -> str:
    return _tool("promtool")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Callable[[dict[str, Any]], str]]:
    """Start a real Prometheus with a given config (dict) on a free loopback port and a temp
    storage dir; returns its base URL. Stopped by its PID after the test."""
    binary = _tool("prometheus")
    procs: list[subprocess.Popen[bytes]] = []

    def start(config: dict[str, Any]) -> str:
        config_file = tmp_path / "prometheus.yml"
        config_file.write_text(yaml.safe_dump(config))
        port = _free_port()
        log = (tmp_path / "prometheus.log").open("wb")
        proc = subprocess.Popen(
            [binary, f"--config.file={config_file}", f"--storage.tsdb.path={tmp_path / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=log, stderr=subprocess.STDOUT)
        procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"prometheus exited: {(tmp_path / 'prometheus.log').read_text()[-2000:]}")
            try:
                if httpx.get(f"{url}/-/ready", timeout=1).status_code == 200:
                    return url
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        pytest.fail("prometheus did not become ready in 20 s")

    yield start
    for proc in procs:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

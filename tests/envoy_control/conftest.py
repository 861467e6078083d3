"""Fixtures for the control-plane tests: the example config, replica sets, and for live tests a
control-plane process, tiny upstream servers standing in for replicas, and a real Envoy.

Every process started here is stopped by its PID at teardown.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest
from envoy_control.registry.store import Registry
from envoy_control.resources.bootstrap import write_bootstrap
from envoy_control.state.replicas import Replica

from modelfleet.config import PlatformConfig, load_config
from modelfleet.contract.headers import PRIORITY_HEADER
from modelfleet.local.envoy_process import (
    EnvoyProcess,
    envoy_argv,
    envoy_binary,
    free_port,
    stop_envoy,
    wait_live,
)
from modelfleet.testing import (  # noqa: F401  (dev_keys, platform_config, postgres_url, table_prefix: fixtures)
    dev_keys,
    platform_config,
    postgres_url,
    require_postgres,
    table_prefix,
)

REPO = Path(__file__).resolve().parents[2]
CONFIG_DIR = REPO / "config"
UPSTREAM_VERSIONS = {
    "chat-7b-v13-0": "v13",
    "chat-7b-v13-1": "v13",
    "chat-7b-v13-2": "v13",
    "chat-7b-v14-0": "v14",
}
"""The live tests' stand-in replicas and the chat-7b version each serves."""


def _wait(probe: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not probe():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not ready within {timeout_s} s")
        time.sleep(0.05)


@pytest.fixture(scope="session")
def example_config() -> PlatformConfig:
    """The repository's declared config (config/*.yaml)."""
    return load_config(CONFIG_DIR).config


@pytest.fixture
def example_replicas() -> list[Replica]:
    """Three v13 replicas, one v14 replica, none for reason-70b."""
    return [
        Replica("chat-7b-v13-0", "chat-7b", "v13", "127.0.0.1", 9100),
        Replica("chat-7b-v13-1", "chat-7b", "v13", "127.0.0.1", 9101),
        Replica("chat-7b-v13-2", "chat-7b", "v13", "127.0.0.1", 9102),
        Replica("chat-7b-v14-0", "chat-7b", "v14", "127.0.0.1", 9200),
    ]


# ---------------------------------------------------------------- live: upstream replicas


class _EchoHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms delayed-ACK stall
    replica_id = "?"

    def _answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else b""
        out = json.dumps(
            {"replica_id": self.replica_id, "path": self.path, "body": body.decode()}
        ).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    do_GET = _answer
    do_POST = _answer

    def log_message(self, format: str, *args: Any) -> None:
        pass


@dataclass
class Upstream:
    """A tiny HTTP server standing in for a replica: answers ``{"replica_id", "path", "body"}``."""

    replica_id: str
    port: int
    server: ThreadingHTTPServer
    thread: threading.Thread

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def start_upstream(replica_id: str) -> Upstream:
    """Start an echo server on a free loopback port, in a daemon thread."""
    handler = type(f"Echo_{replica_id}", (_EchoHandler,), {"replica_id": replica_id})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    return Upstream(replica_id, int(server.server_address[1]), server, thread)


@pytest.fixture(scope="module")
def upstreams() -> Iterator[dict[str, Upstream]]:
    """Echo servers for chat-7b-v13-0/1/2 and chat-7b-v14-0, by replica id."""
    started = {i: start_upstream(i) for i in UPSTREAM_VERSIONS}
    yield started
    for u in started.values():
        u.stop()


# ---------------------------------------------------------------- live: control plane process


@dataclass
class ControlPlaneProcess:
    """A running ``python -m envoy_control``: its ports, config copy and process."""

    popen: subprocess.Popen[bytes]
    config_dir: Path
    xds_port: int
    http_port: int
    listener_port: int
    log_path: Path
    http: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=5))
    """One client for every call (a new httpx client per call costs ~30 ms of TLS setup)."""
    state_file: Path | None = None
    """Its ``--state-file``, if given."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def api_url(self) -> str:
        """Envoy's public API listener."""
        return f"http://127.0.0.1:{self.listener_port}"

    def get(self, path: str) -> Any:
        r = self.http.get(self.url + path)
        r.raise_for_status()
        return r.json()

    def put_replica(self, replica_id: str, model: str, version: str, port: int) -> Any:
        r = self.http.put(
            f"{self.url}/v1/replicas/{replica_id}",
            json={"model": model, "version": version, "host": "127.0.0.1", "port": port},
        )
        r.raise_for_status()
        return r.json()


def start_control_plane(
    config_src: Path,
    work_dir: Path,
    debug: bool = True,
    extra_args: Sequence[str] = (),
    ports: tuple[int, int, int] | None = None,
) -> ControlPlaneProcess:
    """Copy ``config_src`` under ``work_dir`` and start the control plane on free ports (or on
    ``ports``: xDS, HTTP, listener), with ``extra_args`` appended to its command line."""
    config_dir = work_dir / "config"
    shutil.copytree(config_src, config_dir)
    xds_port, http_port, listener_port = ports or (free_port(), free_port(), free_port())
    log_path = work_dir / "control-plane.log"
    argv = [
        sys.executable,
        "-P",
        "-m",
        "envoy_control",
        "--config",
        str(config_dir),
        "--xds-port",
        str(xds_port),
        "--http-port",
        str(http_port),
        "--listener-port",
        str(listener_port),
    ]
    with log_path.open("ab") as log:
        popen = subprocess.Popen(
            [*argv, *(["--debug"] if debug else []), *extra_args],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    cp = ControlPlaneProcess(popen, config_dir, xds_port, http_port, listener_port, log_path)
    if "--state-file" in extra_args:
        cp.state_file = Path(extra_args[list(extra_args).index("--state-file") + 1])

    def healthy() -> bool:
        if popen.poll() is not None:
            raise RuntimeError(f"control plane exited: {log_path.read_text()}")
        try:
            return cp.http.get(cp.url + "/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        _wait(healthy, 20, "control plane")
    except BaseException:
        stop_control_plane(cp)
        raise
    return cp


def stop_control_plane(cp: ControlPlaneProcess, timeout_s: float = 10.0) -> int:
    """SIGTERM by PID, SIGKILL after ``timeout_s`` seconds; returns the exit code."""
    cp.http.close()
    if cp.popen.poll() is None:
        os.kill(cp.popen.pid, signal.SIGTERM)
        try:
            cp.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.kill(cp.popen.pid, signal.SIGKILL)
            cp.popen.wait(timeout=timeout_s)
    return int(cp.popen.returncode)


@pytest.fixture(scope="module")
def live_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        envoy_binary()
    except FileNotFoundError:
        pytest.skip("no Envoy binary")
    return tmp_path_factory.mktemp("xds-live")


@pytest.fixture(scope="module")
def control_plane(live_dir: Path, upstreams: dict[str, Upstream]) -> Iterator[ControlPlaneProcess]:
    """The control plane (with --debug and a --state-file) on a copy of config/, every upstream
    registered by PUT (none of them beats)."""
    cp = start_control_plane(
        CONFIG_DIR, live_dir, extra_args=["--state-file", str(live_dir / "router-state.json")]
    )
    try:
        for rid, u in upstreams.items():
            cp.put_replica(rid, "chat-7b", UPSTREAM_VERSIONS[rid], u.port)
        yield cp
    finally:
        code = stop_control_plane(cp)
        assert code == 0, f"control plane exit code {code}: {cp.log_path.read_text()[-2000:]}"


def poll(probe: Callable[[], Any], timeout_s: float, interval_s: float = 0.01) -> Any:
    """Call ``probe`` until it returns something truthy; that value, or TimeoutError."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"not true after {timeout_s} s")
        time.sleep(interval_s)


LIVE_VERSIONS = {"chat-7b": "chat-7b@v13", "reason-70b": "reason-70b@v1"}
"""What the stand-in gateway routes each alias to."""


Check = tuple[str, str, dict[str, str]]
"""One ext_authz check the stand-in gateway received: method, path, headers."""


class _StubGateway(BaseHTTPRequestHandler):
    """Stands in for gateway_ext: routes the body's ``model`` (an alias to its live version),
    refuses on demand (``x-priority: deny`` 429, ``shed`` 503 sent as the 460 marker)."""

    protocol_version = "HTTP/1.1"
    checks: ClassVar[list[Check]] = []

    def _answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else b""
        self.checks.append((self.command, self.path, dict(self.headers)))
        headers: dict[str, str] = {}
        mode = self.headers.get(PRIORITY_HEADER, "")
        if mode in ("deny", "shed"):
            status = 429 if mode == "deny" else 460
            out = json.dumps({"error": {"message": mode, "type": "rate_limit_error", "param": None,
                                        "code": mode}}).encode()
            headers = {"content-type": "application/json", "retry-after": "7",
                       "x-ratelimit-remaining-tokens": "0", "x-secret": "not for clients"}
        else:
            status, out = 200, b""
            if self.command == "POST":
                model = json.loads(body).get("model", "")
                headers = {"x-route-version": LIVE_VERSIONS.get(model, model),
                           "x-modelfleet-team": "stub", "x-ratelimit-remaining-tokens": "99"}
        self.send_response(status)
        for k, v in {**headers, "content-length": str(len(out))}.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = _answer

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def stub_gateway() -> Iterator[int]:
    """A stand-in gateway on a free port (its port)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _StubGateway)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    yield int(server.server_address[1])
    server.shutdown()
    server.server_close()


@pytest.fixture
def gateway_checks() -> list[Check]:
    """The checks the stand-in gateway has received so far (the last one last)."""
    return _StubGateway.checks


def _admin_port(path: Path) -> int:
    text = path.read_text().strip() if path.exists() else ""
    return int(text.rsplit(":", 1)[1]) if ":" in text else 0


@pytest.fixture(scope="module")
def envoy(
    control_plane: ControlPlaneProcess, live_dir: Path, stub_gateway: int
) -> Iterator[EnvoyProcess]:
    """A real Envoy connected to ``control_plane`` whose bootstrap points ext_authz at the stub
    gateway, LIVE."""
    work = live_dir / "envoy"
    work.mkdir(parents=True, exist_ok=True)
    config_path = write_bootstrap(
        work / "bootstrap.json", node_id="test-envoy-0", cluster="modelfleet", admin_port=0,
        xds_host="127.0.0.1", xds_port=control_plane.xds_port,
        gateway=("127.0.0.1", stub_gateway),
    )
    address = work / "admin-address"
    log_path = work / "envoy.log"
    with log_path.open("ab") as log:
        popen = subprocess.Popen(
            envoy_argv(config_path, admin_address_path=address), stdout=log,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    proc = EnvoyProcess("test-envoy-0", popen.pid, 0, config_path, log_path, popen)
    try:
        proc.admin_port = poll(lambda: _admin_port(address), 10)
        wait_live(proc, 20)
        yield proc
    finally:
        stop_envoy(proc)


# ---------------------------------------------------------------- heartbeats


class FakeClock:
    """An injected clock (seconds) that moves only when told to."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    """A fake clock at 1000.0 s."""
    return FakeClock()


def make_heartbeat_body(
    replica_id: str, port: int, version: str = "v13", **overrides: Any
) -> dict[str, Any]:
    """A valid ``POST /v1/heartbeats`` body for a chat-7b replica on 127.0.0.1:``port``."""
    return {
        "replica_id": replica_id,
        "model": "chat-7b",
        "version": version,
        "host": "127.0.0.1",
        "port": port,
        "region": "local",
        "state": "serving",
        "tokens_in_flight": 1200,
        "queue_depth": 0,
        "running": 3,
        "kv_cache_usage": 0.25,
        "prefix_cache_queries": 0,
        "prefix_cache_hits": 0,
        "sent_at": time.time(),
        **overrides,
    }


@pytest.fixture
def heartbeat_body() -> Callable[..., dict[str, Any]]:
    """:func:`make_heartbeat_body`: ``heartbeat_body(replica_id, port, version="v13", **overrides)``."""
    return make_heartbeat_body


class Beater:
    """A thread that beats for one replica every ``interval_s`` seconds until stopped; failed
    beats (control plane down) are counted and retried at the next tick."""

    def __init__(self, url: str, body: dict[str, Any], interval_s: float = 0.25) -> None:
        self.url, self.body, self.interval_s = url, body, interval_s
        self.last_ok: float | None = None
        """``time.monotonic()`` when the last beat was answered 200."""
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=2) as client:
            while not self._stop.is_set():
                try:
                    r = client.post(self.url + "/v1/heartbeats", json=self.body)
                    if r.status_code == 200:
                        self.last_ok = time.monotonic()
                    else:
                        self.failures += 1
                except httpx.HTTPError:
                    self.failures += 1
                self._stop.wait(self.interval_s)

    def start(self) -> Beater:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


@pytest.fixture
def beaters() -> Iterator[Callable[[str, dict[str, Any]], Beater]]:
    """``beaters(url, body)`` starts a :class:`Beater`; every one started is stopped at teardown."""
    started: list[Beater] = []

    def start(url: str, body: dict[str, Any]) -> Beater:
        b = Beater(url, body).start()
        started.append(b)
        return b

    yield start
    for b in started:
        b.stop()


@pytest.fixture
def extra_upstreams() -> Iterator[Callable[[str], Upstream]]:
    """``extra_upstreams(replica_id)`` starts an echo server (not registered); stopped at teardown."""
    started: list[Upstream] = []

    def start(replica_id: str) -> Upstream:
        started.append(start_upstream(replica_id))
        return started[-1]

    yield start
    for u in started:
        u.stop()


@pytest.fixture
def start_cp() -> Iterator[Callable[..., ControlPlaneProcess]]:
    """:func:`start_control_plane`; every process started is stopped by PID at teardown (exit
    code 0 asserted)."""
    started: list[ControlPlaneProcess] = []

    def start(*args: Any, **kwargs: Any) -> ControlPlaneProcess:
        started.append(start_control_plane(*args, **kwargs))
        return started[-1]

    yield start
    codes = [stop_control_plane(cp) for cp in started]
    assert codes == [0] * len(started), f"control plane exit codes {codes}"


@pytest.fixture
def registry() -> Iterator[Registry]:
    """A registry on the test Postgres with tables of this test alone (dropped afterwards); fails
    under CI=true, skips otherwise, when Postgres is unreachable."""
    reg = Registry(require_postgres(), f"cpt_{uuid.uuid4().hex[:10]}_")
    reg.create_tables()
    yield reg
    reg.drop_tables()
    reg.dispose()

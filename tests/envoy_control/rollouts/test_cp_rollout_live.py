"""The rollout controller with a real Prometheus scraping simulated replicas (in-process) and
its registry in a real Postgres.

chat-7b@v14 runs a 5x slower engine than the live v13: handed to the controller, it is rolled
back within the guard window, and the ``rollouts`` table says why, with the metrics. A healthy
reason-70b@v2 (same engine as v1), registered through the admin API, goes through every stage
to the alias, and the old v1 is released once its keep-loaded time has passed.

Every replica gets the same closed-loop load whatever the stage (the split itself is covered by
the routing tests): the guard compares per-request figures, so only sample counts depend on it.
Prometheus and Postgres: skipped when missing, failed under CI=true. Prometheus is stopped by
its PID.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest
import yaml
from envoy_control.api.http import create_app
from envoy_control.registry.store import Registry
from envoy_control.resources.build import ListenerSpec
from envoy_control.rollouts.controller import Phase, RolloutPolicy, default_stages
from envoy_control.rollouts.driver import RolloutDriver
from envoy_control.rollouts.guard import GuardThresholds
from envoy_control.rollouts.prom import PromGuardReader
from envoy_control.state.plane import ControlPlane
from envoy_control.xds.cache import SnapshotCache
from envoy_control.xds.snapshot import CLUSTER
from fastapi.testclient import TestClient

from autoscale.promconfig import ReplicaTarget, prometheus_config
from modelfleet.testing import require_postgres
from replica.chat import ReplicaConfig
from replica.params import CHAT_7B
from replica.server import create_app as replica_app
from replica.testing import serve_in_thread

pytestmark = pytest.mark.live
CONFIG_DIR = Path(__file__).resolve().parents[3] / "config"
TOKEN = "admin-token-for-live-rollouts-01"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
WINDOW_S, HOLD_S, MIN_REQUESTS = 6.0, 1.5, 20
SLOW = CHAT_7B.with_overrides({"capacity_tokens_per_s": 500.0})  # same shape, 5x slower steps
REPLICAS = {("chat-7b", "v13"): CHAT_7B, ("chat-7b", "v14"): SLOW,
            ("reason-70b", "v1"): CHAT_7B, ("reason-70b", "v2"): CHAT_7B}
PROMPTS = [f"Question {i}: how do canaries protect a fleet?" for i in range(8)]




def missing(message: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


def postgres_or_skip() -> str:
    return require_postgres()


def prometheus_binary() -> str:
    path = shutil.which("prometheus") or ("/usr/bin/prometheus" if Path("/usr/bin/prometheus").exists() else None)
    if path is None:
        missing("prometheus is not installed (Debian package prometheus)")
    assert path is not None
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A Prometheus binary and its work dir; started by :func:`start_prometheus`."""
    yield prometheus_binary(), tmp_path


def start_prometheus(binary: str, work: Path, targets: list[ReplicaTarget],
                     stack: ExitStack) -> str:
    config = prometheus_config(targets, namespace="modelfleet", scrape_interval_s=0.5)
    (work / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = (work / "prometheus.log").open("wb")
    proc = subprocess.Popen([binary, f"--config.file={work / 'prometheus.yml'}",
                             f"--storage.tsdb.path={work / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                            stdout=log, stderr=subprocess.STDOUT)

    def stop() -> None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()

    stack.callback(stop)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        assert proc.poll() is None, (work / "prometheus.log").read_text()[-2000:]
        try:
            if httpx.get(f"{url}/-/ready", timeout=1).status_code == 200:
                return url
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError("prometheus did not become ready in 20 s")


def load(url: str, model: str, stop: threading.Event) -> None:
    """One closed-loop client: the same prompts, seeds and lengths on every replica."""
    with httpx.Client(timeout=10) as client:
        i = 0
        while not stop.is_set():
            body = {"model": model, "max_tokens": 24, "seed": i % len(PROMPTS),
                    "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]}
            client.post(f"{url}/v1/chat/completions", json=body)
            i += 1


async def test_controller_rolls_back_a_slow_version_and_promotes_a_healthy_one(
        prometheus: tuple[str, Path], tmp_path: Path) -> None:
    registry = Registry(postgres_or_skip(), f"cpl_{uuid.uuid4().hex[:10]}_")
    registry.create_tables()
    try:
        await rollouts(registry, prometheus, tmp_path)
    finally:
        registry.drop_tables()
        registry.dispose()


async def rollouts(registry: Registry, prometheus: tuple[str, Path], tmp_path: Path) -> None:
    """The scenario of the test above, its registry given."""
    stop = threading.Event()
    with ExitStack() as stack:
        targets, threads = [], []
        for (model, version), params in REPLICAS.items():
            config = ReplicaConfig((model,), params=params, model_version=version,
                                   replica_id=f"{model}-{version}-0", time_scale=20.0)
            url = stack.enter_context(serve_in_thread(replica_app(config)))
            targets.append(ReplicaTarget(url.removeprefix("http://"), model, version))
            threads.append(threading.Thread(target=load, args=(url, model, stop), daemon=True))
        for t in threads:
            stack.callback(t.join, timeout=10)
        stack.callback(stop.set)
        for t in threads:
            t.start()
        prom_url = start_prometheus(*prometheus, targets, stack)

        config_dir = Path(shutil.copytree(CONFIG_DIR, tmp_path / "config"))
        plane = ControlPlane(config_dir, SnapshotCache(), ListenerSpec("127.0.0.1", 18080),
                             store=registry)
        plane.load()
        async with httpx.AsyncClient() as prom:
            reader = PromGuardReader(prom, prom_url)
            policy = RolloutPolicy(stages=default_stages(hold_s=HOLD_S), window_s=WINDOW_S,
                                   thresholds=GuardThresholds(min_requests=MIN_REQUESTS), keep_old_s=1.0)
            driver = RolloutDriver(plane, reader, policy, registry)
            client = TestClient(create_app(plane, admin_token=TOKEN, registry=registry, controller=driver))

            v1 = plane.config.version("reason-70b", "v1")
            assert v1 is not None
            v2 = {**v1.model_dump(mode="json", exclude={"model", "status"}), "version": "v2",
                  "weights_uri": "s3://modelfleet-weights/reason-70b/v2-int8/",
                  "weights_hash": "sha256:" + "e2" * 32}
            assert client.post("/admin/models/reason-70b/versions", json=v2, headers=ADMIN).status_code == 201

            # Every version has enough samples in the window (Prometheus' discovery takes ~5 s to
            # hand it its first targets).
            deadline = time.monotonic() + 20
            while True:
                counts = [(await reader.read(m, v, WINDOW_S)).requests for m, v in REPLICAS]
                if min(counts) >= MIN_REQUESTS:
                    break
                assert time.monotonic() < deadline, f"too few samples: {counts}"
                await asyncio.sleep(0.5)

            start = time.monotonic()
            for model, version in (("chat-7b", "v14"), ("reason-70b", "v2")):
                r = client.post(f"/admin/models/{model}/rollouts", headers=ADMIN, json={
                    "version": version, "hold_s": HOLD_S, "window_s": WINDOW_S,
                    "min_requests": MIN_REQUESTS})
                assert r.status_code == 201, r.text
            assert plane.config.model("chat-7b").shadow.version == "v14"  # type: ignore[union-attr]
            assert plane.config.model("chat-7b").canary is None  # type: ignore[union-attr]
            rolled_back_after = None
            while driver.rollouts["reason-70b"].phase != Phase.RELEASED:
                await driver.tick()
                if rolled_back_after is None and driver.rollouts["chat-7b"].phase == Phase.ROLLED_BACK:
                    rolled_back_after = time.monotonic() - start
                assert time.monotonic() - start < 25, driver.rollouts
                await asyncio.sleep(0.25)

    assert rolled_back_after is not None and rolled_back_after < WINDOW_S
    chat = plane.config.model("chat-7b")
    assert chat is not None and (chat.live, chat.canary, chat.shadow) == ("v13", None, None)
    decisions = registry.decisions("chat-7b")
    assert [d["decision"] for d in decisions] == ["start", "rollback"]
    back = decisions[-1]
    assert back["stage"] == "shadow" and back["source"] == "controller"
    assert any("p95 TTFT" in reason for reason in back["reasons"]), back["reasons"]
    guard = back["guard_metrics"]
    assert guard["candidate"]["ttft_p95_s"] > 1.2 * guard["live"]["ttft_p95_s"]
    assert guard["candidate"]["requests"] >= MIN_REQUESTS and guard["verdict"]["outcome"] == "fail"
    # the replicas export vllm:request_success_total{finished_reason}: the error rate is judged
    assert guard["live"]["error_rate"] == 0.0 and guard["candidate"]["error_rate"] == 0.0

    view = client.get("/admin/models/chat-7b/rollouts", headers=ADMIN).json()
    assert view["rollout"]["phase"] == "rolled_back" and len(view["decisions"]) == 2

    reason = plane.config.model("reason-70b")
    assert reason is not None and reason.live == "v2" and reason.canary is None
    steps = [(d["decision"], d["stage"]) for d in registry.decisions("reason-70b")]
    assert steps == [("start", "shadow"), ("advance", "shadow"), ("advance", "canary-1"),
                     ("advance", "canary-10"), ("promote", "alias"), ("release", "alias")]
    assert "reason-70b@v1" not in plane.snapshot.names(CLUSTER)  # released after keep_old_s
    released = [p for p in registry.rows("pools") if (p["model"], p["version"]) == ("reason-70b", "v1")]
    assert released and all(p["released_at"] is not None for p in released)
    models = {m["model"]: m for m in registry.rows("models")}
    assert models["reason-70b"]["live_version"] == "v2"
    alias = plane.router.current.alias("reason-70b")  # type: ignore[union-attr]
    assert alias is not None and alias.live == "v2"

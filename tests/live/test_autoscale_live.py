"""`modelfleet up --autoscale` end to end: a load ramp through Envoy and the gateway (the official
openai client, no client retries) takes chat-7b@v13 from 1 to 3 replicas, and with the load gone
the pool goes back down one replica per (scaled) 10 minutes; no request fails in the whole run.

The stack runs 100x faster than real time: the cold start (312 s) takes ~3 s, the scale-down
window and period (600 s each) 6 s. The test version is a very slow GPU (2 output tokens/s at 4
streams, 2,000 tokens in flight per replica) so that a few streaming clients load it without
the client side eating the machine's CPU; its ``autoscaling:`` section sets the target to 30%:
600 tokens in flight and 1 waiting request per replica. A request is ~300 prompt tokens + 50 output tokens (~1 s of wall time); one replica
admits 5 of them (the gateway's admission counts 2,000 tokens per serving replica), and each
step of the ramp stays well inside that, so no request is refused while replicas start.
"""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import openai
import pytest

from modelfleet.contract.headers import CONVERSATION_HEADER
from modelfleet.local.harness import (
    RunningStack,
    assert_all_stopped,
    edit_yaml,
    start_stack,
    write_config,
)
from modelfleet.local.processes import pid_alive

pytestmark = pytest.mark.live

TIME_SCALE = 100.0
POOL = "chat-7b@v13"
PROMPT = "explain how the pool scales " * 50
MAX_TOKENS = 50


def _config(dest: Path) -> Path:
    config = write_config(dest, replicas={POOL: 1}, time_scale=TIME_SCALE)

    def models(data: Any) -> None:
        data["models"] = [{k: v for k, v in m.items() if k not in ("canary", "shadow")}
                          for m in data["models"] if m["name"] == "chat-7b"]
        data["versions"] = [v for v in data["versions"] if v["model"] == "chat-7b" and v["version"] == "v13"]
        data["versions"][0]["capacity"] = {"output_tokens_per_s": 2, "tokens_in_flight": 2000, "streams": 4}

    def pools(data: Any) -> None:
        data["regions"] = ["us-east-1"]
        data["pools"] = [{"model": "chat-7b", "version": "v13", "region": "us-east-1",
                          "min_replicas": 1, "max_replicas": 4}]

    def teams(data: Any) -> None:
        search = next(t for t in data["teams"] if t["name"] == "search")
        search["limits"] = [{"model": "chat-7b", "tokens_per_minute": 50_000_000, "max_concurrency": 500,
                             "guaranteed_share": 1.0, "tiers": ["interactive", "standard"]}]
        data["teams"] = [search]

    def local(data: Any) -> None:
        data["local"]["dev_keys"] = {"search": data["local"]["dev_keys"]["search"]}

    edit_yaml(config / "models.yaml", models)
    edit_yaml(config / "pools.yaml", pools)
    edit_yaml(config / "teams.yaml", teams)
    edit_yaml(config / "local.yaml", local)
    # The config's autoscaling section reaches the loop: add replicas at 30%. (At the seed's 70%
    # the clients would have to hold nearly all the gateway admits per replica -- by reservation,
    # prompt + max_tokens, released when the replica settles -- and the next one would get 429.)
    (config / "autoscaling.yaml").write_text("autoscaling:\n  target_utilization: 0.3\n")
    return config


class Load:
    """Client threads, each streaming one request after another until stopped; every outcome
    recorded (a stream counts only with its finish reason: the openai client raises on the
    replica's error event)."""

    def __init__(self, stack: RunningStack) -> None:
        self.client = openai.OpenAI(base_url=stack.base_url, api_key=stack.key("search"),
                                    max_retries=0, timeout=60.0)
        self.stop = threading.Event()
        self.ok = 0
        self.failures: list[str] = []
        self.threads: list[threading.Thread] = []
        self.lock = threading.Lock()

    def add(self, clients: int) -> None:
        for _ in range(clients):
            t = threading.Thread(target=self._run, args=(len(self.threads),), daemon=True)
            self.threads.append(t)
            t.start()

    def _run(self, n: int) -> None:
        i = 0
        while not self.stop.is_set():
            i += 1
            try:
                messages = [{"role": "user", "content": f"client {n} question {i}: {PROMPT}"}]
                chunks: list[Any] = list(self.client.chat.completions.create(
                    model="chat-7b", messages=messages, max_tokens=MAX_TOKENS, stream=True,  # type: ignore[arg-type]
                    extra_headers={CONVERSATION_HEADER: f"c{n}"}))
                assert any(c.choices and c.choices[0].finish_reason for c in chunks)
                with self.lock:
                    self.ok += 1
            except Exception as exc:  # every failure is the test's finding
                with self.lock:
                    self.failures.append(f"{type(exc).__name__}: {exc}")

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)


def _autoscale(stack: RunningStack) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads((stack.cwd / ".modelfleet" / "autoscale.json").read_text())
    except (OSError, ValueError):
        return {}
    return next((p for p in data.get("pools", []) if p["pool"] == POOL), {})


def _wait(stack: RunningStack, until: Any, timeout_s: float, seen: list[dict[str, Any]]) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pool = _autoscale(stack)
        if pool and (not seen or pool != seen[-1]):
            seen.append(pool)
        if pool and until(pool):
            return pool
        time.sleep(0.2)
    raise AssertionError(f"not reached in {timeout_s} s; last: {seen[-1] if seen else None}\n"
                         f"{stack.log.read_text()[-3000:]}")


def _status(stack: RunningStack) -> dict[str, Any]:
    """``modelfleet status --json`` run where the stack was started (the table too)."""
    exe = Path(sys.executable).parent / "modelfleet"
    out = subprocess.run([str(exe), "status", "--json"], cwd=stack.cwd, capture_output=True,
                         text=True, timeout=30, check=True)
    data: dict[str, Any] = json.loads(out.stdout)
    table = subprocess.run([str(exe), "status"], cwd=stack.cwd, capture_output=True, text=True,
                           timeout=30, check=True).stdout
    assert "AUTOSCALE" in table and POOL in table
    return data


def test_a_load_ramp_scales_up_and_back_down_without_a_failed_request(tmp_path: Path) -> None:
    stack = start_stack(tmp_path, _config(tmp_path / "config"), "--autoscale")
    load = Load(stack)
    seen: list[dict[str, Any]] = []
    pids: set[int] = set(stack.child_pids())
    try:
        first = _wait(stack, lambda p: p["current"] == 1, 15, seen)
        assert (first["min"], first["max"]) == (1, 4)
        load.add(1)                 # 1 client, < 350 tokens in flight: one replica is enough
        time.sleep(2)
        assert _autoscale(stack)["desired"] == 1
        # Each step stays inside what the serving replicas admit (5 requests of ~350 tokens per
        # replica), so no request waits for a replica still in its cold start.
        load.add(2)                 # 3 clients: ~800 / 600 -> 2 replicas
        _wait(stack, lambda p: p["current"] >= 2, 40, seen)
        load.add(3)                 # 6 clients: ~1,600 / 1,200 -> 3 replicas
        up = _wait(stack, lambda p: p["current"] >= 3, 40, seen)
        assert {t["trigger"]: t["target"] for t in up["triggers"]}["tokens-in-flight"] == 600
        assert "tokens-in-flight" in up["why"] or "queue-depth" in up["why"]
        assert any(p["starting"] > 0 for p in seen), "new replicas go through a cold start"
        status = _status(stack)
        pool = next(p for p in status["autoscale"]["pools"] if p["pool"] == POOL)
        assert {"current", "starting", "draining", "desired", "why", "triggers"} <= set(pool)
        pids |= {r["pid"] for r in up["replicas"] if r["pid"]}
        load.finish()
        peak = max(p["current"] for p in seen)
        down = _wait(stack, lambda p: p["current"] == 1 and p["draining"] == 0, 60, seen)
        assert down["desired"] == 1
    finally:
        load.finish()
        facts = json.loads((stack.cwd / ".modelfleet" / "local.json").read_text())
        pids |= {int(p["pid"]) for p in facts["processes"]}
        code = stack.stop(signal.SIGINT)
    assert code == 0, stack.log.read_text()[-3000:]
    assert_all_stopped(stack)
    assert not [p for p in pids if pid_alive(p)]

    assert load.failures == [], load.failures[:5]
    assert load.ok > 50
    assert peak >= 3
    # Down one replica at a time, each step at least one scale-down period (600 model s) after
    # the previous one, the first after the stabilisation window.
    desired = [(p["model_time_s"], p["desired"]) for p in seen]
    drops = [(t, before - d) for (_, before), (t, d) in itertools.pairwise(desired) if d < before]
    assert drops and all(step == 1 for _, step in drops), drops
    assert all(b[0] - a[0] >= 600 for a, b in itertools.pairwise(drops)), drops

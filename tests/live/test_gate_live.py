"""`modelfleet gate` against a real local stack (Envoy, gateway_ext, control plane, simulated
replicas at 2x real time): both versions answer a tiny eval set through the platform, scored per
category by task metrics and by reason-70b as the LLM judge; a short load test at rising
arrival rates finds a capacity with the tokens in flight the replicas reported; both are saved
with the version and read back through the admin API."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from modelfleet.local.harness import RunningStack, assert_all_stopped, start_stack, write_config

EVAL = [
    {"id": "r1", "category": "reasoning", "prompt": "All cats purr. Tom is a cat. Does Tom purr?",
     "expected": r"\w+", "scorer": "regex", "reference": "yes the cat will purr", "max_tokens": 40},
    {"id": "m1", "category": "maths", "prompt": "What is 17 x 23?", "expected": "391",
     "scorer": "exact", "max_tokens": 20},
    {"id": "l1", "category": "long", "prompt": "Write a long story about a replica.",
     "expected": r"\.", "scorer": "regex", "reference": "the replica", "max_tokens": 120},
]


@pytest.fixture(scope="module")
def small_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    cwd = tmp_path_factory.mktemp("gate")
    config = write_config(cwd / "config", {"chat-7b@v13": 1, "chat-7b@v14": 1, "reason-70b@v1": 1},
                          time_scale=2.0)
    running = start_stack(cwd, config)
    try:
        yield running
    finally:
        assert running.stop(signal.SIGINT) == 0, running.log.read_text()
        assert_all_stopped(running)


def test_gate_through_the_platform_with_a_judge_and_a_load_test(small_stack: RunningStack) -> None:
    cwd = small_stack.cwd
    (cwd / "eval.jsonl").write_text("\n".join(json.dumps(i) for i in EVAL) + "\n")
    exe = Path(sys.executable).parent / "modelfleet"
    done = subprocess.run(
        [str(exe), "gate", "chat-7b@v14", "--eval", "eval.jsonl", "--config", "config",
         "--judge", "reason-70b", "--load-test", "--rate-start", "2", "--rate-factor", "2",
         "--steps", "3", "--step-s", "8", "--output-tokens", "100", "--seed", "7",
         "--save", "--json"],
        cwd=cwd, capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert done.returncode in (0, 1), done.stderr
    report = json.loads(done.stdout)
    q = report["quality"]
    assert (q["new_version"], q["reference_version"]) == ("chat-7b@v14", "chat-7b@v13")
    # greedy answers depend on the prompt alone, so the simulated versions score alike
    assert q["new"] == q["reference"] and q["passed"]
    assert (q["new"]["reasoning"], q["new"]["maths"], q["new"]["long"]) == (1.0, 0.0, 1.0)
    judge = q["judge"]
    assert judge["model"] == "reason-70b" and judge["unparseable"] == {"chat-7b@v14": 0, "chat-7b@v13": 0}
    assert judge["parsed"]["chat-7b@v14"] == {"reasoning": 1, "maths": 1, "long": 1, "all": 3}
    assert all(1 <= s <= 10 for s in judge["mean_1_to_10"]["chat-7b@v14"].values())
    assert q["precision_change"] is None

    lt = report["load_test"]
    assert lt["kind"] == "platform" and lt["time_scale"] == 2.0
    rates = [s["rate_per_s"] for s in lt["steps"]]
    assert rates == [2.0, 4.0, 8.0][:len(rates)]  # stops early only at a failing step
    assert all(s["passed"] for s in lt["steps"][:-1])
    cap = lt["capacity"]
    assert cap is not None, done.stderr
    assert cap["output_tokens_per_s"] > 0 and cap["tokens_in_flight"] > 0 and cap["ttft_p95_s"] < 1.0
    assert report["saved"] == {"eval_report": True, "capacity": True}
    assert "capacity: {output_tokens_per_s:" in report["config_patch"]["capacity_line"]
    assert "gate: 2 req/s" in done.stderr  # progress per step

    facts = small_stack.facts
    rows = httpx.get(f"{facts['admin_url']}/admin/models/chat-7b/versions", timeout=5,
                     headers={"Authorization": f"Bearer {facts['admin_token']}"}).json()["versions"]
    row = next(r for r in rows if r["version"] == "v14")
    assert row["capacity_measured"] and row["load_test_tokens_in_flight"] == cap["tokens_in_flight"]
    assert row["load_test_tokens_per_s"] == pytest.approx(cap["output_tokens_per_s"])
    assert row["eval_report"]["judge"]["parsed"]["chat-7b@v13"]["all"] == 3

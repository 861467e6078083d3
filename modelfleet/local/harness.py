"""Run a whole local stack (`modelfleet up` as a child process) from tests, benchmarks and scripts.

Unlike :class:`modelfleet.local.stack.LocalStack`, which is the stack itself, this drives the
`modelfleet up` command exactly as a user would, and checks afterwards that nothing was left
running.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from modelfleet.local.processes import free_port, pid_alive

EXAMPLE_CONFIG = Path(__file__).resolve().parents[2] / "config"
START_TIMEOUT_S = 120.0


@dataclass
class RunningStack:
    """A `modelfleet up` process started by a test, and the facts it wrote."""

    popen: subprocess.Popen[bytes]
    cwd: Path
    facts: dict[str, Any]
    log: Path

    @property
    def base_url(self) -> str:
        return str(self.facts["base_url"])

    @property
    def gateway_url(self) -> str:
        """gateway_ext's own URL (settle, metrics, debug endpoints)."""
        return str(self.facts["gateway"]["url"])

    def key(self, team: str) -> str:
        """``team``'s dev key (the config's ``local.dev_keys``)."""
        return str(self.facts["keys"][team])

    def child_pids(self) -> list[int]:
        return [int(p["pid"]) for p in self.facts["processes"]]

    def stop(self, sig: int = signal.SIGINT, timeout_s: float = 30.0) -> int:
        """Send ``sig`` to `modelfleet up` and wait for it; returns its exit status."""
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
            try:
                self.popen.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        return int(self.popen.returncode)


def write_config(dest: Path, replicas: dict[str, int] | None = None, time_scale: float = 1.0) -> Path:
    """A copy of the example config with the given local replicas and time scale (edit the other
    files with :func:`edit_yaml`)."""
    shutil.copytree(EXAMPLE_CONFIG, dest)
    local = yaml.safe_load((dest / "local.yaml").read_text())
    if replicas is not None:
        local["local"]["replicas"] = replicas
    local["local"]["time_scale"] = time_scale
    (dest / "local.yaml").write_text(yaml.safe_dump(local))
    return dest


def edit_yaml(path: Path, edit: Callable[[Any], None]) -> None:
    """Load the YAML file at ``path``, let ``edit`` change the data in place, write it back."""
    data = yaml.safe_load(path.read_text())
    edit(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def start_stack(cwd: Path, config: Path, *extra: str, env: dict[str, str] | None = None) -> RunningStack:
    """Run `modelfleet up` in ``cwd`` and wait until it has written ``.modelfleet/local.json``.

    ``env`` adds environment variables (``MODELFLEET_GATEWAY_*`` reach the gateway)."""
    exe = Path(sys.executable).parent / "modelfleet"
    log = cwd / "up.log"
    port = free_port()
    with log.open("wb") as fh:
        popen = subprocess.Popen(
            [str(exe), "up", "--config", str(config), "--port", str(port), *extra],
            cwd=cwd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )
    facts_path = cwd / ".modelfleet" / "local.json"
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if popen.poll() is not None:
            raise RuntimeError(f"modelfleet up exited with {popen.returncode}:\n{log.read_text()}")
        if facts_path.exists():
            facts = json.loads(facts_path.read_text())
            return RunningStack(popen, cwd, facts, log)
        time.sleep(0.1)
    popen.send_signal(signal.SIGINT)
    popen.wait(timeout=30)
    raise TimeoutError(f"modelfleet up not ready in {START_TIMEOUT_S} s:\n{log.read_text()}")


def assert_all_stopped(stack: RunningStack) -> None:
    """No child of the stack is left running, and the facts file is gone."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(pid_alive(p) for p in stack.child_pids()):
        time.sleep(0.05)
    left = [p for p in stack.child_pids() if pid_alive(p)]
    for pid in left:  # clean up before failing, so nothing outlives the test run
        os.kill(pid, signal.SIGKILL)
    assert left == [], f"processes left behind: {left}\n{stack.log.read_text()}"
    assert not (stack.cwd / ".modelfleet" / "local.json").exists()


@contextlib.contextmanager
def postgres_stack(cwd: Path, config: Path, postgres_url: str, usage_prefix: str, *extra: str,
                   env: dict[str, str] | None = None) -> Iterator[RunningStack]:
    """`modelfleet up --debug` on ``config`` (e.g. from :func:`write_config`) in ``cwd``, usage in
    Postgres under ``usage_prefix`` flushed every 0.5 s (``env`` adds or overrides variables);
    afterwards: stopped with SIGINT (exit 0), no child left, the usage tables and the stack's batch
    tables (``MODELFLEET_BATCH_TABLE_PREFIX``, else the usage prefix) dropped. The scaffolding
    of the live tests that need a second stack with a temporary config."""
    from batch.store import BatchStore
    from gateway_ext.metering.store import UsageStore

    env = {"MODELFLEET_GATEWAY_FLUSH_INTERVAL_S": "0.5",
           "MODELFLEET_GATEWAY_USAGE_TABLE_PREFIX": usage_prefix, **(env or {})}
    running = start_stack(cwd, config, "--debug", "--usage-db-url", postgres_url, *extra, env=env)
    try:
        yield running
    finally:
        assert running.stop(signal.SIGINT) == 0, running.log.read_text()
        assert_all_stopped(running)
        store = UsageStore(postgres_url, usage_prefix)
        store.drop_tables()
        store.dispose()
        batch_prefix = env.get("MODELFLEET_BATCH_TABLE_PREFIX", usage_prefix)
        batches = BatchStore(postgres_url, batch_prefix)
        batches.drop_tables()
        batches.dispose()

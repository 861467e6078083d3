"""The autoscaler's replica processes (:mod:`modelfleet.local.autoscaler`): their plan, a health
probe and a hard kill, by PID (I/O edge)."""

from __future__ import annotations

import contextlib
import os
import signal

import httpx

from modelfleet.config.local_plan import ReplicaPlan
from modelfleet.local import processes as proc
from modelfleet.local.launch import HOST


def kill_child(child: proc.Child) -> None:
    """SIGKILL ``child`` (by its PID) if it still runs, and reap it."""
    if child.alive():
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.pid, signal.SIGKILL)
    child.popen.wait(timeout=10)


def member_plan(replica_id: str, key: str, index: int) -> ReplicaPlan:
    """The plan of replica ``index`` of pool ``key`` (``model@version``)."""
    model, version = key.split("@", 1)
    return ReplicaPlan(replica_id, model, version, index)


def answers_health(child: proc.Child) -> bool:
    """Whether ``child``'s ``/health`` answers 200 within 0.5 s."""
    try:
        return httpx.get(f"http://{HOST}:{child.port}/health", timeout=0.5).status_code == 200
    except httpx.HTTPError:
        return False

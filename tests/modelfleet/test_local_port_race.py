"""`modelfleet up` picks free ports before its children bind them; a child that lost that race
(another process took the port in between) is started again on fresh ports, other failures are
not retried (modelfleet.local.processes.start_on_free_ports)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from modelfleet.local.processes import Child, lost_port_race, start_on_free_ports


def _child(tmp_path: Path, port: int) -> Child:
    popen = subprocess.Popen([sys.executable, "-c", "pass"])
    popen.wait()
    return Child(f"svc-{port}", "gateway", popen, port, tmp_path / "svc.log")


def test_a_lost_port_race_is_retried_on_fresh_ports(tmp_path: Path) -> None:
    ports = iter([4001, 4002, 4003])
    launched: list[Child] = []
    forgotten: list[Child] = []

    def launch() -> Child:
        launched.append(_child(tmp_path, next(ports)))
        return launched[-1]

    def ready(child: Child) -> None:
        if child.port == 4001:
            raise RuntimeError("gateway: process exited with 1\nERROR: [Errno 98] error while "
                               "attempting to bind on address ('127.0.0.1', 4001): address "
                               "already in use")

    got = start_on_free_ports(launch, ready, forgotten.append)
    assert got.port == 4002
    assert [c.port for c in forgotten] == [4001]


def test_other_failures_and_the_last_attempt_are_raised(tmp_path: Path) -> None:
    def broken(child: Child) -> None:
        raise RuntimeError("control plane: process exited with 2\nconfig error")

    with pytest.raises(RuntimeError, match="config error"):
        start_on_free_ports(lambda: _child(tmp_path, 1), broken, lambda c: None)

    def taken(child: Child) -> None:
        raise RuntimeError("xDS: Failed to bind to address 127.0.0.1:5")

    forgotten: list[Child] = []
    with pytest.raises(RuntimeError, match="Failed to bind"):
        start_on_free_ports(lambda: _child(tmp_path, 5), taken, forgotten.append, attempts=3)
    assert len(forgotten) == 2  # the third failure is raised, not forgotten
    assert lost_port_race(RuntimeError("ADDRESS ALREADY IN USE"))
    assert not lost_port_race(RuntimeError("connection refused"))

"""Child processes of the local stack: start, wait until ready, stop by PID (I/O edge).

Children run in their own session so a Ctrl-C typed at the terminal reaches only
``modelfleet up``, which then stops them in order. Nothing here kills a process it did not start.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass
class Child:
    """One process the local stack started."""

    name: str
    role: str
    popen: subprocess.Popen[bytes]
    port: int
    log: Path
    target: str | None = None
    """``model@version`` for replicas."""
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def as_dict(self) -> dict[str, object]:
        """The ``processes`` entry of ``.modelfleet/local.json``."""
        out: dict[str, object] = {"name": self.name, "role": self.role, "pid": self.pid, "port": self.port}
        if self.target:
            out["model_version"] = self.target
        out["log"] = str(self.log)
        out.update(self.extra)
        return out


def python_module(module: str, *args: str) -> list[str]:
    """The command line that runs ``python -m module args`` in this interpreter.

    ``-P`` keeps the working directory off ``sys.path``, so a checkout's ``envoy/`` folder never
    shadows the installed ``envoy`` protos.
    """
    return [sys.executable, "-P", "-m", module, *args]


def spawn(name: str, role: str, argv: Sequence[str], port: int, log_dir: Path, target: str | None = None,
          env: dict[str, str] | None = None) -> Child:
    """Start ``argv`` in its own session with stdout and stderr to ``log_dir/name.log``."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{name.replace('@', '_')}.log"
    with log.open("ab") as fh:
        popen = subprocess.Popen(
            list(argv),
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
    return Child(name, role, popen, port, log, target)


def wait_until(ready: Callable[[], bool], timeout_s: float, what: str, child: Child | None = None,
               interval_s: float = 0.05) -> None:
    """Poll ``ready`` until it is true; raise with the child's log tail if it dies or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if child is not None and not child.alive():
            raise RuntimeError(f"{what}: process exited with {child.popen.returncode}\n{tail(child.log)}")
        try:
            if ready():
                return
        except (httpx.HTTPError, OSError):
            pass
        time.sleep(interval_s)
    raise TimeoutError(f"{what}: not ready after {timeout_s:.0f} s" + (f"\n{tail(child.log)}" if child else ""))


BIND_ATTEMPTS = 3
"""Starts of one child on fresh ports when the ports picked were taken before it bound them."""


def lost_port_race(exc: Exception) -> bool:
    """Whether a child's start failed because a port picked as free was taken before it bound it
    (another process, or an outgoing connection's ephemeral port, got there first)."""
    text = str(exc).lower()
    return "address already in use" in text or "failed to bind" in text


def start_on_free_ports(launch: Callable[[], Child], ready: Callable[[Child], None],
                        forget: Callable[[Child], None], attempts: int = BIND_ATTEMPTS) -> Child:
    """``launch()`` a child on freshly picked ports and wait for ``ready(child)``; when it lost
    the port race (:func:`lost_port_race`), ``forget`` it and launch again, ``attempts`` times
    in all. Other failures are raised at once."""
    for attempt in range(1, attempts + 1):
        child = launch()
        try:
            ready(child)
            return child
        except RuntimeError as exc:
            if not lost_port_race(exc) or attempt == attempts:
                raise
            forget(child)
    raise AssertionError("unreachable")


def http_ok(url: str) -> Callable[[], bool]:
    """A readiness probe: GET ``url`` answers 200."""
    def probe() -> bool:
        return httpx.get(url, timeout=1.0).status_code == 200
    return probe


def tail(path: Path, lines: int = 20) -> str:
    """The last ``lines`` lines of a log file (empty if missing)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def stop(child: Child, grace_s: float = 5.0) -> None:
    """SIGTERM ``child`` (by its PID), then SIGKILL after ``grace_s`` seconds; reap it."""
    if child.popen.poll() is not None:
        return
    try:
        os.kill(child.pid, signal.SIGTERM)
        child.popen.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.kill(child.pid, signal.SIGKILL)
        child.popen.wait(timeout=grace_s)
    except ProcessLookupError:
        pass


def pid_alive(pid: int) -> bool:
    """True if a process with this PID exists (and is not a zombie we could see)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True

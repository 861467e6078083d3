"""Pieces of the local stack (:mod:`modelfleet.local.stack`): its options, Envoy's start and
readiness, the facts of ``local.json`` and the small calls it makes to its children (I/O edge)."""

from __future__ import annotations

import json
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from modelfleet.config import PlatformConfig, Version
from modelfleet.local import processes as proc

HOST = "127.0.0.1"
READY_TIMEOUT_S = 60.0


@dataclass
class StackOptions:
    """How to start the local stack. Ports of 0 are picked free at start."""

    config_dir: Path
    port: int = 8080
    """The public API port (Envoy's listener)."""
    state_dir: Path = Path(".modelfleet")
    time_scale: float | None = None
    """Overrides the config's ``local.time_scale`` when set."""
    seed: int = 0
    debug: bool = False
    """Start the control plane and the gateway with their debug endpoints (tests inject invalid
    resources and read buckets)."""
    usage_db_url: str | None = None
    """The gateway's usage database (default: ``state_dir/usage.db``, SQLite)."""
    redis_url: str | None = None
    """Token buckets in Redis (default: in the gateway's memory)."""
    batch: bool = True
    """Run the batch service (``/v1/batches``, ``/v1/files`` and its worker) behind Envoy."""
    replica_env: dict[str, str] = field(default_factory=dict)
    """Extra environment of every simulated replica (``--autoscale`` sets the drain grace)."""

    @property
    def router_state_file(self) -> Path:
        """The control plane's ``--state-file``, which the gateway starts from."""
        return (self.state_dir / "router-state.json").resolve()


def start_envoy(options: StackOptions, children: list[proc.Child], log_dir: Path, cp: proc.Child,
                gateway: proc.Child, say: Any) -> proc.Child:
    """Render Envoy's bootstrap (xDS from the control plane ``cp``, ext_authz to ``gateway``, the
    batch service when ``children`` has one), start Envoy and wait until it is live."""
    from envoy_control.resources.bootstrap import render_bootstrap

    from modelfleet.local.envoy_process import envoy_argv

    admin_port = proc.free_port()
    boot = render_bootstrap(
        node_id="modelfleet-local-envoy-0",
        cluster="modelfleet-local",
        admin_port=admin_port,
        xds_host=HOST,
        xds_port=int(str(cp.extra["xds_port"])),
        gateway=(HOST, gateway.port),
        batch=next(((HOST, c.port) for c in children if c.role == "batch"), None),
    )
    path = options.state_dir / "envoy-bootstrap.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(boot, indent=2))
    say(f"envoy: admin on {HOST}:{admin_port}, API on {HOST}:{options.port}")
    envoy = proc.spawn("envoy", "envoy", envoy_argv(path, base_id=os.getpid() % 60000),
                       options.port, log_dir)
    envoy.extra["admin_port"] = admin_port
    children.append(envoy)
    proc.wait_until(_envoy_live(admin_port), READY_TIMEOUT_S, "envoy", envoy)
    return envoy


def wait_serving(options: StackOptions, envoy: proc.Child, cfg: PlatformConfig, say: Any) -> None:
    """Wait (up to ``READY_TIMEOUT_S`` seconds each) until Envoy has every live version's cluster
    healthy, then until its listener answers."""
    admin = f"http://{HOST}:{envoy.extra['admin_port']}"
    targets = {f"{m.name}@{m.live}" for m in cfg.models}

    def clusters_ready() -> bool:
        text = httpx.get(f"{admin}/clusters", timeout=1.0).text
        return all(f"{t}::" in text and "::health_flags::healthy" in text for t in targets)

    proc.wait_until(clusters_ready, READY_TIMEOUT_S, "envoy clusters", envoy)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:  # the listener arrives after the clusters (CDS -> LDS)
        try:
            httpx.get(f"http://{HOST}:{options.port}/v1/models", timeout=1.0)
            break
        except httpx.HTTPError:
            time.sleep(0.05)
    say("envoy: serving")


def stack_facts(options: StackOptions, children: list[proc.Child], admin_token: str, usage_db_url: str,
                cfg: PlatformConfig, cp: proc.Child, gateway: proc.Child, envoy: proc.Child) -> dict[str, Any]:
    """The facts of ``local.json``: URLs, the admin token, dev keys and the children."""
    gateway_url = f"http://{HOST}:{gateway.port}"
    return {
        "base_url": f"http://{HOST}:{options.port}/v1",
        "envoy_admin_url": f"http://{HOST}:{envoy.extra['admin_port']}",
        "control_plane": {
            "http_url": f"http://{HOST}:{cp.port}",
            "xds_address": f"{HOST}:{cp.extra['xds_port']}",
        },
        "admin_url": f"http://{HOST}:{cp.port}",
        "admin_token": admin_token,
        "gateway": {
            "url": gateway_url,
            "settle_url": settle_url(gateway),
            "metrics_url": f"{gateway_url}/metrics",
        },
        "usage_db_url": usage_db_url,
        **_batch_facts(options, children),
        "keys": dict(cfg.local.dev_keys),
        "config_dir": str(options.config_dir.resolve()),
        "time_scale": options.time_scale or cfg.local.time_scale,
        "pid": os.getpid(),
        "started_at": time.time(),
        "processes": [c.as_dict() for c in children],
    }


def _batch_facts(options: StackOptions, children: list[proc.Child]) -> dict[str, Any]:
    """``batch`` in ``local.json``: the service's own URL (the API is on ``base_url`` through
    Envoy), its metrics, where ``file://`` URIs and uploads live."""
    batch = next((c for c in children if c.role == "batch"), None)
    if batch is None:
        return {}
    state = options.state_dir.resolve()
    return {"batch": {"url": f"http://{HOST}:{batch.port}",
                      "metrics_url": f"http://{HOST}:{batch.port}/metrics",
                      "file_root": str(state / "batches" / "{team}"),
                      "files_dir": str(state / "uploads")}}


def write_admin_token(path: Path) -> None:
    """A fresh admin credential for this stack's control plane (mode 0600), distinct from team
    keys; ``local.json`` carries it as ``admin_token`` for the CLI (diff, apply, gate)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(secrets.token_urlsafe(24) + "\n")
    path.chmod(0o600)


def register_replica(cp_url: str, replica_id: str, model: str, version: str, host: str, port: int) -> None:
    """Tell the control plane a replica serves ``model@version`` at ``host:port``."""
    r = httpx.put(f"{cp_url}/v1/replicas/{replica_id}",
                  json={"model": model, "version": version, "host": host, "port": port}, timeout=5.0)
    r.raise_for_status()


def settle_url(gateway: proc.Child) -> str:
    """The gateway's settle endpoint, which replicas post their usage to."""
    from modelfleet.contract.headers import SETTLE_PATH

    return f"http://{HOST}:{gateway.port}{SETTLE_PATH}"


def redact_password(url: str) -> str:
    """A database ``url`` with its password masked, for printing."""
    from sqlalchemy import make_url

    return make_url(url).render_as_string(hide_password=True)


def _envoy_live(admin_port: int) -> Any:
    def probe() -> bool:
        r = httpx.get(f"http://{HOST}:{admin_port}/ready", timeout=1.0)
        return r.status_code == 200 and "LIVE" in r.text
    return probe


def version_of(cfg: PlatformConfig, target: str) -> Version | None:
    """The version record of ``model@version``."""
    model, _, version = target.partition("@")
    return cfg.version(model, version)

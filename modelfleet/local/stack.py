"""The local stack: control plane, gateway_ext, simulated replicas and a real Envoy on loopback
(I/O edge).

``LocalStack.start`` brings the processes up in dependency order (the gateway before the replicas,
which settle to it, and before Envoy, which checks every request with it) and returns the
connection facts; ``LocalStack.stop`` stops every child by its PID: Envoy first so no request is
cut at a replica that is already gone, then the replicas (their last settles reach the gateway),
then the gateway (it flushes usage on the way out), then the control plane.

The control plane keeps the router state in ``state_dir/router-state.json`` (``--state-file``;
its registry lands beside it in ``registry.db``): the gateway long-polls it over HTTP and starts
from the file if the control plane is down, and ``LocalStack.restart_control_plane`` starts a
dead control plane again on the same ports, from those files (files left by an earlier stack
are removed at start: its replicas are gone).
The replicas beat to the control plane every second (their middleware) and settle to the gateway.
The batch service (``/v1/batches``, ``/v1/files`` and its worker; ``StackOptions.batch``) starts
after the gateway, shares its usage database, is routed by Envoy on the same base URL, and is
stopped first (its worker cancels its requests and gives its leases back).
"""

from __future__ import annotations

import json
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from modelfleet.config import PlatformConfig, Version, load_config
from modelfleet.local import processes as proc
from modelfleet.local.plan import ReplicaPlan, replica_plan
from modelfleet.local.replicas import gateway_argv, replica_argv

HOST = "127.0.0.1"
READY_TIMEOUT_S = 60.0
BIND_ATTEMPTS = proc.BIND_ATTEMPTS
"""Tries per replica when the port picked for it was taken before it could bind."""


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


@dataclass
class LocalStack:
    """A running (or stopped) local stack and its children."""

    options: StackOptions
    children: list[proc.Child] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    control_plane_argv: list[str] = field(default_factory=list)
    admin_token: str = ""

    @property
    def log_dir(self) -> Path:
        return self.options.state_dir / "logs"

    def start(self, progress: Any = None) -> dict[str, Any]:
        """Start everything and wait until Envoy serves; returns the facts of ``local.json``.

        ``progress`` is called with one-line messages (or ignored when None). On any failure the
        children already started are stopped before the error propagates.
        """
        say = progress or (lambda _msg: None)
        opts = self.options
        cfg = load_config(opts.config_dir).config
        try:
            cp = self._start_control_plane(opts, say)
            gateway = self._start_gateway(cfg, opts, say)
            if opts.batch:
                self._start_batch(cfg, opts, say)
            self._start_replicas(cfg, opts, cp, gateway, say)
            envoy = self._start_envoy(cp, gateway, say)
            self._wait_serving(envoy, cfg, say)
        except BaseException:
            self.stop()
            raise
        self.facts = self._facts(cfg, cp, gateway, envoy)
        return self.facts

    def _start_control_plane(self, opts: StackOptions, say: Any) -> proc.Child:
        return proc.start_on_free_ports(lambda: self._launch_control_plane(opts, say),
                                        self._ready("control plane"), self.children.remove)

    def _ready(self, what: str) -> Any:
        """A wait for a child's ``/health`` on its port (raises with its log tail)."""
        return lambda child: proc.wait_until(proc.http_ok(f"http://{HOST}:{child.port}/health"),
                                             READY_TIMEOUT_S, what, child)

    def _launch_control_plane(self, opts: StackOptions, say: Any) -> proc.Child:
        xds_port, http_port = proc.free_port(), proc.free_port()
        # Beside --state-file the control plane also keeps its registry (registry.db): both
        # describe an earlier stack's replicas and changes, so each `up` starts without them, as
        # it did with an in-memory registry; a control plane restarted by `up` keeps both.
        for stale in (opts.router_state_file, opts.router_state_file.with_name("registry.db")):
            stale.unlink(missing_ok=True)
        token_file = opts.state_dir / "admin-token"
        write_admin_token(token_file)
        argv = proc.python_module(
            "envoy_control",
            "--config", str(opts.config_dir.resolve()),
            "--admin-token-file", str(token_file.resolve()),
            "--host", HOST,
            "--xds-port", str(xds_port),
            "--http-port", str(http_port),
            "--listener-port", str(opts.port),
            "--state-file", str(opts.router_state_file),
            *(["--debug"] if opts.debug else []),
        )
        say(f"control plane: xDS on {HOST}:{xds_port}, HTTP on {HOST}:{http_port}")
        cp = proc.spawn("control-plane", "control-plane", argv, http_port, self.log_dir)
        self.control_plane_argv = argv
        cp.extra["xds_port"] = xds_port
        self.admin_token = token_file.read_text().strip()
        self.children.append(cp)
        return cp

    def restart_control_plane(self) -> proc.Child:
        """Start the (dead) control plane again with the same command line and ports; it
        restores the replicas from the state file. Returns the new child."""
        old = next(c for c in self.children if c.role == "control-plane")
        if old.alive():
            raise RuntimeError("the control plane is running")
        cp = proc.spawn(old.name, old.role, self.control_plane_argv, old.port, self.log_dir)
        cp.extra.update(old.extra)
        self.children[self.children.index(old)] = cp
        proc.wait_until(proc.http_ok(f"http://{HOST}:{cp.port}/health"), READY_TIMEOUT_S,
                        "control plane", cp)
        self.facts["processes"] = [c.as_dict() for c in self.children]
        return cp

    def _start_gateway(self, cfg: PlatformConfig, opts: StackOptions, say: Any) -> proc.Child:
        return proc.start_on_free_ports(lambda: self._launch_gateway(cfg, opts, say),
                                        self._ready("gateway"), self.children.remove)

    def _launch_gateway(self, cfg: PlatformConfig, opts: StackOptions, say: Any) -> proc.Child:
        port = proc.free_port()
        state = opts.state_dir.resolve()
        usage_db = self._usage_db_url()
        cp = next(c for c in self.children if c.role == "control-plane")
        argv = gateway_argv(opts.config_dir.resolve(), HOST, port, usage_db, state / "usage-spool.jsonl",
                            cfg.local.region, redis_url=opts.redis_url, debug=opts.debug,
                            control_plane_url=f"http://{HOST}:{cp.port}",
                            router_state_file=opts.router_state_file)
        say(f"gateway: ext_authz and settle on {HOST}:{port}, usage in {redact_password(usage_db)}")
        gateway = proc.spawn("gateway", "gateway", argv, port, self.log_dir)
        self.children.append(gateway)
        return gateway

    def _start_batch(self, cfg: PlatformConfig, opts: StackOptions, say: Any) -> proc.Child:
        return proc.start_on_free_ports(lambda: self._launch_batch(cfg, opts, say),
                                        self._ready("batch"), self.children.remove)

    def _launch_batch(self, cfg: PlatformConfig, opts: StackOptions, say: Any) -> proc.Child:
        """The batch service (API and worker in one process) on the usage database (SQLite in
        WAL mode with a busy timeout when it is a file), sending lines through Envoy with the dev
        keys; ``file://`` URIs under ``state_dir/batches/<team>/``, uploads in ``state_dir/uploads``."""
        from gateway_ext.batch_main import batch_service_argv

        port, state = proc.free_port(), opts.state_dir.resolve()
        for team in cfg.teams:
            (state / "batches" / team.name).mkdir(parents=True, exist_ok=True)
        # the batch tables go beside the usage tables: the gateway's prefix unless set for batch
        prefix = None if "MODELFLEET_BATCH_TABLE_PREFIX" in os.environ else os.environ.get(
            "MODELFLEET_GATEWAY_USAGE_TABLE_PREFIX")
        argv = batch_service_argv(opts.config_dir.resolve(), HOST, port, self._usage_db_url(),
                                  f"http://{HOST}:{opts.port}/v1", table_prefix=prefix,
                                  file_roots=[state / "batches" / "{team}"],
                                  extra=["--files-dir", str(state / "uploads")])
        say(f"batch: /v1/batches and /v1/files on {HOST}:{port}, files under {state / 'batches'}/<team>")
        batch = proc.spawn("batch", "batch", argv, port, self.log_dir)
        self.children.append(batch)
        return batch

    def _usage_db_url(self) -> str:
        """The gateway's usage database: the option, else ``state_dir/usage.db`` (SQLite)."""
        return self.options.usage_db_url or f"sqlite:///{(self.options.state_dir / 'usage.db').resolve()}"

    def _start_replicas(self, cfg: PlatformConfig, opts: StackOptions, cp: proc.Child, gateway: proc.Child,
                        say: Any) -> None:
        cp_url = f"http://{HOST}:{cp.port}"

        def launch(plan: ReplicaPlan) -> proc.Child:
            return self.spawn_replica(cfg, plan)

        started = [(plan, launch(plan)) for plan in replica_plan(cfg)]
        say(f"replicas: starting {len(started)} ({', '.join(sorted({p.target for p, _ in started}))})")
        for plan, child in started:
            for attempt in range(1, BIND_ATTEMPTS + 1):
                try:
                    proc.wait_until(proc.http_ok(f"http://{HOST}:{child.port}/health"), READY_TIMEOUT_S,
                                    f"replica {plan.replica_id}", child)
                    break
                except RuntimeError as exc:
                    # a free port can be taken between picking it and binding it: pick another
                    if not proc.lost_port_race(exc) or attempt == BIND_ATTEMPTS:
                        raise
                    self.children.remove(child)
                    child = launch(plan)
            register_replica(cp_url, plan.replica_id, plan.model, plan.version, HOST, child.port)

    def spawn_replica(self, cfg: PlatformConfig, plan: ReplicaPlan) -> proc.Child:
        """Start one simulated replica on a free port (not waiting for it); it beats to the
        control plane and settles to the gateway. ``options.replica_env`` goes to its environment."""
        opts = self.options
        cp = next(c for c in self.children if c.role == "control-plane")
        gateway = next(c for c in self.children if c.role == "gateway")
        version = cfg.version(plan.model, plan.version)
        assert version is not None  # checked by load_config
        port = proc.free_port()
        argv = replica_argv(version, plan.replica_id, HOST, port, cfg.local.region,
                            opts.time_scale or cfg.local.time_scale, opts.seed + plan.index,
                            settle_url=_settle_url(gateway), control_plane_url=f"http://{HOST}:{cp.port}",
                            debug=opts.debug)
        child = proc.spawn(plan.replica_id, "replica", argv, port, self.log_dir, target=plan.target,
                           env=opts.replica_env or None)
        child.extra["replica_id"] = plan.replica_id
        self.children.append(child)
        return child

    def _start_envoy(self, cp: proc.Child, gateway: proc.Child, say: Any) -> proc.Child:
        from envoy_control.bootstrap import render_bootstrap
        from envoy_control.envoy_process import envoy_argv

        admin_port = proc.free_port()
        boot = render_bootstrap(
            node_id="modelfleet-local-envoy-0",
            cluster="modelfleet-local",
            admin_port=admin_port,
            xds_host=HOST,
            xds_port=int(str(cp.extra["xds_port"])),
            gateway=(HOST, gateway.port),
            batch=next(((HOST, c.port) for c in self.children if c.role == "batch"), None),
        )
        path = self.options.state_dir / "envoy-bootstrap.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(boot, indent=2))
        say(f"envoy: admin on {HOST}:{admin_port}, API on {HOST}:{self.options.port}")
        envoy = proc.spawn("envoy", "envoy", envoy_argv(path, base_id=os.getpid() % 60000),
                           self.options.port, self.log_dir)
        envoy.extra["admin_port"] = admin_port
        self.children.append(envoy)
        proc.wait_until(_envoy_live(admin_port), READY_TIMEOUT_S, "envoy", envoy)
        return envoy

    def _wait_serving(self, envoy: proc.Child, cfg: PlatformConfig, say: Any) -> None:
        admin = f"http://{HOST}:{envoy.extra['admin_port']}"
        targets = {f"{m.name}@{m.live}" for m in cfg.models}

        def clusters_ready() -> bool:
            text = httpx.get(f"{admin}/clusters", timeout=1.0).text
            return all(f"{t}::" in text and "::health_flags::healthy" in text for t in targets)

        proc.wait_until(clusters_ready, READY_TIMEOUT_S, "envoy clusters", envoy)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:  # the listener arrives after the clusters (CDS -> LDS)
            try:
                httpx.get(f"http://{HOST}:{self.options.port}/v1/models", timeout=1.0)
                break
            except httpx.HTTPError:
                time.sleep(0.05)
        say("envoy: serving")

    def _facts(self, cfg: PlatformConfig, cp: proc.Child, gateway: proc.Child, envoy: proc.Child) -> dict[str, Any]:
        gateway_url = f"http://{HOST}:{gateway.port}"
        return {
            "base_url": f"http://{HOST}:{self.options.port}/v1",
            "envoy_admin_url": f"http://{HOST}:{envoy.extra['admin_port']}",
            "control_plane": {
                "http_url": f"http://{HOST}:{cp.port}",
                "xds_address": f"{HOST}:{cp.extra['xds_port']}",
            },
            "admin_url": f"http://{HOST}:{cp.port}",
            "admin_token": self.admin_token,
            "gateway": {
                "url": gateway_url,
                "settle_url": _settle_url(gateway),
                "metrics_url": f"{gateway_url}/metrics",
            },
            "usage_db_url": self._usage_db_url(),
            **self._batch_facts(),
            "keys": dict(cfg.local.dev_keys),
            "config_dir": str(self.options.config_dir.resolve()),
            "time_scale": self.options.time_scale or cfg.local.time_scale,
            "pid": os.getpid(),
            "started_at": time.time(),
            "processes": [c.as_dict() for c in self.children],
        }

    def _batch_facts(self) -> dict[str, Any]:
        """``batch`` in ``local.json``: the service's own URL (the API is on ``base_url`` through
        Envoy), its metrics, where ``file://`` URIs and uploads live."""
        batch = next((c for c in self.children if c.role == "batch"), None)
        if batch is None:
            return {}
        state = self.options.state_dir.resolve()
        return {"batch": {"url": f"http://{HOST}:{batch.port}",
                          "metrics_url": f"http://{HOST}:{batch.port}/metrics",
                          "file_root": str(state / "batches" / "{team}"),
                          "files_dir": str(state / "uploads")}}

    def stop(self) -> None:
        """Stop every child by PID: Envoy, replicas, the gateway, then the control plane."""
        order = {"batch": -1, "envoy": 0, "replica": 1, "gateway": 2, "control-plane": 3}
        for child in sorted(self.children, key=lambda c: order.get(c.role, 3)):
            proc.stop(child)

    def dead_children(self) -> list[proc.Child]:
        """Children that exited on their own."""
        return [c for c in self.children if not c.alive()]


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


def _settle_url(gateway: proc.Child) -> str:
    from gateway_ext.contract import SETTLE_PATH

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

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

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from modelfleet.config import PlatformConfig, load_config
from modelfleet.config.local_plan import ReplicaPlan, replica_plan
from modelfleet.local import processes as proc
from modelfleet.local.launch import (
    HOST,
    READY_TIMEOUT_S,
    StackOptions,
    redact_password,
    register_replica,
    settle_url,
    stack_facts,
    start_envoy,
    version_of,
    wait_serving,
    write_admin_token,
)
from modelfleet.local.replicas import gateway_argv, replica_argv

__all__ = ["BIND_ATTEMPTS", "HOST", "READY_TIMEOUT_S", "LocalStack", "StackOptions", "redact_password",
           "register_replica", "version_of", "write_admin_token"]
BIND_ATTEMPTS = proc.BIND_ATTEMPTS
"""Tries per replica when the port picked for it was taken before it could bind."""


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
            envoy = start_envoy(opts, self.children, self.log_dir, cp, gateway, say)
            wait_serving(opts, envoy, cfg, say)
        except BaseException:
            self.stop()
            raise
        self.facts = stack_facts(opts, self.children, self.admin_token, self._usage_db_url(), cfg, cp,
                                 gateway, envoy)
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
        from batch.service import batch_service_argv

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
                            settle_url=settle_url(gateway), control_plane_url=f"http://{HOST}:{cp.port}",
                            debug=opts.debug)
        child = proc.spawn(plan.replica_id, "replica", argv, port, self.log_dir, target=plan.target,
                           env=opts.replica_env or None)
        child.extra["replica_id"] = plan.replica_id
        self.children.append(child)
        return child

    def stop(self) -> None:
        """Stop every child by PID: Envoy, replicas, the gateway, then the control plane."""
        order = {"batch": -1, "envoy": 0, "replica": 1, "gateway": 2, "control-plane": 3}
        for child in sorted(self.children, key=lambda c: order.get(c.role, 3)):
            proc.stop(child)

    def dead_children(self) -> list[proc.Child]:
        """Children that exited on their own."""
        return [c for c in self.children if not c.alive()]


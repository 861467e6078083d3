"""``modelfleet up --autoscale``: the local stack's autoscaling loop (I/O edge).

Every sync (the ``autoscaling.polling_interval_s`` of model time, i.e. divided by the time
scale, at least 0.5 s of wall time) it reads, per pool, the serving replicas' tokens in flight
and engine queue from the control plane's pool state (``GET /admin/pools/{model}/state``, fed by
the heartbeats) and the gateway's admission queue for the pool (its ``/metrics``), runs the pure
step :func:`autoscale.local_loop.sync_pool` and carries out the changes:

- start: the replica is ``starting`` for the scaled cold start (node start + weights pull +
  load + warm-up) with no process at all, so nothing can route to it; then its process starts,
  and once its ``/health`` answers it is registered with the control plane and ``serving``;
- stop: a replica still in its cold start is dropped; a running one gets SIGTERM: it beats
  ``draining`` at once (out of the ring and the gateway's router state), answers 503 (retried
  elsewhere by Envoy) for the drain grace, finishes its streams and exits; it is killed only after
  grace + the scaled stream bound + a margin, and then removed from the control plane.

Between syncs :meth:`LocalAutoscaler.tick` only advances those lifecycles (no blocking waits);
``modelfleet up`` calls it from its watch loop. Each sync writes ``.modelfleet/autoscale.json``
(what ``modelfleet status`` shows: serving, starting, draining, desired and why, per pool).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import httpx

from autoscale.local_loop import (
    LocalPool,
    Member,
    cold_start_wall_s,
    drain_wall_s,
    local_pool,
    sync_period_wall_s,
)
from autoscale.local_loop import sync_pool as plan_sync
from autoscale.rule import ScalerState
from modelfleet.config import PlatformConfig
from modelfleet.config.local_plan import ReplicaPlan, replica_counts
from modelfleet.local import processes as proc
from modelfleet.local.autoscaler_children import answers_health, kill_child, member_plan
from modelfleet.local.autoscaler_env import MIN_PRESTOP_WALL_S, prepare_options, replica_env
from modelfleet.local.autoscaler_readings import gateway_queue_depths, pool_load
from modelfleet.local.autoscaler_view import AUTOSCALE_FILE
from modelfleet.local.launch import HOST, register_replica
from modelfleet.local.stack import LocalStack
from modelfleet.local.state import write_state

__all__ = ["MIN_PRESTOP_WALL_S", "LocalAutoscaler", "prepare_options", "replica_env"]


@dataclass
class _Replica:
    member: Member
    plan: ReplicaPlan
    child: proc.Child | None
    start_at: float
    """Wall (monotonic) second at which a starting replica's process starts."""
    kill_at: float | None = None


class LocalAutoscaler:
    """The loop over every pool the local stack runs that the config declares a pool for."""

    def __init__(self, stack: LocalStack, cfg: PlatformConfig, time_scale: float, *,
                 cold_start_s: float | None = None, clock: Callable[[], float] = time.monotonic,
                 say: Callable[[str], None] = lambda _m: None,
                 on_change: Callable[[], None] = lambda: None) -> None:
        self.stack, self.cfg, self.time_scale = stack, cfg, time_scale
        self.clock, self.say, self.on_change = clock, say, on_change
        self.path = stack.options.state_dir / AUTOSCALE_FILE
        self.facts = stack.facts
        self.pools: dict[str, LocalPool] = {}
        self.skipped: dict[str, str] = {}
        for key in sorted(replica_counts(cfg)):
            pool = local_pool(cfg, key, cfg.local.region)
            if pool is None:
                self.skipped[key] = f"no pool declares {key}: fixed at {replica_counts(cfg)[key]}"
                continue
            if cold_start_s is not None:
                pool = replace(pool, cold_start_s=cold_start_s)
            self.pools[key] = pool
        self.states = {key: ScalerState() for key in self.pools}
        self.replicas: dict[str, dict[str, _Replica]] = {key: {} for key in self.pools}
        self.next_index = dict.fromkeys(self.pools, 0)
        self.t0 = clock()
        for child in stack.children:
            if child.role == "replica" and child.target in self.pools:
                key = child.target
                index = int(child.name.rsplit("-", 1)[1])
                plan = member_plan(child.name, key, index)
                self.replicas[key][child.name] = _Replica(Member(child.name, "serving", 0.0), plan, child, 0.0)
                self.next_index[key] = max(self.next_index[key], index + 1)
        self.period_s = min((sync_period_wall_s(p, time_scale) for p in self.pools.values()), default=1.0)
        self.next_sync = self.t0 + self.period_s
        self.reports: dict[str, dict[str, Any]] = {}

    def model_now(self) -> float:
        """Model seconds since the loop started."""
        return (self.clock() - self.t0) * self.time_scale

    def tick(self) -> None:
        """Advance starting and draining replicas; sync when one is due."""
        for key in self.pools:
            for r in list(self.replicas[key].values()):
                try:
                    self._advance(key, r)
                except (httpx.HTTPError, OSError) as exc:  # e.g. the control plane restarting
                    self.say(f"{r.member.replica_id}: {exc}; retrying")
        if self.clock() >= self.next_sync:
            self.next_sync = self.clock() + self.period_s
            self.sync()

    def stopping(self, child: proc.Child) -> bool:
        """Whether ``child`` is a replica this loop is draining (its exit is expected)."""
        return any(r.child is child and r.member.phase == "draining"
                   for replicas in self.replicas.values() for r in replicas.values())

    # ------------------------------------------------------------------ lifecycles

    def _advance(self, key: str, r: _Replica) -> None:
        m, now = r.member, self.clock()
        if m.phase == "starting" and r.child is None and now >= r.start_at:
            r.child = self.stack.spawn_replica(self.cfg, r.plan)
            self._changed(f"{m.replica_id}: cold start over, process started (pid {r.child.pid})")
        elif m.phase == "starting" and r.child is not None:
            if not r.child.alive():
                self._forget(key, r, f"{m.replica_id}: exited while starting ({r.child.popen.returncode}); "
                             f"log {r.child.log}")
            elif answers_health(r.child):
                register_replica(self._cp_url(), m.replica_id, r.plan.model, r.plan.version, HOST,
                                 r.child.port)
                r.member = Member(m.replica_id, "serving", self.model_now())
                self._changed(f"{m.replica_id}: serving")
        elif m.phase == "draining":
            if r.child is not None and r.child.alive() and r.kill_at is not None and now >= r.kill_at:
                self.say(f"{m.replica_id}: drain bound passed, killing pid {r.child.pid}")
                kill_child(r.child)
            if r.child is None or not r.child.alive():
                self._forget(key, r, f"{m.replica_id}: drained and stopped")

    def _stop(self, key: str, replica_id: str) -> None:
        r = self.replicas[key][replica_id]
        if r.child is None:
            self._forget(key, r, f"{replica_id}: cold start cancelled")
            return
        pool = self.pools[key]
        _grace, kill_after = drain_wall_s(pool, self.time_scale, MIN_PRESTOP_WALL_S)
        with contextlib.suppress(ProcessLookupError):
            os.kill(r.child.pid, signal.SIGTERM)
        r.member = Member(replica_id, "draining", self.model_now())
        r.kill_at = self.clock() + kill_after
        self._changed(f"{replica_id}: draining (killed after {kill_after:.1f} s if still running)")

    def _start(self, key: str) -> None:
        index = self.next_index[key]
        self.next_index[key] += 1
        plan = member_plan(f"{key}-{index}", key, index)
        wait = cold_start_wall_s(self.pools[key], self.time_scale)
        self.replicas[key][plan.replica_id] = _Replica(
            Member(plan.replica_id, "starting", self.model_now()), plan, None, self.clock() + wait)
        self._changed(f"{plan.replica_id}: starting (cold start {wait:.1f} s)")

    def _forget(self, key: str, r: _Replica, message: str) -> None:
        self.replicas[key].pop(r.member.replica_id, None)
        if r.child is not None:
            kill_child(r.child)
            if r.child in self.stack.children:
                self.stack.children.remove(r.child)
            with contextlib.suppress(httpx.HTTPError):  # else forgotten once silent 300 s
                httpx.delete(f"{self._cp_url()}/v1/replicas/{r.member.replica_id}", timeout=2.0)
        self._changed(message)

    def _changed(self, message: str) -> None:
        self.say(message)
        self.facts["processes"] = [c.as_dict() for c in self.stack.children]
        self.on_change()

    # ------------------------------------------------------------------ syncs

    def sync(self) -> None:
        """Read every pool's load, run the rule, start and stop replicas, write the file."""
        now_s, at = self.model_now(), datetime.now(UTC)
        gateway_queue = self._gateway_queues()
        states: dict[str, dict[str, Any] | None] = {}
        for key, pool in self.pools.items():
            model = key.split("@", 1)[0]
            if model not in states:
                states[model] = self._pool_state(model)
            members = [r.member for r in self.replicas[key].values()]
            load = pool_load(states[model], key, members, gateway_queue)
            step = plan_sync(pool, self.states[key], members, load, now_s, at)
            self.states[key] = step.decision.state
            for replica_id in step.changes.stop:
                self._stop(key, replica_id)
            for _ in range(step.changes.start):
                self._start(key)
            self.reports[key] = {**step.report, "replicas": [
                {"replica_id": r.member.replica_id, "phase": r.member.phase,
                 "pid": r.child.pid if r.child else None} for r in self.replicas[key].values()]}
        self.write()

    def write(self) -> None:
        """Write ``autoscale.json`` (atomically) for ``modelfleet status``."""
        write_state(self.path, {
            "updated_at": time.time(), "time_scale": self.time_scale,
            "sync_period_s": self.period_s, "model_time_s": round(self.model_now(), 1),
            "pools": [self.reports[k] for k in sorted(self.reports)],
            "not_autoscaled": self.skipped,
        })

    def _cp_url(self) -> str:
        cp = next(c for c in self.stack.children if c.role == "control-plane")
        return f"http://{HOST}:{cp.port}"

    def _pool_state(self, model: str) -> dict[str, Any] | None:
        try:
            r = httpx.get(f"{self._cp_url()}/admin/pools/{model}/state", timeout=1.0,
                          headers={"authorization": f"Bearer {self.stack.admin_token}"})
            r.raise_for_status()
            data: dict[str, Any] = r.json()
            return data
        except (httpx.HTTPError, ValueError):
            return None

    def _gateway_queues(self) -> dict[str, float] | None:
        gateway = next((c for c in self.stack.children if c.role == "gateway"), None)
        if gateway is None:
            return None
        try:
            text = httpx.get(f"http://{HOST}:{gateway.port}/metrics", timeout=1.0).text
        except httpx.HTTPError:
            return None
        return gateway_queue_depths(text)


"""The rollout controller's I/O: reads guard metrics, runs :mod:`envoy_control.rollouts.controller`, and
applies its actions through the control plane as ``controller`` overrides.

One rollout per model at a time. Every tick (``interval_s``, default 5 s) each running
rollout's live and candidate versions are read over the policy's window (Prometheus:
:class:`envoy_control.rollouts.prom.PromGuardReader`), judged (:func:`envoy_control.rollouts.guard.judge`), and
the state machine's actions become overrides (:mod:`envoy_control.state.changes`), published
to every Envoy and gateway at once. Each decision is recorded in the registry's ``rollouts``
table with the metrics behind it. A metrics read that fails moves nothing (logged).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from envoy_control.registry.store import Registry
from envoy_control.rollouts.controller import (
    Action,
    Phase,
    ReleasePool,
    Rollout,
    RolloutDecision,
    RolloutPolicy,
    SetAlias,
    SetStage,
    Step,
    abort,
    advance,
    begin,
    policy_from_config,
)
from envoy_control.rollouts.guard import VersionMetrics, judge
from envoy_control.rollouts.resume import Unresumable, resume
from envoy_control.state.changes import alias_changes, rollout_changes, status_changes
from envoy_control.state.plane import ControlPlane

from modelfleet.config import ConfigError

log = logging.getLogger(__name__)
SOURCE = "controller"


class GuardReader(Protocol):
    """Where guard metrics come from (Prometheus in production, anything in tests)."""

    async def read(self, model: str, version: str, window_s: float) -> VersionMetrics:
        """Metrics of ``model@version`` over the last ``window_s`` seconds."""
        ...


class RolloutError(Exception):
    """A rollout cannot start (unknown version, one already running, ...)."""


def decision_row(d: RolloutDecision) -> dict[str, Any]:
    """A decision as a ``rollouts`` row (times in Unix seconds)."""
    return {"model": d.model, "version": d.version, "stage": d.stage, "percent": d.percent,
            "started_at": d.started_s, "decided_at": d.decided_s, "decision": d.decision,
            "reasons": list(d.reasons), "guard_metrics": d.guard, "source": SOURCE,
            "previous": d.previous}


def with_overrides(p: RolloutPolicy, hold_s: float | None = None, window_s: float | None = None,
                   min_requests: int | None = None) -> RolloutPolicy:
    """``p`` with every stage held ``hold_s`` seconds, a ``window_s`` guard window or a sample
    minimum, where given."""
    if hold_s is not None:
        p = dataclasses.replace(p, stages=tuple(dataclasses.replace(s, hold_s=hold_s)
                                                for s in p.stages))
    if window_s is not None:
        p = dataclasses.replace(p, window_s=window_s)
    if min_requests is not None:
        p = dataclasses.replace(p, thresholds=dataclasses.replace(
            p.thresholds, min_requests=min_requests))
    return p


class RolloutDriver:
    """Runs rollouts against ``plane``; ``clock`` is Unix seconds (decisions are recorded
    with it and stage holds are measured on it). The policy is ``policy`` if given, else the
    served config's ``rollout:`` section read at each start; ``hold_s``, ``window_s`` and
    ``min_requests`` (the command line's flags) override either."""

    def __init__(self, plane: ControlPlane, reader: GuardReader | None,
                 policy: RolloutPolicy | None = None, registry: Registry | None = None,
                 clock: Callable[[], float] = time.time, *, hold_s: float | None = None,
                 window_s: float | None = None, min_requests: int | None = None) -> None:
        self.plane, self.reader = plane, reader
        self.fixed_policy = policy
        self.hold_s, self.window_s, self.min_requests = hold_s, window_s, min_requests
        self.registry, self.clock = registry, clock
        self.rollouts: dict[str, Rollout] = {}
        self.history: list[RolloutDecision] = []

    @property
    def policy(self) -> RolloutPolicy:
        """The policy a rollout started now gets (see the class docstring)."""
        base = self.fixed_policy or policy_from_config(self.plane.config.rollout)
        return with_overrides(base, self.hold_s, self.window_s, self.min_requests)

    def policy_for(self, hold_s: float | None = None, window_s: float | None = None,
                   min_requests: int | None = None) -> RolloutPolicy:
        """The driver's policy with a rollout's own hold, window or sample minimum."""
        return with_overrides(self.policy, hold_s, window_s, min_requests)

    def resume(self) -> list[Rollout]:
        """Take up the rollouts the registry's decisions leave in progress (a restart); an
        unplaceable one is recorded as aborted. Returns the rollouts resumed."""
        if self.registry is None:
            return []
        out = []
        policy = self.policy
        for m in self.plane.config.models:
            rows = self.registry.decisions(m.name)
            found = resume(rows[-1], policy, m.live) if rows else None
            if isinstance(found, Unresumable):
                log.warning("rollout of %s@%s not resumed: %s", found.model, found.version,
                            found.reason)
                self._record(RolloutDecision(found.model, found.version, found.stage, 0.0,
                                      self.clock(), self.clock(), "abort",
                                      (f"not resumed after a restart: {found.reason}",),
                                      previous=found.previous))
            elif found is not None:
                self.rollouts[m.name] = found
                out.append(found)
                log.info("rollout of %s@%s resumed: %s at %s since %.0f", found.model,
                         found.version, found.phase, found.stage.name, found.stage_started_s)
        return out

    def running(self, model: str) -> Rollout | None:
        """The running rollout of ``model``, if any."""
        r = self.rollouts.get(model)
        return r if r is not None and r.phase == Phase.RUNNING else None

    def start(self, model: str, version: str, policy: RolloutPolicy | None = None) -> Rollout:
        """Start rolling ``model@version`` out; raises :class:`RolloutError`."""
        config = self.plane.config
        m, v = config.model(model), config.version(model, version)
        if m is None or v is None or v.status == "retired":
            raise RolloutError(f"{model}@{version} is not a served version: register it first")
        if m.live == version:
            raise RolloutError(f"{model}@{version} is already the live version")
        if self.running(model) is not None:
            raise RolloutError(f"a rollout of {model} is already running")
        if self.reader is None:
            raise RolloutError("no guard metrics: start the control plane with --prometheus-url")
        self._apply(begin(model, version, m.live, policy or self.policy, self.clock()))
        return self.rollouts[model]

    def abort(self, model: str, reason: str) -> None:
        """Stop ``model``'s running rollout where it is (a manual change took over)."""
        r = self.running(model)
        if r is not None:
            self._apply(abort(r, self.clock(), reason))

    async def _verdict(self, r: Rollout) -> tuple[Any, dict[str, Any] | None]:
        if self.reader is None:  # resumed without --prometheus-url: held where it is
            return None, None
        window = r.policy.window_s
        try:
            live = await self.reader.read(r.model, r.previous, window)
            candidate = await self.reader.read(r.model, r.version, window)
        except Exception as exc:
            log.warning("guard metrics of %s@%s unreadable, holding: %s", r.model, r.version, exc)
            return None, None
        metrics = {"window_s": window, "live": {"version": r.previous, **live.as_dict()},
                   "candidate": {"version": r.version, **candidate.as_dict()}}
        return judge(live, candidate, r.policy.thresholds), metrics

    async def tick(self) -> list[RolloutDecision]:
        """Advance every rollout once; returns the decisions taken."""
        taken = []
        for r in list(self.rollouts.values()):
            if r.phase not in (Phase.RUNNING, Phase.PROMOTED):
                continue
            verdict, metrics = (await self._verdict(r)) if r.phase == Phase.RUNNING else (None, None)
            current = self.rollouts.get(r.model)
            if current is not r:
                continue  # aborted while the metrics were read
            step = advance(r, self.clock(), verdict, metrics)
            self._apply(step)
            if step.decision is not None:
                taken.append(step.decision)
        return taken

    async def run(self, interval_s: float = 5.0) -> None:
        """Tick every ``interval_s`` seconds until cancelled; an error is logged, not raised."""
        while True:
            try:
                await self.tick()
            except Exception:
                log.exception("rollout tick failed")
            await asyncio.sleep(interval_s)

    def _apply(self, step: Step) -> None:
        r = step.rollout
        self.rollouts[r.model] = r
        reason = "; ".join(step.decision.reasons) if step.decision else ""
        if step.decision is not None:
            reason = f"{step.decision.decision} of {r.model}@{r.version}: {reason}"
        for action in step.actions:
            try:
                self._act(action, reason)
            except ConfigError as exc:
                message = "; ".join(p.message for p in exc.problems if p.severity == "error")
                log.error("rollout of %s@%s stopped: %s", r.model, r.version, message)
                self.rollouts[r.model] = dataclasses.replace(r, phase=Phase.ABORTED)
                self._record(RolloutDecision(r.model, r.version, r.stage.name, r.stage.percent,
                                      r.stage_started_s, self.clock(), "abort",
                                      (f"change refused: {message}",), previous=r.previous))
                return
        if step.decision is not None:
            self._record(step.decision)
            log.info("rollout %s@%s: %s (%s)", r.model, r.version, step.decision.decision, reason)

    def _act(self, action: Action, reason: str) -> None:
        plane, now = self.plane, self.clock()
        served, declared = plane.config, plane.desired.declared
        kw: dict[str, Any] = {"source": SOURCE, "reason": reason, "at": now}
        if isinstance(action, SetStage):
            changes = rollout_changes(served, declared, action.model, action.version, action.kind,
                                      action.percent, **kw)
        elif isinstance(action, SetAlias):
            changes = alias_changes(served, declared, action.model, action.version, **kw)
        elif isinstance(action, ReleasePool):
            changes = status_changes(declared, f"{action.model}@{action.version}", "retired", **kw)
            if self.registry is not None:
                self.registry.release_pools(action.model, action.version, now)
        if changes:
            plane.change(changes, SOURCE)

    def _record(self, decision: RolloutDecision) -> None:
        self.history.append(decision)
        if self.registry is not None:
            try:
                self.registry.record_decision(decision_row(decision))
            except Exception:
                log.exception("rollout decision not recorded in the registry")

    def decisions(self, model: str) -> list[dict[str, Any]]:
        """Recorded decisions of ``model`` (the registry's, else this process's)."""
        if self.registry is not None:
            return self.registry.decisions(model)
        return [decision_row(d) for d in self.history if d.model == model]

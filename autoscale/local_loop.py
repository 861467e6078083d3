"""The local stack's autoscaler as pure policy: one sync of one pool over plain data.

``modelfleet up --autoscale`` (:mod:`modelfleet.local.autoscaler`, the I/O edge) calls
:func:`sync_pool` every ``polling_interval_s`` of *model time*. Model time is wall time x
``local.time_scale`` (:func:`model_time_s`), so every duration of the ``autoscaling:`` section --
the stabilisation windows, the rate periods (one replica per 600 s down), the cold start, the
drain bound -- passes ``time_scale`` times faster, like the simulated replicas' engines.
Cron peaks are read on the wall clock (they name times of day).

One sync reads the pool's triggers as the ScaledObject defines them (:mod:`autoscale.triggers`):
tokens in flight summed over the serving replicas (from their heartbeats), and queue depth =
requests waiting in their engines plus requests held for the pool in the gateway's admission
queue; it runs :func:`autoscale.rule.desired_replicas` with the replicas asked for (serving +
starting, the Deployment's ``spec.replicas``) as ``current``, and turns the answer into replicas
to start and replicas to stop (:func:`replica_changes`). Draining replicas are neither counted
nor read: they take no new work and leave once their streams end.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from autoscale.drain import drain_values
from autoscale.hpa import ScalingPolicy
from autoscale.policy import scaler_spec
from autoscale.rule import (
    Reading,
    ScaleDecision,
    ScaleReason,
    ScalerSpec,
    ScalerState,
    desired_replicas,
)
from autoscale.triggers import QUEUE_TRIGGER, TOKENS_TRIGGER, PoolTrigger, pool_triggers, readings
from modelfleet.config.autoscaling import AutoscalePolicy
from modelfleet.config.schema import PlatformConfig, Pool

Phase = Literal["starting", "serving", "draining"]
LOCAL_NAMESPACE = "local"
"""The namespace the local stack's triggers are named in (no Prometheus reads them)."""


def model_time_s(wall_s: float, started_wall_s: float, time_scale: float) -> float:
    """Model seconds since the loop started: wall seconds x ``time_scale``."""
    return (wall_s - started_wall_s) * time_scale


@dataclass(frozen=True)
class LocalPool:
    """What the loop needs of one pool (``model@version``); durations in model seconds."""

    key: str
    region: str
    """The region whose pool declaration gave the bounds."""
    spec: ScalerSpec
    triggers: tuple[PoolTrigger, ...]
    sync_period_s: float
    cold_start_s: float
    prestop_s: float
    """Seconds a draining replica keeps answering (503, retried) while its removal spreads."""
    stream_bound_s: float
    """The longest a draining replica's streams may take (vLLM's ``--shutdown-timeout``)."""


def pool_for(cfg: PlatformConfig, key: str, region: str) -> Pool | None:
    """The pool whose bounds the local stack uses for ``key``: the one declared in ``region``
    (``local.region``), else the version's first pool in config order (the local stack plays
    one region), else None (not autoscaled)."""
    pools = [p for p in cfg.pools if p.key == key]
    return next((p for p in pools if p.region == region), pools[0] if pools else None)


def local_pool(cfg: PlatformConfig, key: str, region: str,
               policy: AutoscalePolicy | None = None) -> LocalPool | None:
    """The loop's view of ``key`` (``model@version``), or None when no pool declares it."""
    policy = policy or cfg.autoscaling
    pool = pool_for(cfg, key, region)
    if pool is None:
        return None
    version, model = cfg.version(pool.model, pool.version), cfg.model(pool.model)
    if version is None or model is None:
        return None
    drain = drain_values(model, version, policy.drain)
    return LocalPool(
        key=key, region=pool.region, spec=scaler_spec(pool, policy),
        triggers=pool_triggers(pool, version, policy, LOCAL_NAMESPACE),
        sync_period_s=float(policy.polling_interval_s), cold_start_s=policy.cold_start.total_s,
        prestop_s=float(drain.prestop_s), stream_bound_s=float(drain.stream_bound_s))


@dataclass(frozen=True)
class Member:
    """One replica the loop manages; ``since_s`` is when it entered ``phase`` (model seconds)."""

    replica_id: str
    phase: Phase
    since_s: float


@dataclass(frozen=True)
class PoolLoad:
    """This sync's readings (tokens, requests); None = the read failed. A failed gateway read
    counts as 0 waiting there (the PromQL's ``or vector(0)``); engines decide emptiness."""

    tokens_in_flight: float | None
    engine_queue: float | None
    gateway_queue: float | None = None

    @property
    def queue_depth(self) -> float | None:
        """Requests waiting for the pool: engines plus the gateway's admission queue."""
        if self.engine_queue is None:
            return None
        return self.engine_queue + (self.gateway_queue or 0.0)


@dataclass(frozen=True)
class Changes:
    """Replicas to start (a count) and to stop (ids, in order)."""

    start: int = 0
    stop: tuple[str, ...] = ()


def replica_changes(desired: int, members: Sequence[Member]) -> Changes:
    """What to start or stop so that serving + starting replicas equal ``desired``. Stopping
    picks starting ones first (cancelling a cold start costs nothing), newest first, then
    serving ones, newest first; draining ones are already leaving and do not count."""
    active = [m for m in members if m.phase != "draining"]
    if desired >= len(active):
        return Changes(start=desired - len(active))
    order = sorted(active, key=lambda m: (m.phase != "starting", -m.since_s, m.replica_id))
    return Changes(stop=tuple(m.replica_id for m in order[: len(active) - desired]))


@dataclass(frozen=True)
class PoolSync:
    """One sync's outcome: the rule's decision, the changes, and what ``status`` shows."""

    decision: ScaleDecision
    changes: Changes
    report: dict[str, Any] = field(default_factory=dict)


def sync_pool(pool: LocalPool, state: ScalerState, members: Sequence[Member], load: PoolLoad,
              now_s: float, at: datetime) -> PoolSync:
    """One sync at ``now_s`` (model seconds; ``at`` the aware wall time for cron peaks)."""
    values = {TOKENS_TRIGGER: load.tokens_in_flight, QUEUE_TRIGGER: load.queue_depth}
    reads = readings(pool.triggers, values, at)
    current = sum(m.phase != "draining" for m in members)
    decision = desired_replicas(pool.spec, state, reads, current, now_s)
    changes = replica_changes(decision.replicas, members)
    counts = {p: sum(m.phase == p for m in members) for p in ("serving", "starting", "draining")}
    report = {
        "pool": pool.key, "region": pool.region,
        "min": pool.spec.min_replicas, "max": pool.spec.max_replicas,
        "current": counts["serving"], "starting": counts["starting"],
        "draining": counts["draining"], "desired": decision.replicas,
        "reason": str(decision.reason), "why": explain(pool, decision, reads, current),
        "triggers": trigger_rows(decision, reads), "model_time_s": round(now_s, 1),
        "gateway_queue": load.gateway_queue, "engine_queue": load.engine_queue,
    }
    return PoolSync(decision, changes, report)


def trigger_rows(decision: ScaleDecision, reads: Sequence[Reading]) -> list[dict[str, Any]]:
    """Per trigger: its value (pool total), target per replica and proposed replicas."""
    proposals = dict(decision.proposals)
    failures = dict(decision.state.failures)
    return [{"trigger": r.trigger, "value": r.value, "target": r.target,
             "proposal": proposals.get(r.trigger), "failures": failures.get(r.trigger, 0)}
            for r in reads]


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:,.0f}" if float(x).is_integer() else f"{x:,.2f}"


def explain(pool: LocalPool, decision: ScaleDecision, reads: Sequence[Reading], current: int) -> str:
    """One line on why the pool wants ``decision.replicas``: the trigger that leads with its
    value against its target, or the stabilisation window, rate policy, fallback or bound."""
    spec, r = pool.spec, decision.reason
    failed = [x.trigger for x in reads if x.value is None]
    lost = {t for t, n in decision.state.failures if n > spec.failure_threshold}
    if r is ScaleReason.ABOVE_MAX or r is ScaleReason.BELOW_MIN:
        return f"{current} outside [{spec.min_replicas}, {spec.max_replicas}]: {r}"
    if r is ScaleReason.METRICS_MISSING:
        return f"read failed: {', '.join(failed)}; holding {current} (no scale-down on partial metrics)"
    if r in (ScaleReason.ACTIVATED, ScaleReason.DEACTIVATED, ScaleReason.IDLE):
        return f"KEDA activation: {r}"
    proposals = {t: p for t, p in decision.proposals if p is not None}
    lead = max(proposals, key=lambda t: proposals[t]) if proposals else None
    read = next((x for x in reads if x.trigger == lead), None)
    if lead is None or read is None:
        return str(r)
    want = proposals[lead]
    base = (f"{lead} {_fmt(read.value)} vs target {_fmt(read.target)}/replica x {current}"
            f" -> {want}")
    if lost & set(proposals):
        base += f" (fallback: {', '.join(sorted(lost))} lost > {spec.failure_threshold} reads)"
    got = decision.replicas
    if got == want:
        return base
    if want < spec.min_replicas and got == spec.min_replicas:
        return base + f"; warm minimum {spec.min_replicas}"
    if got > want:
        window = spec.behavior.scale_down.stabilization_window_s
        if _window_holds(decision, got, window):
            return base + f"; held at {got}: scale-down stabilisation window ({window:g} s)"
        return base + f"; {got}: scale-down rate ({_rate(spec.behavior.scale_down.policies)})"
    if want > spec.max_replicas and got == spec.max_replicas:
        return base + f"; capped at max {spec.max_replicas}"
    return base + f"; {got}: scale-up rate ({_rate(spec.behavior.scale_up.policies)})"


def _rate(policies: Sequence[ScalingPolicy]) -> str:
    return " or ".join(f"{p.value}{'%' if p.type == 'Percent' else ' pod(s)'} per {p.period_s} s"
                       for p in policies)


def _window_holds(decision: ScaleDecision, replicas: int, window_s: float) -> bool:
    """Whether a recommendation inside the scale-down window is at least ``replicas``."""
    recs = decision.state.recommendations
    if not recs:
        return False
    newest = max(t for t, _ in recs)
    return any(v >= replicas for t, v in recs if t > newest - window_s)


def drain_wall_s(pool: LocalPool, time_scale: float, min_prestop_wall_s: float = 1.5,
                 exit_margin_wall_s: float = 2.0) -> tuple[float, float]:
    """(grace, kill-after) in wall seconds for a draining replica of ``pool``: it answers 503
    for ``grace`` (the scaled preStop, at least ``min_prestop_wall_s``: the removal's spread
    through the control plane, Envoy and the gateway does not run faster with the time scale),
    then finishes its streams; it is killed only ``kill-after`` seconds after SIGTERM: grace +
    the scaled stream bound + an exit margin."""
    grace = max(pool.prestop_s / time_scale, min_prestop_wall_s)
    return grace, grace + pool.stream_bound_s / time_scale + exit_margin_wall_s


def sync_period_wall_s(pool: LocalPool, time_scale: float, floor_s: float = 0.5) -> float:
    """Wall seconds between syncs: the polling interval scaled, at least ``floor_s``."""
    return max(pool.sync_period_s / time_scale, floor_s)


def cold_start_wall_s(pool: LocalPool, time_scale: float) -> float:
    """Wall seconds a new replica waits before its process starts (scaled cold start)."""
    return pool.cold_start_s / time_scale if math.isfinite(pool.cold_start_s) else 0.0

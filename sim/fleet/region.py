"""The discrete-event simulation of one region: arrivals, the gateway, the pools' replicas.

Events, in model seconds (:mod:`sim.fleet.loop`): a request reaches the region (the gateway decides:
refuse, queue or admit, then picks a replica of the version's pool); a replica's engine step
ends (its tokens are delivered, finished requests settle with the gateway, which may admit
queued ones, and the next step starts); a heartbeat every ``heartbeat_s`` (replicas report
tokens in flight to the picker, queue timeouts, a sample of the live pool, every
``sync_period_s`` the desired-replica rule, then the run's hooks such as a rollout
controller); a started replica becomes ready. Refusals and failures go back to the clients
(:mod:`sim.fleet.clients`), which may retry. Deterministic: ties are broken by event order.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable

from autoscale.rule import ScalerState
from gateway_ext.decision import Refused
from gateway_ext.limits.admission_types import AdmissionDecision, Outcome
from modelfleet.config.schema import PlatformConfig
from sim.fleet.clients import Clients, retry_after_s
from sim.fleet.gateway import SimGateway
from sim.fleet.loop import READY, STEP, TICK, Loop
from sim.fleet.measures import Measured, RequestRow, Result, Sample
from sim.fleet.replicas import ReplicaState, SimReplica
from sim.fleet.scaling import ScalerSetup, scale_down_order, scale_step
from sim.fleet.types import FleetSpec, Req, VersionSpec
from sim.traces.arrivals import Arrival, expand

__all__ = ["Fleet", "FleetSpec", "Hook", "Progress", "VersionSpec", "simulate"]

Progress = Callable[[float, float], None]
"""Called with (model seconds done, model seconds in all) every 10 simulated seconds."""
Hook = Callable[["Fleet", float], None]
"""Called with the region at every heartbeat (seconds)."""
_REFUSED = {429: Result.REJECTED_429, 503: Result.SHED_503}


class Fleet:
    """One region's state: its gateway and pools; :meth:`arrive` takes requests."""

    def __init__(self, spec: FleetSpec, config: PlatformConfig, progress: Progress | None,
                 loop: Loop | None = None, clients: Clients | None = None,
                 choose_version: Callable[..., str] | None = None) -> None:
        self.spec, self.progress = spec, progress
        self.loop = loop or Loop()
        self.region = spec.region
        self.gw = SimGateway(config, spec.model, spec.version, spec.routing,
                             spec.capacity_tokens_per_replica, spec.admission, spec.bound, spec.seed,
                             spec.region, choose_version)
        self.main = self.gw.pool_key
        self.versions: dict[str, VersionSpec] = {self.main: VersionSpec(
            spec.version, spec.params, spec.capacity_tokens_per_replica)}
        self.m = Measured(spec.warmup_s, spec.warmup_s + spec.duration_s)
        self.clients = clients or Clients(self.loop, {spec.region: self}, lambda _a, _t: spec.region,
                                          (self.m.start_s, self.m.end_s), spec.retry, spec.seed)
        self.m.rows = self.clients.rows
        self.replicas: dict[str, SimReplica] = {}
        self.reqs: dict[str, Req] = {}
        self.hooks: list[Hook] = []
        self.up = True
        self.rng = random.Random(spec.seed)
        self._ids = iter(range(1 << 62))
        self.scaler_state = ScalerState()
        self.warm_left = spec.scaler.cold_start.warm_nodes if spec.scaler else 0
        for _ in range(spec.replicas):
            self._new_replica(self.main, 0.0, ReplicaState.SERVING)
        self.gw.set_members(self.main, self.serving_ids(self.main), 0.0)

    @property
    def end_s(self) -> float:
        """When the run stops: the window's end plus ``tail_s`` (seconds)."""
        return self.m.end_s + self.spec.tail_s

    def run(self, arrivals: Iterable[Arrival]) -> Measured:
        """Simulate this region alone until :attr:`end_s`; returns the measures."""
        self.clients.start(arrivals)
        self.loop.push(0.0, self, TICK, None)
        self.loop.run(self.end_s)
        return self.m

    def handle(self, kind: int, ref: object, t: float) -> None:
        """Run one of this region's events at ``t`` seconds."""
        if kind == STEP:
            on_step(self, ref, t)  # type: ignore[arg-type]
        elif kind == TICK:
            on_tick(self, t)
        elif kind == READY:
            on_ready(self, ref, t)  # type: ignore[arg-type]

    def add_version(self, v: VersionSpec) -> str:
        """Serve ``v`` too, with no replica yet (:meth:`resize`); returns its pool key."""
        key = self.gw.add_pool(v.version, v.capacity_tokens_per_replica)
        self.versions[key] = v
        return key

    def resize(self, pool: str, replicas: int, t: float) -> None:
        """Set ``pool``'s serving replicas at ``t`` (seconds): new ones serve at once (a warm
        pool), removed ones (newest first) drain."""
        serving = [r for r in self.replicas.values()
                   if r.pool == pool and r.state is ReplicaState.SERVING]
        for _ in range(replicas - len(serving)):
            self._new_replica(pool, t, ReplicaState.SERVING)
        for rep in serving[max(0, replicas):][::-1]:
            self._drain(rep, t)
        self._apply(self.gw.set_members(pool, self.serving_ids(pool), t), t)

    def fail(self, t: float) -> None:
        """The region is lost at ``t`` (seconds): every open stream breaks, and from now on
        every request sent here fails (connection error)."""
        self.up = False
        broken, self.reqs, self.replicas = list(self.reqs.values()), {}, {}
        self.m.scale_events.append((t, self.region, "lost"))
        for req in broken:
            self.clients.failed(req.arrival, req.row, req.t0, req.attempt, t, Result.ERROR, None,
                                self.region)

    def serving_ids(self, pool: str) -> list[str]:
        """Ids of ``pool``'s serving replicas."""
        return [r.id for r in self.replicas.values()
                if r.pool == pool and r.state is ReplicaState.SERVING]

    def _new_replica(self, pool: str, ready_s: float, state: ReplicaState) -> SimReplica:
        rid = f"{pool}-{next(self._ids)}"
        rep = self.replicas[rid] = SimReplica(rid, self.versions[pool].params, ready_s, state, pool)
        return rep

    def arrive(self, a: Arrival, row: RequestRow | None, t0: float, attempt: int, t: float) -> None:
        """Attempt ``attempt`` (0: the first) of a request first sent at ``t0`` reaches the
        region's gateway at ``t`` (seconds)."""
        rid = f"r{next(self._ids)}"
        if row is not None:
            row.region = self.region
        if not self.up:
            self.clients.failed(a, row, t0, attempt, t, Result.ERROR, None, self.region)
            return
        if not self.spec.gateway:
            self.reqs[rid] = Req(a, None, row, t0, attempt, t, self.main)
            self._dispatch(rid, t)
            return
        decision = self.gw.offer(a, rid, t)
        if isinstance(decision, Refused):
            error = decision.error
            self.clients.failed(a, row, t0, attempt, t, _REFUSED.get(error.status, Result.INVALID_400),
                                retry_after_s(error.headers), self.region)
            return
        self.reqs[rid] = Req(a, decision, row, t0, attempt, t, decision.pool)
        for evicted in decision.outcome.shed:
            self._abandon(evicted.request_id, t)
        if decision.outcome.decision is AdmissionDecision.ADMIT:
            self._dispatch(rid, t)

    def _apply(self, outcomes: list[Outcome], t: float) -> None:
        for o in outcomes:
            if o.decision is AdmissionDecision.ADMIT:
                self._dispatch(o.request_id, t)
            elif o.decision is AdmissionDecision.SHED_503:
                self._abandon(o.request_id, t)

    def _dispatch(self, rid: str, t: float) -> None:
        req = self.reqs[rid]
        a = req.arrival
        if req.row is not None:
            req.row.queued_s = t - req.t0
            req.row.version = req.pool
        v = self.versions[req.pool]
        if v.output_factor != 1.0:
            req.output = max(1, min(round(a.output_tokens * v.output_factor), a.reserve_max_tokens))
        if v.error_share and self.rng.random() < v.error_share:  # the version answers 500
            self._end(rid, req, t, Result.ERROR)
            return
        rep = self.replicas[self.gw.pickers[req.pool].pick(
            a.conversation_id, a.prompt_tokens + a.reserve_max_tokens)]
        try:
            rep.add(rid, a.prompt_tokens, req.output, expand(a.blocks), t)
        except ValueError:  # longer than the model's context: the replica refuses it (400)
            self._end(rid, req, t, Result.INVALID_400)
            return
        if not rep.busy:
            self._start(rep, t)

    def _end(self, rid: str, req: Req, t: float, result: Result) -> None:
        """An admitted request refused by its replica or version: settle it with no usage."""
        del self.reqs[rid]
        if req.admitted is not None:
            self._apply(self.gw.finish(req.admitted, 0, 0, 0, t), t)
        if result is Result.ERROR:
            self.m.completions.append((t, req.pool, math.nan, 0, False))
            self.clients.failed(req.arrival, req.row, req.t0, req.attempt, t, result, None,
                                self.region)
        elif req.row is not None:
            req.row.result = result

    def _start(self, rep: SimReplica, t: float) -> None:
        result = rep.start_step(t)
        if result is not None:
            self.loop.push(result.end_s, self, STEP, rep)

    def _abandon(self, rid: str, t: float) -> None:
        req = self.reqs.pop(rid, None)
        if req is None:
            return
        if req.admitted is not None:
            self._apply(self.gw.abandon(req.admitted, t, shed=True), t)
        self.clients.failed(req.arrival, req.row, req.t0, req.attempt, t, Result.SHED_503, None,
                            self.region)

    def _drain(self, rep: SimReplica, t: float) -> None:
        rep.state = ReplicaState.DRAINING
        self.m.scale_events.append((t, rep.id, "draining"))
        if not rep.held:
            del self.replicas[rep.id]
            self.m.scale_events.append((t, rep.id, "gone"))


def simulate(spec: FleetSpec, config: PlatformConfig, arrivals: Iterable[Arrival],
             progress: Progress | None = None) -> Measured:
    """Run ``arrivals`` through the pool of ``spec`` with the teams and limits of ``config``."""
    return Fleet(spec, config, progress).run(arrivals)


# The events of a region: an engine step ends, the heartbeat (with the desired-replica rule), a
# started replica becomes ready. Times in model seconds.


def on_step(fleet: Fleet, rep: SimReplica, t: float) -> None:
    """``rep``'s engine step ends at ``t`` (seconds): deliver its tokens, settle finished
    requests, start the next step."""
    if not fleet.up:
        return
    result = rep.finish_step()
    if fleet.m.start_s <= t < fleet.m.end_s:
        fleet.m.output_tokens += result.tokens
        fleet.m.prefill_tokens += result.prefill_tokens
    reqs = fleet.reqs
    for adm in result.admitted:
        if adm.first:
            req = reqs[adm.request_id]
            req.first_s, req.cached = t, adm.cached_tokens
            if req.row is not None:
                req.row.ttft_s, req.row.cached_tokens = t - req.t0, adm.cached_tokens
    for f in result.finished:
        _finish(fleet, rep, f.request_id, t)
    fleet._start(rep, t)
    if rep.state is ReplicaState.DRAINING and not rep.held:
        del fleet.replicas[rep.id]
        fleet.m.scale_events.append((t, rep.id, "gone"))


def _finish(fleet: Fleet, rep: SimReplica, rid: str, t: float) -> None:
    rep.release(rid)
    req = fleet.reqs.pop(rid)
    a, out = req.arrival, req.output
    fleet.m.completions.append((t, req.pool, req.first_s - req.ta, out, True))
    if req.row is not None:
        req.row.result = Result.OK
        if out > 1 and t > req.first_s:
            req.row.stream_tokens_per_s = (out - 1) / (t - req.first_s)
    if req.admitted is not None:
        fleet._apply(fleet.gw.finish(req.admitted, a.prompt_tokens, req.cached, out, t), t)


def on_tick(fleet: Fleet, t: float) -> None:
    """The heartbeat at ``t`` (seconds): loads to the pickers, queue timeouts, a sample, the
    desired-replica rule every sync period, the hooks; the next heartbeat."""
    spec = fleet.spec
    if not fleet.up:
        fleet.loop.push(t + spec.heartbeat_s, fleet, TICK, None)
        return
    main = fleet.gw.main
    serving = [r for r in fleet.replicas.values() if r.state is ReplicaState.SERVING]
    live = [r for r in serving if r.pool == fleet.main]
    view = [main.reported.get(r.id, 0) + main.sent.get(r.id, 0) for r in live]
    for key, picker in fleet.gw.pickers.items():
        picker.report({r.id: r.tokens_in_flight for r in serving if r.pool == key})
    fleet._apply(fleet.gw.expire(t), t)
    second = round(t / spec.heartbeat_s)
    if second % round(10 / spec.heartbeat_s) == 0 and fleet.progress is not None:
        fleet.progress(t, fleet.end_s)
    if second % round(60 / spec.heartbeat_s) == 0:
        fleet.gw.sweep(t)
    pool = [r for r in fleet.replicas.values() if r.pool == fleet.main]
    stats = [r.engine.stats() for r in pool]
    waiting = sum(s.waiting for s in stats)
    if fleet.m.start_s <= t < fleet.m.end_s:
        starting = sum(1 for r in pool if r.state is ReplicaState.STARTING)
        fleet.m.samples.append(Sample(t, len(live), starting, [r.tokens_in_flight for r in live],
                                      view, fleet.gw.queued(), waiting,
                                      sum(s.running for s in stats)))
    if spec.scaler is not None and second % round(spec.scaler.sync_period_s / spec.heartbeat_s) == 0:
        _scale(fleet, spec.scaler, sum(r.tokens_in_flight for r in pool), waiting, t)
    for hook in fleet.hooks:
        hook(fleet, t)
    fleet.loop.push(t + spec.heartbeat_s, fleet, TICK, None)


def _scale(fleet: Fleet, setup: ScalerSetup, tokens_in_flight: int, waiting: int, t: float) -> None:
    active = [r for r in fleet.replicas.values()
              if r.pool == fleet.main and r.state is not ReplicaState.DRAINING]
    target, fleet.scaler_state = scale_step(setup, fleet.scaler_state, len(active),
                                            tokens_in_flight, waiting, t)
    for _ in range(target - len(active)):
        rep = fleet._new_replica(fleet.main, t + setup.cold_start.delay_s(fleet.warm_left),
                                 ReplicaState.STARTING)
        fleet.warm_left = max(0, fleet.warm_left - 1)
        fleet.loop.push(rep.ready_s, fleet, READY, rep)
        fleet.m.scale_events.append((t, rep.id, "requested"))
    order = scale_down_order([(r.id, r.state is ReplicaState.STARTING, r.ready_s) for r in active])
    for rep in (fleet.replicas[rid] for rid in order[: max(0, len(active) - target)]):
        if rep.state is ReplicaState.STARTING:
            del fleet.replicas[rep.id]
            fleet.m.scale_events.append((t, rep.id, "cancelled"))
        else:
            fleet._drain(rep, t)
    fleet._apply(fleet.gw.set_members(fleet.main, fleet.serving_ids(fleet.main), t), t)


def on_ready(fleet: Fleet, rep: SimReplica, t: float) -> None:
    """A started replica ``rep`` becomes ready at ``t`` (seconds) and serves."""
    if fleet.replicas.get(rep.id) is not rep or rep.state is not ReplicaState.STARTING:
        return
    rep.state = ReplicaState.SERVING
    fleet.m.scale_events.append((t, rep.id, "serving"))
    fleet._apply(fleet.gw.set_members(rep.pool, fleet.serving_ids(rep.pool), t), t)

"""The discrete-event simulation of one region's pool: arrivals, the gateway, the replicas.

Events, in model seconds: a request arrives (the gateway decides: refuse, queue or admit, then
picks a replica); a replica's engine step ends (its tokens are delivered, finished requests
settle with the gateway, which may admit queued ones, and the next step starts); a heartbeat
every ``heartbeat_s`` (replicas report tokens in flight to the picker, queue timeouts, a
sample of the pool; every ``sync_period_s`` the desired-replica rule); a started replica
becomes ready. Deterministic: ties are broken by event order, never by wall time or ``hash``.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from autoscale.rule import ScalerState
from gateway_ext.admission import AdmissionConfig, Decision, Outcome
from gateway_ext.decision import Admitted, Refused
from modelfleet.config.schema import PlatformConfig
from replica.params import EngineParams
from sim.arrivals import Arrival, expand
from sim.gateway import Routing, SimGateway
from sim.measures import Measured, RequestRow, Result, Sample
from sim.replicas import ReplicaState, SimReplica
from sim.scaling import ScalerSetup, scale_down_order, scale_step

_STEP, _ARRIVAL, _TICK, _READY = 0, 1, 2, 3
Progress = Callable[[float, float], None]
"""Called with (model seconds done, model seconds in all) every 10 simulated seconds."""


@dataclass(frozen=True)
class FleetSpec:
    """One pool in one region and the run's window; units in the names."""

    params: EngineParams
    replicas: int = 12
    routing: Routing = Routing.AFFINITY
    bound: float = 1.25
    model: str = "chat-7b"
    version: str = "v13"
    capacity_tokens_per_replica: int = 112_000
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    warmup_s: float = 60.0
    duration_s: float = 300.0
    tail_s: float = 30.0
    """Seconds simulated after the window so that its last requests can finish."""
    heartbeat_s: float = 1.0
    scaler: ScalerSetup | None = None
    seed: int = 0
    gateway: bool = True
    """False: a load test straight at the replicas (no buckets, no admission; picking only)."""


class _Req:
    __slots__ = ("admitted", "arrival", "cached", "first_s", "row", "t0")

    def __init__(self, arrival: Arrival, admitted: Admitted | None, row: RequestRow | None,
                 t0: float) -> None:
        self.arrival, self.admitted, self.row, self.t0 = arrival, admitted, row, t0
        self.first_s, self.cached = -1.0, 0


class Fleet:
    """The simulation's state; :func:`simulate` runs it."""

    def __init__(self, spec: FleetSpec, config: PlatformConfig, progress: Progress | None) -> None:
        self.spec, self.progress = spec, progress
        self.gw = SimGateway(config, spec.model, spec.version, spec.routing,
                             spec.capacity_tokens_per_replica, spec.admission, spec.bound, spec.seed)
        self.m = Measured(spec.warmup_s, spec.warmup_s + spec.duration_s)
        self.replicas: dict[str, SimReplica] = {}
        self.reqs: dict[str, _Req] = {}
        self.heap: list[tuple[float, int, int, object]] = []
        self._seq = itertools.count()
        self._ids = itertools.count()
        self.scaler_state = ScalerState()
        self.warm_left = spec.scaler.cold_start.warm_nodes if spec.scaler else 0
        for _ in range(spec.replicas):
            self._new_replica(0.0, ReplicaState.SERVING)
        self.gw.set_members(self._serving_ids(), 0.0)

    def run(self, arrivals: Iterable[Arrival]) -> Measured:
        """Simulate until the window's end plus ``tail_s``; returns the measures."""
        source = iter(arrivals)
        self._pull(source)
        self._push(0.0, _TICK, None)
        end = self.m.end_s + self.spec.tail_s
        heap, pop = self.heap, heapq.heappop
        while heap:
            t, _, kind, ref = pop(heap)
            if t >= end:
                break
            if kind == _STEP:
                self._on_step(ref, t)  # type: ignore[arg-type]
            elif kind == _ARRIVAL:
                self._on_arrival(ref, t)  # type: ignore[arg-type]
                self._pull(source)
            elif kind == _TICK:
                self._on_tick(t, end)
            else:
                self._on_ready(ref, t)  # type: ignore[arg-type]
        return self.m

    def _push(self, t: float, kind: int, ref: object) -> None:
        heapq.heappush(self.heap, (t, next(self._seq), kind, ref))

    def _pull(self, source: Iterator[Arrival]) -> None:
        a = next(source, None)
        if a is not None:
            self._push(a.time_s, _ARRIVAL, a)

    def _serving_ids(self) -> list[str]:
        return [r.id for r in self.replicas.values() if r.state is ReplicaState.SERVING]

    def _new_replica(self, ready_s: float, state: ReplicaState) -> SimReplica:
        rid = f"{self.spec.model}@{self.spec.version}-{next(self._ids)}"
        rep = self.replicas[rid] = SimReplica(rid, self.spec.params, ready_s, state)
        return rep

    def _on_arrival(self, a: Arrival, t: float) -> None:
        rid = f"r{next(self._ids)}"
        row = None
        if self.m.start_s <= t < self.m.end_s:
            row = RequestRow(t, a.team, a.tier, a.prompt_tokens, a.output_tokens, a.history_tokens)
            self.m.rows.append(row)
        if not self.spec.gateway:
            self.reqs[rid] = _Req(a, None, row, t)
            self._dispatch(rid, t)
            return
        decision = self.gw.offer(a, rid, t)
        if isinstance(decision, Refused):
            if row is not None:
                row.result = {429: Result.REJECTED_429, 503: Result.SHED_503}.get(
                    decision.error.status, Result.INVALID_400)
            return
        self.reqs[rid] = _Req(a, decision, row, t)
        for evicted in decision.outcome.shed:
            self._abandon(evicted.request_id, t)
        if decision.outcome.decision is Decision.ADMIT:
            self._dispatch(rid, t)

    def _apply(self, outcomes: list[Outcome], t: float) -> None:
        for o in outcomes:
            if o.decision is Decision.ADMIT:
                self._dispatch(o.request_id, t)
            elif o.decision is Decision.SHED_503:
                self._abandon(o.request_id, t)

    def _dispatch(self, rid: str, t: float) -> None:
        req = self.reqs[rid]
        a = req.arrival
        if req.row is not None:
            req.row.queued_s = t - req.t0
        rep = self.replicas[self.gw.pick(a.conversation_id, a.prompt_tokens + a.reserve_max_tokens)]
        try:
            rep.add(rid, a.prompt_tokens, a.output_tokens, expand(a.blocks), t)
        except ValueError:  # longer than the model's context: the replica refuses it (400)
            del self.reqs[rid]
            if req.row is not None:
                req.row.result = Result.INVALID_400
            if req.admitted is not None:
                self._apply(self.gw.finish(req.admitted, 0, 0, 0, t), t)
            return
        if not rep.busy:
            self._start(rep, t)

    def _start(self, rep: SimReplica, t: float) -> None:
        result = rep.start_step(t)
        if result is not None:
            self._push(result.end_s, _STEP, rep)

    def _on_step(self, rep: SimReplica, t: float) -> None:
        result = rep.finish_step()
        if self.m.start_s <= t < self.m.end_s:
            self.m.output_tokens += result.tokens
            self.m.prefill_tokens += result.prefill_tokens
        reqs = self.reqs
        for adm in result.admitted:
            if adm.first:
                req = reqs[adm.request_id]
                req.first_s, req.cached = t, adm.cached_tokens
                if req.row is not None:
                    req.row.ttft_s, req.row.cached_tokens = t - req.t0, adm.cached_tokens
        for f in result.finished:
            self._finish(rep, f.request_id, t)
        self._start(rep, t)
        if rep.state is ReplicaState.DRAINING and not rep.held:
            del self.replicas[rep.id]
            self.m.scale_events.append((t, rep.id, "gone"))

    def _finish(self, rep: SimReplica, rid: str, t: float) -> None:
        rep.release(rid)
        req = self.reqs.pop(rid)
        a = req.arrival
        if req.row is not None:
            req.row.result = Result.OK
            if a.output_tokens > 1 and t > req.first_s:
                req.row.stream_tokens_per_s = (a.output_tokens - 1) / (t - req.first_s)
        if req.admitted is not None:
            self._apply(self.gw.finish(req.admitted, a.prompt_tokens, req.cached,
                                       a.output_tokens, t), t)

    def _abandon(self, rid: str, t: float) -> None:
        req = self.reqs.pop(rid, None)
        if req is None:
            return
        if req.row is not None:
            req.row.result = Result.SHED_503
        if req.admitted is not None:
            self._apply(self.gw.abandon(req.admitted, t, shed=True), t)

    def _on_tick(self, t: float, end: float) -> None:
        spec = self.spec
        serving = [r for r in self.replicas.values() if r.state is ReplicaState.SERVING]
        view = [self.gw.reported.get(r.id, 0) + self.gw.sent.get(r.id, 0) for r in serving]
        self.gw.report({r.id: r.tokens_in_flight for r in serving})
        self._apply(self.gw.expire(t), t)
        second = round(t / spec.heartbeat_s)
        if second % round(10 / spec.heartbeat_s) == 0 and self.progress is not None:
            self.progress(t, end)
        if second % round(60 / spec.heartbeat_s) == 0:
            self.gw.sweep(t)
        stats = [r.engine.stats() for r in self.replicas.values()]
        waiting = sum(s.waiting for s in stats)
        if self.m.start_s <= t < self.m.end_s:
            starting = sum(1 for r in self.replicas.values() if r.state is ReplicaState.STARTING)
            self.m.samples.append(Sample(t, len(serving), starting,
                                         [r.tokens_in_flight for r in serving], view,
                                         sum(self.gw.pool.view().queued.values()), waiting,
                                         sum(s.running for s in stats)))
        if spec.scaler is not None and second % round(spec.scaler.sync_period_s / spec.heartbeat_s) == 0:
            tif = sum(r.tokens_in_flight for r in self.replicas.values())
            self._scale(spec.scaler, tif, waiting, t)
        self._push(t + spec.heartbeat_s, _TICK, None)

    def _scale(self, setup: ScalerSetup, tokens_in_flight: int, waiting: int, t: float) -> None:
        active = [r for r in self.replicas.values() if r.state is not ReplicaState.DRAINING]
        target, self.scaler_state = scale_step(setup, self.scaler_state, len(active),
                                               tokens_in_flight, waiting, t)
        for _ in range(target - len(active)):
            rep = self._new_replica(t + setup.cold_start.delay_s(self.warm_left),
                                    ReplicaState.STARTING)
            self.warm_left = max(0, self.warm_left - 1)
            self._push(rep.ready_s, _READY, rep)
            self.m.scale_events.append((t, rep.id, "requested"))
        order = scale_down_order([(r.id, r.state is ReplicaState.STARTING, r.ready_s) for r in active])
        for rep in (self.replicas[rid] for rid in order[: max(0, len(active) - target)]):
            if rep.state is ReplicaState.STARTING:
                del self.replicas[rep.id]
                self.m.scale_events.append((t, rep.id, "cancelled"))
            else:
                rep.state = ReplicaState.DRAINING
                self.m.scale_events.append((t, rep.id, "draining"))
                if not rep.held:
                    del self.replicas[rep.id]
                    self.m.scale_events.append((t, rep.id, "gone"))
        self._apply(self.gw.set_members(self._serving_ids(), t), t)

    def _on_ready(self, rep: SimReplica, t: float) -> None:
        if self.replicas.get(rep.id) is not rep or rep.state is not ReplicaState.STARTING:
            return
        rep.state = ReplicaState.SERVING
        self.m.scale_events.append((t, rep.id, "serving"))
        self._apply(self.gw.set_members(self._serving_ids(), t), t)


def simulate(spec: FleetSpec, config: PlatformConfig, arrivals: Iterable[Arrival],
             progress: Progress | None = None) -> Measured:
    """Run ``arrivals`` through the pool of ``spec`` with the teams and limits of ``config``."""
    return Fleet(spec, config, progress).run(arrivals)

"""The events of one region's simulation (:class:`sim.fleet.Fleet`): an engine step ends, the
heartbeat (with the desired-replica rule), a started replica becomes ready. Times in model
seconds."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sim.loop import READY, TICK
from sim.measures import Result, Sample
from sim.replicas import ReplicaState, SimReplica
from sim.scaling import ScalerSetup, scale_down_order, scale_step

if TYPE_CHECKING:
    from sim.fleet import Fleet


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

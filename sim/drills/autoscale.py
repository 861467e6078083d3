"""Autoscaling drill: a ramp of 5% per minute and a sudden doubling, against the desired-replica
rule (:mod:`autoscale.rule`, the ScaledObject's triggers and targets) with cold starts.

Each scenario starts at a steady base load on the replicas the rule wants for it, warms up for
``warmup_s``, then follows its rate profile (multipliers of the base rate for new conversations;
requests follow as conversations progress). Measures: the time from the first scale-up request
to the first new replica serving, and from the start of the load change to it; the peak queue
depth (requests queued in the gateway plus waiting in the engines); requests refused per tier
(503 shed, 429 above share); the minutes whose p95 TTFT exceeded the target; and a per-minute
series for the table and the plot.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import asdict, dataclass

from modelfleet.config.schema import PlatformConfig
from sim.drills.common import RunOptions, fmt, pool_under_test, table, with_capacity
from sim.fleet.gateway import Routing
from sim.fleet.measures import Result, by_minute, quantile, served
from sim.fleet.region import Progress, simulate
from sim.fleet.scaling import ColdStart, scaler_setup
from sim.fleet.types import FleetSpec
from sim.traces.synthetic import CHAT, chat_arrivals


@dataclass(frozen=True)
class Scenario:
    """A base rate (requests/s), a profile of ``(seconds, multiplier)`` and a length (seconds)."""

    name: str
    base_rate_rps: float
    profile: tuple[tuple[float, float], ...]
    duration_s: float


RAMP = Scenario("ramp", 38.0, tuple((60.0 * k, 1.05**k) for k in range(21)), 1500.0)
"""38 requests/s growing 5% a minute for 20 minutes (x 2.65, to the seed's peak of 100), then
5 minutes flat."""
DOUBLING = Scenario("doubling", 50.0, ((300.0, 1.0), (360.0, 2.0)), 1200.0)
"""50 requests/s for 5 minutes, doubled within one minute to the seed's peak, then held."""
SCENARIOS = {"ramp": RAMP, "doubling": DOUBLING}


@dataclass(frozen=True)
class Minute:
    """One minute of a scenario: arrivals/s, replicas at its end, p95 TTFT (s), peak queue."""

    minute: int
    arrivals_rps: float
    serving: int
    starting: int
    ttft_p95_s: float
    peak_queue: int
    refused: int


@dataclass(frozen=True)
class ScenarioResult:
    """One scenario's measures (seconds, requests, replicas)."""

    name: str
    replicas_start: int
    replicas_peak: int
    first_scale_up_s: float | None
    """Seconds from the start of the load change to the first scale-up the rule asked for."""
    request_to_serving_s: float | None
    load_change_to_serving_s: float | None
    peak_queue: int
    shed_503: dict[str, int]
    rejected_429: dict[str, int]
    minutes_outside_target: int
    minutes_refusing: int
    """Minutes in which more than 1% of the arriving requests were refused (429 or 503)."""
    minutes: tuple[Minute, ...]


@dataclass(frozen=True)
class AutoscaleReport:
    """The setting and each scenario's result."""

    pool: str
    seed: int
    ttft_target_s: float
    cold_start: ColdStart
    warmup_s: float
    scenarios: tuple[ScenarioResult, ...]

    def as_dict(self) -> dict[str, object]:
        """JSON-ready."""
        return asdict(self)


def run_autoscale(config: PlatformConfig, opts: RunOptions, scenarios: tuple[Scenario, ...] = (RAMP, DOUBLING),
                  cold_start: ColdStart | None = None, ttft_target_s: float = 1.0,
                  progress: Callable[[str], Progress | None] = lambda _label: None) -> AutoscaleReport:
    """Run each scenario on chat-7b's live pool with the rule, from the pool's warm minimum
    (``opts.rate_rps`` replaces each scenario's base rate, ``opts.duration_s`` its length;
    warm-up 120 s)."""
    put = with_capacity(pool_under_test(config), opts.capacity_tokens)
    if put.pool is None:
        raise ValueError(f"no pool of {put.version.key} is declared")
    cold_start = cold_start or ColdStart()
    setup = scaler_setup(put.pool, put.version, config.autoscaling, cold_start=cold_start)
    warmup = opts.warmup_s if opts.warmup_s is not None else 120.0
    results = []
    for sc in scenarios:
        base = opts.rate_rps if opts.rate_rps is not None else sc.base_rate_rps
        length = opts.duration_s if opts.duration_s is not None else sc.duration_s
        start = put.pool.min_replicas
        w = dataclasses.replace(CHAT, rate_rps=base,
                                profile=tuple((t + warmup, m) for t, m in sc.profile))
        spec = FleetSpec(put.params, start, Routing.AFFINITY, model=put.version.model,
                         version=put.version.version,
                         capacity_tokens_per_replica=put.capacity_tokens_per_replica,
                         warmup_s=warmup, duration_s=length, scaler=setup, seed=opts.seed)
        m = simulate(spec, config, chat_arrivals(w, warmup + length + spec.tail_s, opts.seed,
                                                 block_size=put.params.block_size),
                     progress(f"autoscale {sc.name}"))
        minutes = []
        for k, rows in sorted(by_minute(m.rows, warmup).items()):
            samples = [s for s in m.samples if warmup + 60 * k <= s.t_s < warmup + 60 * (k + 1)]
            last = samples[-1] if samples else None
            minutes.append(Minute(
                k, len(rows) / 60, last.serving if last else 0, last.starting if last else 0,
                quantile([r.ttft_s for r in served(rows)], 0.95),
                max((s.gateway_queue + s.engine_waiting for s in samples), default=0),
                sum(1 for r in rows if r.result in (Result.SHED_503, Result.REJECTED_429))))
        # The load change: where the profile first rises (ramp: from the start; doubling: 300 s).
        change = warmup + next((t for (t, v), (_, w) in zip(sc.profile, sc.profile[1:],
                                                            strict=False) if w > v), 0.0)
        ups = [(t, rid) for t, rid, e in m.scale_events if e == "requested" and t >= change]
        ready = {rid: t for t, rid, e in m.scale_events if e == "serving"}
        first_up = ups[0] if ups else None
        served_at = ready.get(first_up[1]) if first_up else None
        tiers = ("interactive", "standard", "batch")
        results.append(ScenarioResult(
            sc.name, start, max([start] + [s.serving for s in m.samples]),
            None if first_up is None else first_up[0] - change,
            None if first_up is None or served_at is None else served_at - first_up[0],
            None if served_at is None else served_at - change,
            max((s.gateway_queue + s.engine_waiting for s in m.samples), default=0),
            {t: sum(1 for r in m.rows if r.tier == t and r.result is Result.SHED_503) for t in tiers},
            {t: sum(1 for r in m.rows if r.tier == t and r.result is Result.REJECTED_429) for t in tiers},
            sum(1 for x in minutes if not x.ttft_p95_s < ttft_target_s),
            sum(1 for x in minutes if x.refused > 0.01 * 60 * x.arrivals_rps), tuple(minutes)))
    return AutoscaleReport(put.version.key, opts.seed, ttft_target_s, cold_start, warmup,
                           tuple(results))


def render(report: AutoscaleReport) -> str:
    """A summary table of the scenarios, then each scenario's minutes."""
    c = report.cold_start
    out = [f"Autoscaling: {report.pool}, seed {report.seed}; cold start {c.node_start_s + c.load_s:g} s "
           f"({c.warm_nodes} warm nodes: {c.load_s:g} s); TTFT target p95 < {report.ttft_target_s:g} s", ""]
    cells = [[s.name, fmt(s.replicas_start), fmt(s.replicas_peak), fmt(s.first_scale_up_s, 0),
              fmt(s.request_to_serving_s, 0), fmt(s.load_change_to_serving_s, 0), fmt(s.peak_queue),
              "/".join(str(v) for v in s.shed_503.values()),
              "/".join(str(v) for v in s.rejected_429.values()), fmt(s.minutes_outside_target),
              fmt(s.minutes_refusing)]
             for s in report.scenarios]
    out.append(table(["scenario", "replicas", "peak", "1st scale-up s", "request->serving s",
                      "load change->serving s", "peak queue", "503 i/s/b", "429 i/s/b",
                      "min > target", "min refusing"], cells))
    for s in report.scenarios:
        out += ["", f"{s.name}, per minute:", table(
            ["minute", "arrivals/s", "serving", "starting", "p95 TTFT s", "peak queue", "refused"],
            [[fmt(x.minute), fmt(x.arrivals_rps, 1), fmt(x.serving), fmt(x.starting),
              fmt(x.ttft_p95_s), fmt(x.peak_queue), fmt(x.refused)] for x in s.minutes])]
    return "\n".join(out)

"""Failover game day: lose one region at peak. Measures the time until errors stop,
interactive TTFT during the shift, the batch work delayed, the survivor's cold prefix caches
and its autoscaling.

Two regions (``us-east-1``, ``eu-west-1``), each with chat-7b's live pool at ``replicas``
replicas under the desired-replica rule, behind the global routing of :mod:`sim.fleet.global_dns`
(health checks every 10 s, unhealthy after 3, DNS TTL 60 s). The seed's peak (100 requests/s)
is split between them by the clients' nearest region. At ``lose_at_s`` the first region is
lost: its open streams break, its requests fail until the clients' DNS answers move; clients
retry as the openai SDK does (batch work keeps retrying), with the full history, so the
survivor recomputes prefixes its caches never held.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

from modelfleet.config.schema import PlatformConfig
from sim.drills.common import RunOptions, fmt, pool_under_test, table, with_capacity
from sim.fleet.clients import RetryPolicy
from sim.fleet.gateway import Routing
from sim.fleet.global_dns import GlobalRouting, run_regions
from sim.fleet.measures import RequestRow, Result, by_minute, quantile, served
from sim.fleet.region import Progress
from sim.fleet.scaling import ColdStart, scaler_setup
from sim.fleet.types import FleetSpec
from sim.traces.sources import arrivals

REGIONS = ("us-east-1", "eu-west-1")
TIERS = ("interactive", "standard", "batch")


@dataclass(frozen=True)
class FailoverMinute:
    """One minute by arrival, counted from the loss (minute 0 starts at it)."""

    minute: int
    arrivals_rps: float
    errors: int
    """Attempts that failed (connection error or broken stream) in the minute."""
    refused: int
    """Attempts refused (429 or 503) in the minute, both regions."""
    interactive_p50_s: float
    interactive_p95_s: float
    interactive_p99_s: float
    batch_delayed: int
    """Batch requests of the minute refused at least once or waiting over 10 s."""
    survivor_hit_rate: float
    survivor_serving: int
    survivor_starting: int


@dataclass(frozen=True)
class FailoverReport:
    """The setting, the headline figures and the minutes."""

    pool: str
    rate_rps: float
    replicas: int
    lost: str
    survivor: str
    lost_at_s: float
    seed: int
    routing: GlobalRouting
    unhealthy_after_s: float
    bound_s: float
    errors_stop_after_s: float | None
    errors: int
    requests_failed: int
    interactive_ok_share_after: float
    batch_requests_after: int
    batch_delayed_after: int
    batch_failed_after: int
    batch_mean_delay_s: float
    survivor_hit_before: float
    survivor_hit_after: float
    survivor_replicas_peak: int
    survivor_first_scale_up_s: float | None
    refused_after: dict[str, dict[str, int]]
    """Attempts refused after the loss, by result (429, 503) and tier."""
    minutes: tuple[FailoverMinute, ...]

    def as_dict(self) -> dict[str, object]:
        """JSON-ready."""
        return asdict(self)


def _hit(rows: list[RequestRow]) -> float:
    done = [r for r in rows if r.result is Result.OK]
    prompt = sum(r.prompt_tokens for r in done)
    return sum(r.cached_tokens for r in done) / prompt if prompt else math.nan


def _delayed(r: RequestRow) -> bool:
    return r.retries > 0 or r.queued_s > 10.0 or r.result is not Result.OK


def run_failover(config: PlatformConfig, opts: RunOptions, replicas: int = 12,
                 lose_after_s: float = 60.0, routing: GlobalRouting | None = None,
                 cold_start: ColdStart | None = None,
                 progress: Callable[[str], Progress | None] = lambda _label: None) -> FailoverReport:
    """Both regions from the start; the first is lost ``lose_after_s`` into the measured window
    (defaults: 100 requests/s in all, 240 s warm-up, 600 s measured)."""
    routing = routing or GlobalRouting()
    put = with_capacity(pool_under_test(config), opts.capacity_tokens)
    if put.pool is None:
        raise ValueError(f"no pool of {put.version.key} is declared")
    setup = scaler_setup(put.pool, put.version, config.autoscaling, cold_start=cold_start or ColdStart())
    rate = opts.rate_rps if opts.rate_rps is not None else 100.0
    warmup = opts.warmup_s if opts.warmup_s is not None else 240.0
    duration = opts.duration_s if opts.duration_s is not None else 600.0
    lost_at = warmup + lose_after_s
    specs = [FleetSpec(put.params, replicas, Routing.AFFINITY, model=put.version.model,
                       version=put.version.version,
                       capacity_tokens_per_replica=put.capacity_tokens_per_replica,
                       warmup_s=warmup, duration_s=duration, scaler=setup, seed=opts.seed,
                       region=name) for name in REGIONS]
    source = arrivals(opts.trace, rate, warmup + duration + specs[0].tail_s, opts.seed,
                      block_size=put.params.block_size)
    run = run_regions(specs, config, source, routing, (REGIONS[0], lost_at), RetryPolicy(),
                      progress("failover"))
    lost, survivor = REGIONS
    sfleet = run.fleets[survivor]
    errors = [t for t, _, result, _tier in run.clients.failures if result == Result.ERROR.value]
    rows = run.rows
    after = [r for r in rows if r.arrival_s >= lost_at]
    before = [r for r in rows if r.arrival_s < lost_at]
    minutes = []
    for k, mrows in sorted(by_minute(rows, lost_at).items()):
        lo, hi = lost_at + 60 * k, lost_at + 60 * (k + 1)
        if lo < warmup or hi > warmup + duration:
            continue  # whole minutes of the window only
        inter = [r.ttft_s for r in served(mrows, lambda r: r.tier == "interactive")]
        samples = [s for s in sfleet.m.samples if lo <= s.t_s < hi]
        last = samples[-1] if samples else None
        minutes.append(FailoverMinute(
            k, len(mrows) / 60, sum(1 for t in errors if lo <= t < hi),
            sum(1 for t, _, res, _tier in run.clients.failures
                if lo <= t < hi and res in ("429", "503")),
            quantile(inter, 0.5), quantile(inter, 0.95), quantile(inter, 0.99),
            sum(1 for r in mrows if r.tier == "batch" and _delayed(r)),
            _hit([r for r in mrows if r.region == survivor]),
            last.serving if last else 0, last.starting if last else 0))
    batch = [r for r in after if r.tier == "batch"]
    ok_batch = [r for r in batch if r.result is Result.OK]
    interactive = [r for r in after if r.tier == "interactive"]
    ups = [t for t, _rid, e in sfleet.m.scale_events if e == "requested" and t >= lost_at]
    refused = {res: {tier: sum(1 for t, _, r, ti in run.clients.failures
                               if t >= lost_at and r == res and ti == tier) for tier in TIERS}
               for res in ("429", "503")}
    return FailoverReport(
        put.version.key, rate, replicas, lost, survivor, lost_at, opts.seed, routing,
        routing.unhealthy_at(lost_at) - lost_at, routing.worst_case_s(lost_at),
        max(errors) - lost_at if errors else None, len(errors),
        sum(1 for r in rows if r.result is Result.ERROR),
        sum(1 for r in interactive if r.result is Result.OK) / len(interactive) if interactive else math.nan,
        len(batch), sum(1 for r in batch if _delayed(r)),
        sum(1 for r in batch if r.result is not Result.OK),
        sum(r.queued_s for r in ok_batch) / len(ok_batch) if ok_batch else math.nan,
        _hit([r for r in before if r.region == survivor]),
        _hit([r for r in after if r.region == survivor]),
        max([replicas] + [s.serving for s in sfleet.m.samples]),
        ups[0] - lost_at if ups else None, refused, tuple(minutes))


def render(report: FailoverReport) -> str:
    """The headline figures, then one row per minute."""
    g = report.routing
    stop = report.errors_stop_after_s
    lines = [
        f"Failover: {report.pool} in {report.lost} and {report.survivor}, {report.replicas} "
        f"replicas each under the autoscaler, {report.rate_rps:g} requests/s in all, seed "
        f"{report.seed}; {report.lost} lost at {report.lost_at_s:g} s; health checks every "
        f"{g.interval_s:g} s, unhealthy after {g.failures}, DNS TTL {g.ttl_s:g} s", "",
        f"errors stop after:      {fmt(stop, 0)} s (unhealthy after {report.unhealthy_after_s:g} s; "
        f"bound: unhealthy + one TTL = {report.bound_s:g} s); {report.errors:,} failed attempts, "
        f"{report.requests_failed:,} requests failed after their retries",
        f"interactive after loss: {100 * report.interactive_ok_share_after:.1f}% served",
        f"batch after loss:       {report.batch_delayed_after:,} of {report.batch_requests_after:,} "
        f"delayed (refused or queued > 10 s), {report.batch_failed_after:,} not done; mean wait "
        f"{fmt(report.batch_mean_delay_s, 1)} s",
        f"refused after the loss: 429 i/s/b {'/'.join(map(str, report.refused_after['429'].values()))}, "
        f"503 i/s/b {'/'.join(map(str, report.refused_after['503'].values()))} (attempts)",
        f"survivor prefix hits:   {100 * report.survivor_hit_before:.1f}% before, "
        f"{100 * report.survivor_hit_after:.1f}% after (cold caches for the moved conversations)",
        f"survivor autoscaling:   first scale-up {fmt(report.survivor_first_scale_up_s, 0)} s "
        f"after the loss, peak {report.survivor_replicas_peak} serving replicas", "",
        table(["minute", "arrivals/s", "errors", "429+503", "int p50 s", "int p95 s", "int p99 s",
               "batch delayed", "surv hit %", "serving", "starting"],
              [[fmt(x.minute), fmt(x.arrivals_rps, 1), fmt(x.errors), fmt(x.refused),
                fmt(x.interactive_p50_s), fmt(x.interactive_p95_s), fmt(x.interactive_p99_s),
                fmt(x.batch_delayed), fmt(100 * x.survivor_hit_rate, 1), fmt(x.survivor_serving),
                fmt(x.survivor_starting)] for x in report.minutes]),
    ]
    return "\n".join(lines)

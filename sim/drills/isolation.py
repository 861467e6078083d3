"""Isolation: one team sends 10 times its limit. Every other team's p95 TTFT must not move,
and only the noisy team may see 429s.

Two runs of the same base workload (the ``chat`` preset at half the seed's peak by default, the
config's three teams): a baseline, and the same plus a surge from the noisy team (``research``
by default) at ``factor`` times its chat-7b tokens-per-minute limit, sent as new single-team
conversations of the same shape at the ``standard`` tier. Nobody retries (open loop): a 429 or
503 is counted once. The gateway's own policy decides: token buckets first, then admission by
tier and guaranteed share.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Callable
from dataclasses import asdict, dataclass

from modelfleet.config.schema import PlatformConfig, Tier
from sim.drills.common import RunOptions, fmt, pool_under_test, table, with_capacity
from sim.fleet.gateway import Routing
from sim.fleet.measures import Measured, Result, quantile, served
from sim.fleet.region import Progress, simulate
from sim.fleet.types import FleetSpec
from sim.traces.arrivals import Arrival, TeamMix, TeamShare
from sim.traces.synthetic import CHAT, chat_arrivals


@dataclass(frozen=True)
class TeamRow:
    """One team in both runs: requests, p95 TTFT (seconds), refusals."""

    team: str
    requests: int
    ttft_p95_base_s: float
    ttft_p95_noisy_s: float
    rejected_429: int
    shed_503: int
    rejected_429_base: int

    @property
    def ttft_change(self) -> float:
        """Relative change of p95 TTFT from baseline to surge (0.1 = 10% slower)."""
        return self.ttft_p95_noisy_s / self.ttft_p95_base_s - 1 if self.ttft_p95_base_s else 0.0


@dataclass(frozen=True)
class IsolationReport:
    """Setting and per-team results; ``saw_429``: teams with any 429 during the surge."""

    pool: str
    replicas: int
    rate_rps: float
    noisy_team: str
    noisy_rate_rps: float
    factor: float
    seed: int
    warmup_s: float
    duration_s: float
    teams: tuple[TeamRow, ...]
    saw_429: tuple[str, ...]

    def as_dict(self) -> dict[str, object]:
        """JSON-ready, with each team's TTFT change."""
        out = asdict(self)
        for row, team in zip(out["teams"], self.teams, strict=True):
            row["ttft_change"] = team.ttft_change
        return out


def _p95(m: Measured, team: str) -> float:
    return quantile([r.ttft_s for r in served(m.rows, lambda r: r.team == team)], 0.95)


def _count(m: Measured, team: str, result: Result) -> int:
    return sum(1 for r in m.rows if r.team == team and r.result is result)


def run_isolation(config: PlatformConfig, opts: RunOptions, replicas: int = 12,
                  noisy_team: str = "research", factor: float = 10.0, noisy_tier: Tier = "standard",
                  progress: Callable[[str], Progress | None] = lambda _label: None
                  ) -> IsolationReport:
    """Baseline and surge on ``replicas`` replicas of chat-7b's live version (defaults: 50
    requests/s, 300 s measured after 240 s of warm-up; the surge runs from the start)."""
    put = with_capacity(pool_under_test(config), opts.capacity_tokens)
    team = next((t for t in config.teams if t.name == noisy_team), None)
    limit = next((lim for lim in team.limits if lim.model == put.version.model), None) if team else None
    if limit is None:
        raise ValueError(f"team {noisy_team!r} has no limit on {put.version.model}")
    rate = opts.rate_rps if opts.rate_rps is not None else 50.0
    warmup = opts.warmup_s if opts.warmup_s is not None else 240.0
    duration = opts.duration_s if opts.duration_s is not None else 300.0
    per_request = CHAT.mean_prompt_tokens + CHAT.output_tokens
    noisy_rate = factor * limit.tokens_per_minute / 60 / per_request
    spec = FleetSpec(put.params, replicas, Routing.AFFINITY, model=put.version.model,
                     version=put.version.version, capacity_tokens_per_replica=put.capacity_tokens_per_replica,
                     warmup_s=warmup, duration_s=duration, seed=opts.seed)
    end = warmup + duration + spec.tail_s
    base_w = dataclasses.replace(CHAT, rate_rps=rate)
    noisy_w = dataclasses.replace(CHAT, rate_rps=noisy_rate)
    noisy_mix = TeamMix((TeamShare(noisy_team, noisy_tier, 1.0),))

    def base() -> list[Arrival]:
        return list(chat_arrivals(base_w, end, opts.seed, block_size=put.params.block_size))

    runs = {}
    for name in ("baseline", "surge"):
        source = base() if name == "baseline" else list(heapq.merge(
            base(), chat_arrivals(noisy_w, end, opts.seed + 1, noisy_mix, put.params.block_size,
                                  prefix="noisy"), key=lambda a: a.time_s))
        runs[name] = simulate(spec, config, source, progress(f"isolation {name}"))
    b, s = runs["baseline"], runs["surge"]
    rows = tuple(TeamRow(t.name, sum(1 for r in s.rows if r.team == t.name), _p95(b, t.name),
                         _p95(s, t.name), _count(s, t.name, Result.REJECTED_429),
                         _count(s, t.name, Result.SHED_503), _count(b, t.name, Result.REJECTED_429))
                 for t in config.teams)
    return IsolationReport(put.version.key, replicas, rate, noisy_team, noisy_rate, factor,
                           opts.seed, warmup, duration, rows,
                           tuple(r.team for r in rows if r.rejected_429))


def render(report: IsolationReport) -> str:
    """Per-team p95 TTFT without and with the surge, and who saw 429s."""
    cells = [[r.team + (" (noisy)" if r.team == report.noisy_team else ""), fmt(r.requests),
              fmt(r.ttft_p95_base_s), fmt(r.ttft_p95_noisy_s), fmt(100 * r.ttft_change, 1),
              fmt(r.rejected_429_base), fmt(r.rejected_429), fmt(r.shed_503)] for r in report.teams]
    others = [r for r in report.teams if r.team != report.noisy_team]
    worst = max((r.ttft_change for r in others), default=0.0)
    return "\n".join([
        f"Isolation: {report.pool}, {report.replicas} replicas, {report.rate_rps:g} requests/s of "
        f"base load; {report.noisy_team} adds {report.noisy_rate_rps:.0f} requests/s "
        f"({report.factor:g} x its token limit); seed {report.seed}, {report.duration_s:g} s "
        f"measured after {report.warmup_s:g} s", "",
        table(["team", "requests", "p95 TTFT base s", "p95 TTFT surge s", "change %",
               "429 base", "429 surge", "503 surge"], cells), "",
        f"teams that saw 429s during the surge: {', '.join(report.saw_429) or 'none'}; "
        f"largest p95 TTFT change among the others: {100 * worst:+.1f}%",
    ])

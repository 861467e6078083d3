"""Canary: a bad version at the rollout controller's stages. The guard rule (the function the
controller runs in production, :func:`envoy_control.rollouts.guard.judge`) must roll it back, and a
healthy one must reach the alias.

One region at its normal half load (50 requests/s on 12 replicas of the live version by
default); after a warm-up the controller starts the rollout of the canary (chat-7b@v14 when the
config declares it) through canary 1%, 10%, 50% (no shadow stage: shadow answers are discarded
and carry no user-visible effect here), each held ``hold_s``, judged every ``tick_s`` over the
last ``window_s``. The canary is the live version's engine with one fault:

* ``slow``: prefill and decode ``slow_factor`` times slower (a missing kernel, no CUDA graphs);
* ``long``: answers ``long_factor`` times longer (a wrong chat template), up to max_tokens;
* ``errors``: ``error_share`` of its answers are a 500 before any token;
* ``none``: a healthy canary (the same engine).

Clients send ``max_tokens`` = ``max_tokens`` (so a longer answer can show) and retry as the
openai SDK does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import asdict, dataclass

from envoy_control.rollouts.controller import RolloutPolicy, Stage
from envoy_control.rollouts.guard import GuardThresholds

from modelfleet.config.schema import PlatformConfig
from sim.drills.common import RunOptions, fmt, pool_under_test, table, with_capacity
from sim.fleet.canary import Check, Controller
from sim.fleet.clients import RetryPolicy
from sim.fleet.gateway import Routing
from sim.fleet.region import Fleet, Progress
from sim.fleet.types import FleetSpec, VersionSpec
from sim.traces.sources import arrivals

FAULTS = ("slow", "long", "errors", "none")


@dataclass(frozen=True)
class CanarySettings:
    """The rollout and the fault; seconds, percents (0..100), factors."""

    fault: str = "slow"
    stages: tuple[float, ...] = (1.0, 10.0, 50.0)
    hold_s: float = 600.0
    window_s: float = 600.0
    tick_s: float = 30.0
    min_requests: int = 200
    slow_factor: float = 1.5
    long_factor: float = 1.3
    error_share: float = 0.02
    max_tokens: int = 1024


@dataclass(frozen=True)
class CanaryReport:
    """What the rollout did: its decisions, the checks, and what the canary served."""

    pool: str
    canary: str
    fault: str
    replicas: int
    rate_rps: float
    seed: int
    started_s: float
    settings: CanarySettings
    outcome: str
    """``rolled_back``, ``promoted`` or ``running`` (the run ended first)."""
    decided_s: float | None
    decided_stage: str
    reasons: tuple[str, ...]
    decisions: tuple[dict[str, object], ...]
    checks: tuple[Check, ...]
    canary_requests: int
    canary_errors: int
    canary_conversations: int

    def as_dict(self) -> dict[str, object]:
        """JSON-ready."""
        return asdict(self)


def canary_version(base: VersionSpec, name: str, s: CanarySettings) -> VersionSpec:
    """The canary: ``base``'s engine under ``name`` with the fault of ``s``."""
    if s.fault not in FAULTS:
        raise ValueError(f"unknown fault {s.fault!r}: one of {', '.join(FAULTS)}")
    v = dataclasses.replace(base, version=name)
    if s.fault == "slow":
        p = base.params
        slower = p.with_overrides({"capacity_tokens_per_s": p.capacity_tokens_per_s / s.slow_factor,
                                   "prefill_tokens_per_s_per_gpu":
                                       p.prefill_tokens_per_s_per_gpu / s.slow_factor})
        return dataclasses.replace(v, params=slower)
    if s.fault == "long":
        return dataclasses.replace(v, output_factor=s.long_factor)
    if s.fault == "errors":
        return dataclasses.replace(v, error_share=s.error_share)
    return v


def run_canary(config: PlatformConfig, opts: RunOptions, settings: CanarySettings | None = None,
               replicas: int = 12, progress: Callable[[str], Progress | None] = lambda _l: None
               ) -> CanaryReport:
    """Roll a canary with ``settings.fault`` out on ``replicas`` replicas (defaults: 50
    requests/s, a 120 s warm-up, then the stages; the run ends 60 s after the decision)."""
    s = settings or CanarySettings()
    put = with_capacity(pool_under_test(config), opts.capacity_tokens)
    model = config.model(put.version.model)
    name = model.canary.version if model is not None and model.canary else "canary"
    rate = opts.rate_rps if opts.rate_rps is not None else 50.0
    warmup = opts.warmup_s if opts.warmup_s is not None else 120.0
    duration = opts.duration_s if opts.duration_s is not None else len(s.stages) * s.hold_s + 120
    spec = FleetSpec(put.params, replicas, Routing.AFFINITY, model=put.version.model,
                     version=put.version.version,
                     capacity_tokens_per_replica=put.capacity_tokens_per_replica, warmup_s=warmup,
                     duration_s=duration, tail_s=0.0, seed=opts.seed, retry=RetryPolicy())
    stages = tuple(Stage(f"canary-{p:g}", "canary", p, s.hold_s) for p in s.stages)
    policy = RolloutPolicy(stages, s.window_s, GuardThresholds(min_requests=s.min_requests))
    holder: list[Controller] = []
    fleet = Fleet(spec, config, progress("canary"),
                  choose_version=lambda req: holder[0].choose_version(req))
    base = fleet.versions[fleet.main]
    canary_pool = fleet.add_version(canary_version(base, name, s))
    ctl = Controller(fleet, canary_pool, policy, warmup, s.tick_s, seed=opts.seed)
    holder.append(ctl)
    fleet.hooks.append(ctl)
    source = (dataclasses.replace(a, max_tokens=max(s.max_tokens, a.output_tokens))
              for a in arrivals(opts.trace, rate, warmup + duration, opts.seed,
                                block_size=put.params.block_size))
    m = fleet.run(source)
    final = next((d for d in reversed(ctl.decisions) if d.decision in ("rollback", "promote")), None)
    served = [c for c in m.completions if c[1] == canary_pool]
    outcome = {"rollback": "rolled_back", "promote": "promoted"}.get(
        final.decision if final else "", "running")
    return CanaryReport(
        put.version.key, canary_pool, s.fault, replicas, rate, opts.seed, warmup, s, outcome,
        final.decided_s if final else None, final.stage if final else "",
        final.reasons if final else (),
        tuple({"t_s": d.decided_s, "stage": d.stage, "percent": d.percent,
               "decision": d.decision, "reasons": list(d.reasons)} for d in ctl.decisions),
        tuple(ctl.checks), len(served), sum(1 for c in served if not c[4]), len(ctl.conversations))


def render(report: CanaryReport) -> str:
    """The controller's decisions, its checks, and the verdict line."""
    s = report.settings
    dec = [[fmt(float(d["t_s"]), 0), str(d["stage"]), fmt(float(d["percent"]), 0),  # type: ignore[arg-type]
            str(d["decision"]), "; ".join(d["reasons"])]  # type: ignore[arg-type]
           for d in report.decisions]
    checks = [[fmt(c.t_s, 0), c.stage, fmt(c.percent, 0),
               fmt(int(c.live.requests)), fmt(c.live.error_rate and 100 * c.live.error_rate, 2),
               fmt(c.live.ttft_p95_s), fmt(c.live.output_tokens_mean, 0),
               fmt(int(c.canary.requests)), fmt(c.canary.error_rate and 100 * c.canary.error_rate, 2),
               fmt(c.canary.ttft_p95_s), fmt(c.canary.output_tokens_mean, 0), c.outcome]
              for c in report.checks]
    at = report.decided_s or 0.0
    if report.outcome == "rolled_back":
        verdict = (f"{report.canary} ({report.fault}) rolled back at {at:,.0f} s "
                   f"({at - report.started_s:,.0f} s into the rollout), stage "
                   f"{report.decided_stage}: {'; '.join(report.reasons)}")
    elif report.outcome == "promoted":
        verdict = (f"{report.canary} ({report.fault}) promoted at {at:,.0f} s: the "
                   f"alias points at it")
    else:
        verdict = f"{report.canary} ({report.fault}): no decision by the end of the run"
    return "\n".join([
        f"Canary: {report.canary} ({report.fault}) against {report.pool}, {report.replicas} "
        f"replicas, {report.rate_rps:g} requests/s, seed {report.seed}; stages "
        f"{', '.join(f'{p:g}%' for p in s.stages)} held {s.hold_s:g} s, guard over {s.window_s:g} s "
        f"every {s.tick_s:g} s (min {s.min_requests} requests a side), from {report.started_s:g} s",
        "", table(["t s", "stage", "%", "decision", "reasons"], dec) if dec else "(no decision)",
        "", table(["t s", "stage", "%", "live n", "err %", "p95 TTFT s", "out tok",
                   "canary n", "err %", "p95 TTFT s", "out tok", "guard"], checks)
        if checks else "(no check)", "",
        verdict,
        f"the canary answered {report.canary_requests:,} requests ({report.canary_errors:,} "
        f"errors) of {report.canary_conversations:,} conversations",
    ])

"""Routing A/B: one replay three times, round-robin, least tokens in flight, and prefix
affinity with bounded load, through the same gateway, pool and replicas.

Measures per policy (over the measured window): prefix hit rate (cached over prompt tokens),
history found (share of requests with a conversation history whose history the prefix cache
held), prefill tokens/s (prompt tokens computed, recomputation after preemption included),
p95 TTFT, imbalance (highest tokens in flight over the pool average, mean and p95 over
heartbeats, from the replicas' counts; ``view``: the same from what the picker saw), refusals
and the share of streams slower than 30 tokens/s. Then the seed's claims against this replay:
80% hit rate and 120,000 -> 56,000 prompt tokens/s, scaled to the replay's prompt tokens/s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

from modelfleet.config.schema import PlatformConfig
from sim.drills.common import RunOptions, fmt, pool_under_test, table, with_capacity
from sim.fleet.gateway import Routing
from sim.fleet.measures import (
    Result,
    hit_rates,
    imbalance,
    quantile,
    served,
    slow_stream_share,
)
from sim.fleet.region import Progress, simulate
from sim.fleet.types import FleetSpec
from sim.traces.sources import arrivals

SEED_HIT_RATE = 0.8
SEED_PROMPT_TOKENS_PER_S = 120_000
SEED_PREFILL_TOKENS_PER_S = 56_000
"""The seed: 100 requests x (1,200 - 0.8 x 800) prompt tokens per second."""


@dataclass(frozen=True)
class PolicyRow:
    """One policy's measures: shares 0..1, tokens per second, seconds."""

    policy: str
    requests: int
    token_hit_rate: float
    history_hit_rate: float
    prompt_tokens_per_s: float
    prefill_tokens_per_s: float
    output_tokens_per_s: float
    ttft_p50_s: float
    ttft_p95_s: float
    imbalance_mean: float
    imbalance_p95: float
    view_imbalance_mean: float
    rejected_429: int
    shed_503: int
    slow_stream_share: float


@dataclass(frozen=True)
class RoutingReport:
    """The A/B's setting and one row per policy."""

    pool: str
    replicas: int
    trace: str
    rate_rps: float
    seed: int
    warmup_s: float
    duration_s: float
    bound: float
    rows: tuple[PolicyRow, ...]

    def as_dict(self) -> dict[str, object]:
        """JSON-ready."""
        return asdict(self)


def run_routing(config: PlatformConfig, opts: RunOptions, replicas: int = 12, bound: float = 1.25,
                progress: Callable[[str], Progress | None] = lambda _label: None) -> RoutingReport:
    """Replay ``opts``' trace once per policy on ``replicas`` replicas of chat-7b's live version
    (defaults: 100 requests/s, the seed's peak; 300 s measured after 240 s of warm-up: a
    conversation's turns span about 160 s, so the caches reach their steady state)."""
    put = with_capacity(pool_under_test(config), opts.capacity_tokens)
    rate = opts.rate_rps if opts.rate_rps is not None else 100.0
    warmup = opts.warmup_s if opts.warmup_s is not None else 240.0
    duration = opts.duration_s if opts.duration_s is not None else 300.0
    rows = []
    for routing in (Routing.ROUND_ROBIN, Routing.LEAST_LOADED, Routing.AFFINITY):
        spec = FleetSpec(put.params, replicas, routing, bound, put.version.model,
                         put.version.version, put.capacity_tokens_per_replica,
                         warmup_s=warmup, duration_s=duration, seed=opts.seed)
        source = arrivals(opts.trace, rate, warmup + duration + spec.tail_s, opts.seed,
                          block_size=put.params.block_size)
        m = simulate(spec, config, source, progress(f"routing {routing}"))
        token_hits, history_hits = hit_rates(m.rows, put.params.block_size)
        ran = served(m.rows)
        imb_mean, imb_p95 = imbalance(m.samples)
        rows.append(PolicyRow(
            policy=str(routing) + (f" (bound {bound:g})" if routing is Routing.AFFINITY else ""),
            requests=len(m.rows),
            token_hit_rate=token_hits,
            history_hit_rate=history_hits,
            prompt_tokens_per_s=sum(r.prompt_tokens for r in ran) / m.duration_s,
            prefill_tokens_per_s=m.prefill_tokens / m.duration_s,
            output_tokens_per_s=m.output_tokens / m.duration_s,
            ttft_p50_s=quantile([r.ttft_s for r in ran], 0.5),
            ttft_p95_s=quantile([r.ttft_s for r in ran], 0.95),
            imbalance_mean=imb_mean,
            imbalance_p95=imb_p95,
            view_imbalance_mean=imbalance(m.samples, view=True)[0],
            rejected_429=sum(1 for r in m.rows if r.result is Result.REJECTED_429),
            shed_503=sum(1 for r in m.rows if r.result is Result.SHED_503),
            slow_stream_share=slow_stream_share(m.rows, 30.0),
        ))
    return RoutingReport(f"{put.version.key}", replicas, opts.trace, rate, opts.seed, warmup,
                         duration, bound, tuple(rows))


def render(report: RoutingReport) -> str:
    """The A/B table and the seed's claims against it."""
    head = (f"Routing A/B: {report.pool}, {report.replicas} replicas, trace {report.trace} at "
            f"{report.rate_rps:g} requests/s, seed {report.seed}; {report.duration_s:g} s measured "
            f"after {report.warmup_s:g} s warm-up")
    cells = [[r.policy, fmt(100 * r.token_hit_rate, 1), fmt(100 * r.history_hit_rate, 1),
              fmt(r.prefill_tokens_per_s), fmt(r.ttft_p95_s), fmt(r.imbalance_mean),
              fmt(r.imbalance_p95), fmt(r.view_imbalance_mean), fmt(r.rejected_429),
              fmt(r.shed_503), fmt(100 * r.slow_stream_share, 1)] for r in report.rows]
    out = [head, "", table(["policy", "hit % tok", "history %", "prefill tok/s", "p95 TTFT s",
                            "imbalance", "imb p95", "view", "429", "503", "slow %"], cells)]
    best = report.rows[-1]
    if best.prompt_tokens_per_s > 0:
        scale = best.prompt_tokens_per_s / SEED_PROMPT_TOKENS_PER_S
        saved = 1 - best.prefill_tokens_per_s / best.prompt_tokens_per_s
        out += ["", f"seed: {SEED_HIT_RATE:.0%} of requests find their prefix; prefill "
                f"{SEED_PROMPT_TOKENS_PER_S:,} -> {SEED_PREFILL_TOKENS_PER_S:,} prompt tokens/s "
                f"({1 - SEED_PREFILL_TOKENS_PER_S / SEED_PROMPT_TOKENS_PER_S:.0%} less)",
                f"here: {best.history_hit_rate:.0%} of requests with a history found it; prefill "
                f"{best.prompt_tokens_per_s:,.0f} -> {best.prefill_tokens_per_s:,.0f} prompt tokens/s "
                f"({saved:.0%} less); the seed's ratio at this prompt rate would give "
                f"{SEED_PREFILL_TOKENS_PER_S * scale:,.0f}"]
    return "\n".join(out)

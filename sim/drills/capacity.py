"""The capacity gate: replay prompts at a fixed arrival rate straight at one simulated replica
(no gateway: a load test of the version), raise the rate step by step, and find the highest
output tokens/s at which p95 TTFT stays under 1 s and streams keep 30 tokens/s; report the
tokens in flight at that point, the figure the autoscaler and admission use.

"Streams keep 30 tokens/s": at most ``slow_share`` (5%) of the streams average under 30 tokens/s
from their first to their last token, the same percentile as the TTFT target.

Steps: from ``start`` to ``stop`` times the configured capacity's request rate (configured
output tokens/s over the workload's mean answer), ``step`` apart, until two steps in a row fail;
then ``refine`` bisections between the highest pass and the next failure.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

from modelfleet.config.schema import PlatformConfig
from modelfleet.release.rate import Targets, latency_failures
from sim.drills.common import RunOptions, fmt, pool_under_test, table
from sim.fleet.gateway import Routing
from sim.fleet.measures import hit_rates, quantile, served, slow_stream_share
from sim.fleet.region import Progress, simulate
from sim.fleet.types import FleetSpec
from sim.traces.sources import arrivals
from sim.traces.synthetic import PRESETS


@dataclass(frozen=True)
class CapacityStep:
    """One arrival rate (requests/s: offered, and measured over the window, which varies
    around it because conversations cluster requests) and what the replica did: tokens/s,
    seconds, tokens."""

    rate_rps: float
    measured_rps: float
    output_tokens_per_s: float
    ttft_p95_s: float
    slow_stream_share: float
    stream_p50_tokens_per_s: float
    stream_p5_tokens_per_s: float
    tokens_in_flight: float
    streams: float
    prefix_hit_rate: float
    passed: bool


@dataclass(frozen=True)
class CapacityReport:
    """The gate's targets, every step, and the capacity found (None if no step passed)."""

    pool: str
    trace: str
    seed: int
    ttft_target_s: float
    stream_target_tokens_per_s: float
    configured_tokens_per_s: float
    configured_tokens_in_flight: int
    configured_streams: int
    steps: tuple[CapacityStep, ...]
    capacity: CapacityStep | None

    def as_dict(self) -> dict[str, object]:
        """JSON-ready."""
        return asdict(self)


@dataclass(frozen=True)
class GateSettings:
    """Targets (seconds, tokens/s, share 0..1) and the rate schedule (multiples of the
    configured rate)."""

    ttft_target_s: float = 1.0
    stream_target_tokens_per_s: float = 30.0
    slow_share: float = 0.05
    start: float = 0.5
    stop: float = 1.5
    step: float = 0.1
    refine: int = 2

    def targets(self) -> Targets:
        """The latency targets in the platform gate's form (one pass rule for both)."""
        return Targets(ttft_p95_s=self.ttft_target_s,
                       stream_tokens_per_s=self.stream_target_tokens_per_s,
                       max_slow_share=self.slow_share)


def run_capacity(config: PlatformConfig, opts: RunOptions, gate: GateSettings = GateSettings(),
                 progress: Callable[[str], Progress | None] = lambda _label: None) -> CapacityReport:
    """Run the gate on chat-7b's live version (defaults: the ``seed`` preset's prompts, 300 s
    measured after 200 s of warm-up per step)."""
    put = pool_under_test(config)
    trace = opts.trace
    warmup = opts.warmup_s if opts.warmup_s is not None else 200.0
    duration = opts.duration_s if opts.duration_s is not None else 300.0
    mean_output = PRESETS[trace].output_tokens if trace in PRESETS else 300
    base_rps = put.version.capacity.output_tokens_per_s / mean_output

    def measure(multiple: float) -> CapacityStep:
        rate = base_rps * multiple
        spec = FleetSpec(put.params, 1, Routing.LEAST_LOADED, model=put.version.model,
                         version=put.version.version, warmup_s=warmup, duration_s=duration,
                         seed=opts.seed, gateway=False)
        source = arrivals(trace, rate, warmup + duration + spec.tail_s, opts.seed,
                          block_size=put.params.block_size)
        m = simulate(spec, config, source, progress(f"capacity {rate:.2f} req/s"))
        ran = served(m.rows)
        streams = [r.stream_tokens_per_s for r in ran if r.output_tokens > 1]
        p95 = quantile([r.ttft_s for r in ran], 0.95)
        slow = slow_stream_share(m.rows, gate.stream_target_tokens_per_s)
        n = max(1, len(m.samples))
        return CapacityStep(rate, len(m.rows) / m.duration_s, m.output_tokens / m.duration_s,
                            p95, slow,
                            quantile(streams, 0.5), quantile(streams, 0.05),
                            sum(sum(s.tokens_in_flight) for s in m.samples) / n,
                            sum(s.engine_running for s in m.samples) / n,
                            hit_rates(m.rows, put.params.block_size)[0],
                            not latency_failures(p95, slow, gate.targets()))

    steps: dict[float, CapacityStep] = {}
    multiple, failures = gate.start, 0
    while multiple <= gate.stop + 1e-9 and failures < 2:
        steps[multiple] = measure(multiple)
        failures = 0 if steps[multiple].passed else failures + 1
        multiple = round(multiple + gate.step, 6)
    for _ in range(gate.refine):
        passed = [k for k, s in steps.items() if s.passed]
        if not passed:
            break
        above = [k for k, s in steps.items() if not s.passed and k > max(passed)]
        if not above:
            break
        mid = round((max(passed) + min(above)) / 2, 6)
        steps[mid] = measure(mid)
    ordered = tuple(steps[k] for k in sorted(steps))
    best = max((s for s in ordered if s.passed), key=lambda s: s.output_tokens_per_s, default=None)
    v = put.version
    return CapacityReport(v.key, trace, opts.seed, gate.ttft_target_s,
                          gate.stream_target_tokens_per_s, v.capacity.output_tokens_per_s,
                          v.capacity.tokens_in_flight, v.capacity.streams, ordered, best)


def render(report: CapacityReport) -> str:
    """The steps and the capacity found, against the configured figures."""
    cells = [[fmt(s.rate_rps), fmt(s.measured_rps), fmt(s.output_tokens_per_s), fmt(s.ttft_p95_s),
              fmt(100 * s.slow_stream_share, 1), fmt(s.stream_p50_tokens_per_s, 1),
              fmt(s.tokens_in_flight), fmt(s.streams, 1), fmt(100 * s.prefix_hit_rate, 1),
              "pass" if s.passed else "FAIL"]
             for s in report.steps]
    out = [f"Capacity gate: {report.pool}, one replica, trace {report.trace}, seed {report.seed}; "
           f"pass = p95 TTFT < {report.ttft_target_s:g} s and at most 5% of streams under "
           f"{report.stream_target_tokens_per_s:g} tokens/s", "",
           table(["req/s", "measured", "output tok/s", "p95 TTFT s", "slow %", "p50 stream tok/s",
                  "tokens in flight", "streams", "hit % tok", "gate"], cells), ""]
    c = report.capacity
    configured = (f"configured: {report.configured_tokens_per_s:,.0f} output tokens/s, "
                  f"{report.configured_tokens_in_flight:,} tokens in flight, "
                  f"{report.configured_streams} streams")
    if c is None:
        out.append(f"no rate passed the gate; {configured}")
    else:
        out.append(f"capacity: {c.output_tokens_per_s:,.0f} output tokens/s at "
                   f"{c.tokens_in_flight:,.0f} tokens in flight ({c.streams:.0f} streams); "
                   f"{configured}")
    return "\n".join(out)

"""Simulator speed at the seed's peak: simulated seconds per wall-clock second on one core.

Runs the ``chat`` workload at 100 requests/s (the seed's peak: 1,000 streams, 30,000 output
tokens/s) through the gateway's policy onto 12 chat-7b replicas with prefix affinity, for
``--seconds`` simulated seconds, and prints: simulated seconds per wall second, requests and
output tokens simulated per wall second, the projected wall time of one simulated hour
(goal: 60 s), and the share of the time spent in ``replica.engine.Engine.step``. It prints the
figure per CPU second too: on a shared machine it moves less than the wall-clock one. The arrivals
are generated before the clock starts (their cost is printed apart). ``--profile`` prints the
hottest functions. Prints figures only; it never fails on a time.

    python benchmarks/bench_sim_speed.py                  # 120 simulated seconds at the peak
    python benchmarks/bench_sim_speed.py --seconds 600 --profile
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import io
import pstats
import sys
import time
from pathlib import Path

from modelfleet.config import load_config
from replica.engine import Engine
from replica.engine_types import StepResult
from sim.drills.common import pool_under_test
from sim.fleet.gateway import Routing
from sim.fleet.region import simulate
from sim.fleet.types import FleetSpec
from sim.traces.synthetic import CHAT, chat_arrivals

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=120.0, help="simulated seconds")
    ap.add_argument("--rate", type=float, default=100.0, help="requests per second (the seed's peak: 100)")
    ap.add_argument("--replicas", type=int, default=12)
    ap.add_argument("--routing", choices=[r.value for r in Routing], default=Routing.AFFINITY.value)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--profile", action="store_true", help="print the 20 hottest functions")
    args = ap.parse_args()

    config = load_config(REPO / "config").config
    put = pool_under_test(config)
    spec = FleetSpec(put.params, args.replicas, Routing(args.routing), warmup_s=0.0,
                     duration_s=args.seconds, tail_s=0.0, seed=args.seed,
                     capacity_tokens_per_replica=put.capacity_tokens_per_replica)
    t0 = time.perf_counter()
    arrivals = list(chat_arrivals(dataclasses.replace(CHAT, rate_rps=args.rate), args.seconds,
                                  args.seed, block_size=put.params.block_size))
    generate_s = time.perf_counter() - t0

    step_s = 0.0
    original = Engine.step

    def timed_step(self: Engine, detail: bool = True) -> StepResult:
        nonlocal step_s
        start = time.perf_counter()
        result = original(self, detail)
        step_s += time.perf_counter() - start
        return result

    Engine.step = timed_step  # type: ignore[method-assign]
    profiler = cProfile.Profile() if args.profile else None
    t0, c0 = time.perf_counter(), time.process_time()
    if profiler is not None:
        profiler.enable()
    m = simulate(spec, config, arrivals)
    if profiler is not None:
        profiler.disable()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    Engine.step = original  # type: ignore[method-assign]

    rate = args.seconds / wall
    print(f"workload: {len(arrivals):,} requests over {args.seconds:g} s at {args.rate:g}/s, "
          f"{args.replicas} replicas, {args.routing} (generated in {generate_s:.1f} s, not counted)")
    print(f"wall time:                       {wall:8.1f} s")
    print(f"simulated seconds / wall second: {rate:8.2f}")
    print(f"simulated seconds / CPU second:  {args.seconds / cpu:8.2f}  (CPU time of this process: "
          f"steadier than wall time on a shared machine)")
    print(f"requests / wall second:          {len(m.rows) / wall:8.0f}")
    print(f"output tokens / wall second:     {m.output_tokens / wall:8.0f}  "
          f"({m.output_tokens / args.seconds:,.0f} per simulated second)")
    print(f"one simulated hour would take:   {3600 / rate:8.0f} s  (goal: 60 s)")
    print(f"share in Engine.step:            {step_s / wall:8.0%}")
    if profiler is not None:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(20)
        print(out.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())

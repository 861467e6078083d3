"""``modelfleet drill NAME``: the seed's experiments in the simulator (``sim/``), with the
platform's own policy code: routing A/B, capacity gate, isolation, autoscaling, canary rollout,
region failover."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from modelfleet.config import ConfigError, load_config
from sim.drills.common import RunOptions, StderrProgress
from sim.fleet.region import Progress

DRILLS = ("routing", "capacity", "isolation", "autoscale", "canary", "failover")


def register(sub: Any) -> None:
    """Add the ``drill`` sub-command to ``sub``."""
    p: argparse.ArgumentParser = sub.add_parser(
        "drill",
        help="run one of the seed's drills in the simulator (routing, capacity, isolation, autoscale, "
             "canary, failover)",
        description="Simulate one region (two for failover) with the gateway's policy, the replica "
                    "engine, the desired-replica rule and the rollout guard, and print the seed's "
                    "measures. See docs/drills.md.",
    )
    p.add_argument("name", choices=DRILLS, help="which drill")
    p.add_argument("--trace", default=None,
                   help="'chat' or 'seed' (synthetic presets), an Azure .csv or a Mooncake .jsonl "
                        "(default: chat; seed for capacity)")
    p.add_argument("--rate", type=float, default=None, help="mean requests per second (default: the drill's)")
    p.add_argument("--seed", type=int, default=1, help="random seed: the same seed gives the same figures")
    p.add_argument("--duration", type=float, default=None, help="seconds measured (default: the drill's)")
    p.add_argument("--warmup", type=float, default=None, help="seconds simulated before measuring")
    p.add_argument("--replicas", type=int, default=12,
                   help="replicas (routing, isolation, canary: the live pool's, failover: per region)")
    p.add_argument("--bound", type=float, default=1.25,
                   help="routing: skip a replica above this multiple of the average tokens in flight")
    p.add_argument("--scenario", choices=("ramp", "doubling", "both"), default="both",
                   help="autoscale: which scenario")
    p.add_argument("--warm-nodes", type=int, default=0, help="autoscale: idle GPU nodes with the weights on disk")
    p.add_argument("--fault", choices=("slow", "long", "errors", "none"), default="slow",
                   help="canary: what is wrong with the canary version (none: a healthy one)")
    p.add_argument("--hold", type=float, default=600.0, help="canary: seconds each stage is held")
    p.add_argument("--window", type=float, default=600.0,
                   help="canary: seconds of metrics each guard verdict reads")
    p.add_argument("--stages", default="1,10,50", help="canary: stage percents, comma-separated")
    p.add_argument("--min-requests", type=int, default=200,
                   help="canary: finished requests each side needs before the guard judges")
    p.add_argument("--lose-after", type=float, default=60.0,
                   help="failover: seconds into the measured window at which the first region is lost")
    p.add_argument("--capacity-tokens", type=int, default=None,
                   help="tokens in flight per replica for admission and the autoscaler "
                        "(default: the version's load-tested figure; e.g. what `drill capacity` found)")
    p.add_argument("--config", default="config", help="config directory")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--plot", default=None, metavar="OUT.png", help="also write a plot (needs matplotlib)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(run=run)


def _clean(value: Any) -> Any:
    """JSON has no infinity or NaN: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def run(args: argparse.Namespace) -> int:
    """Run the drill and print its report."""
    from sim.drills import autoscale as drill_autoscale
    from sim.drills import canary as drill_canary
    from sim.drills import capacity as drill_capacity
    from sim.drills import failover as drill_failover
    from sim.drills import isolation as drill_isolation
    from sim.drills import routing as drill_routing
    from sim.fleet.scaling import ColdStart

    try:
        config = load_config(Path(args.config)).config
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    default_trace = "seed" if args.name == "capacity" else "chat"
    opts = RunOptions(args.trace or default_trace, args.rate, args.seed, args.duration, args.warmup,
                      args.capacity_tokens)

    def progress(label: str) -> Progress | None:
        return None if args.quiet else StderrProgress(label)

    report: Any
    render: Callable[[Any], str]
    try:
        if args.name == "routing":
            report = drill_routing.run_routing(config, opts, args.replicas, args.bound,
                                               progress=progress)
            render = drill_routing.render
        elif args.name == "capacity":
            report = drill_capacity.run_capacity(config, opts, progress=progress)
            render = drill_capacity.render
        elif args.name == "canary":
            settings = drill_canary.CanarySettings(
                args.fault, tuple(float(x) for x in args.stages.split(",")), args.hold, args.window,
                min_requests=args.min_requests)
            report = drill_canary.run_canary(config, opts, settings, args.replicas, progress=progress)
            render = drill_canary.render
        elif args.name == "failover":
            report = drill_failover.run_failover(config, opts, args.replicas, args.lose_after,
                                                 cold_start=ColdStart(warm_nodes=args.warm_nodes),
                                                 progress=progress)
            render = drill_failover.render
        elif args.name == "isolation":
            report = drill_isolation.run_isolation(config, opts, args.replicas, progress=progress)
            render = drill_isolation.render
        else:
            names = ("ramp", "doubling") if args.scenario == "both" else (args.scenario,)
            report = drill_autoscale.run_autoscale(
                config, opts, tuple(drill_autoscale.SCENARIOS[n] for n in names),
                ColdStart(warm_nodes=args.warm_nodes), progress=progress)
            render = drill_autoscale.render
    except (ValueError, OSError) as exc:
        print(f"modelfleet drill {args.name}: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(_clean(report.as_dict()), indent=2) if args.json else render(report))
    if args.plot:
        from sim.drills.plots import plot

        try:
            plot(report, args.plot)
        except RuntimeError as exc:
            print(f"modelfleet drill {args.name}: {exc}", file=sys.stderr)
            return 2
    return 0

"""PNG plots of the drills' reports. matplotlib is imported only when a plot is asked for, so
the simulator and the drills' tables work without it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from envoy_control.rollouts.guard import VersionMetrics

from sim.drills.autoscale import AutoscaleReport
from sim.drills.canary import CanaryReport
from sim.drills.capacity import CapacityReport
from sim.drills.failover import FailoverReport
from sim.drills.isolation import IsolationReport
from sim.drills.routing import RoutingReport

Report = (RoutingReport | CapacityReport | IsolationReport | AutoscaleReport | CanaryReport
          | FailoverReport)


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise RuntimeError("--plot needs matplotlib (pip install matplotlib)") from exc
    return plt


def plot(report: Report, path: str | Path) -> None:
    """Write ``report`` as a PNG to ``path``."""
    plt = _pyplot()
    if isinstance(report, RoutingReport):
        fig, axes = plt.subplots(1, 4, figsize=(16, 4))
        names = [r.policy.split(" ")[0] for r in report.rows]
        panels = [("prefix hit rate (tokens)", [r.token_hit_rate for r in report.rows]),
                  ("prefill tokens/s", [r.prefill_tokens_per_s for r in report.rows]),
                  ("p95 TTFT (s)", [r.ttft_p95_s for r in report.rows]),
                  ("imbalance (max / mean tokens in flight)", [r.imbalance_mean for r in report.rows])]
        for ax, (title, values) in zip(axes, panels, strict=True):
            ax.bar(names, values, color=["#999999", "#6699cc", "#cc6633"])
            ax.set_title(title, fontsize=10)
        axes[3].axhline(report.bound, color="black", linestyle="--", linewidth=1)
        fig.suptitle(f"Routing A/B, {report.replicas} replicas, {report.rate_rps:g} req/s")
    elif isinstance(report, CapacityReport):
        fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
        out = [s.output_tokens_per_s for s in report.steps]
        left.plot(out, [s.ttft_p95_s for s in report.steps], marker="o")
        left.axhline(report.ttft_target_s, color="black", linestyle="--", linewidth=1)
        left.set_xlabel("output tokens/s")
        left.set_ylabel("p95 TTFT (s)")
        right.plot(out, [s.stream_p50_tokens_per_s for s in report.steps], marker="o",
                   label="median stream")
        right.plot(out, [s.stream_p5_tokens_per_s for s in report.steps], marker="o",
                   label="5th percentile stream")
        right.legend(fontsize=8)
        right.axhline(report.stream_target_tokens_per_s, color="black", linestyle="--", linewidth=1)
        right.set_xlabel("output tokens/s")
        right.set_ylabel("stream tokens/s")
        for ax in (left, right):
            ax.axvline(report.configured_tokens_per_s, color="grey", linestyle=":", linewidth=1)
            if report.capacity is not None:
                ax.axvline(report.capacity.output_tokens_per_s, color="green", linewidth=1)
        fig.suptitle(f"Capacity gate, {report.pool}")
    elif isinstance(report, CanaryReport):
        fig = _canary(plt, report)
    elif isinstance(report, FailoverReport):
        fig = _failover(plt, report)
    elif isinstance(report, IsolationReport):
        fig, ax = plt.subplots(figsize=(8, 4))
        names = [t.team for t in report.teams]
        xs = range(len(names))
        ax.bar([x - 0.2 for x in xs], [t.ttft_p95_base_s for t in report.teams], 0.4, label="baseline")
        ax.bar([x + 0.2 for x in xs], [t.ttft_p95_noisy_s for t in report.teams], 0.4,
               label=f"{report.noisy_team} at {report.factor:g} x limit")
        ax.set_xticks(list(xs), names)
        ax.set_ylabel("p95 TTFT (s)")
        ax.legend()
        fig.suptitle("Isolation")
    else:
        fig, axes = plt.subplots(len(report.scenarios), 1, figsize=(10, 4 * len(report.scenarios)),
                                 squeeze=False)
        for ax, s in zip(axes[:, 0], report.scenarios, strict=True):
            mins = [m.minute for m in s.minutes]
            ax.plot(mins, [m.arrivals_rps for m in s.minutes], label="arrivals/s")
            ax.plot(mins, [10 * m.serving for m in s.minutes], label="serving replicas x 10")
            ax.plot(mins, [m.peak_queue for m in s.minutes], label="peak queue")
            twin = ax.twinx()
            twin.plot(mins, [m.ttft_p95_s for m in s.minutes], color="red", label="p95 TTFT (s)")
            twin.axhline(report.ttft_target_s, color="red", linestyle="--", linewidth=1)
            twin.set_ylabel("p95 TTFT (s)")
            ax.set_xlabel("minute")
            ax.set_title(s.name)
            ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _canary(plt: Any, report: CanaryReport) -> Any:
    """p95 TTFT, error rate and mean output of both versions at each check, the stage percent."""
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    ts = [c.t_s for c in report.checks]
    def error_pct(m: VersionMetrics) -> float | None:
        return None if m.error_rate is None else 100 * m.error_rate

    panels: list[tuple[str, Callable[[VersionMetrics], float | None]]] = [
        ("p95 TTFT (s)", lambda m: m.ttft_p95_s), ("error rate (%)", error_pct),
        ("mean output tokens", lambda m: m.output_tokens_mean)]
    for ax, (title, get) in zip(axes, panels, strict=True):
        ax.plot(ts, [get(c.live) for c in report.checks], marker="o", label="live")
        ax.plot(ts, [get(c.canary) for c in report.checks], marker="o", label="canary")
        twin = ax.twinx()
        twin.step(ts, [c.percent for c in report.checks], color="grey", where="post")
        twin.set_ylabel("canary %")
        if report.decided_s is not None:
            ax.axvline(report.decided_s, color="red" if report.outcome == "rolled_back" else "green")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("s")
        ax.legend(fontsize=8)
    fig.suptitle(f"Canary {report.canary} ({report.fault}): {report.outcome}")
    return fig


def _failover(plt: Any, report: FailoverReport) -> Any:
    """Per minute from the loss: errors, interactive TTFT, survivor hit rate and replicas."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4))
    mins = [m.minute for m in report.minutes]
    left.bar(mins, [m.errors for m in report.minutes], color="#cc6633", label="failed attempts")
    left.bar(mins, [m.batch_delayed for m in report.minutes], color="#999999", alpha=0.7,
             label="batch delayed")
    twin = left.twinx()
    twin.plot(mins, [m.interactive_p95_s for m in report.minutes], color="red", marker="o",
              label="interactive p95 TTFT (s)")
    twin.set_ylabel("interactive p95 TTFT (s)")
    left.legend(loc="upper right", fontsize=8)
    left.set_xlabel("minute from the loss")
    right.plot(mins, [100 * m.survivor_hit_rate for m in report.minutes], marker="o",
               label="survivor prefix hit %")
    right.plot(mins, [10 * m.survivor_serving for m in report.minutes], label="serving x 10")
    right.legend(fontsize=8)
    right.set_xlabel("minute from the loss")
    fig.suptitle(f"Failover: {report.lost} lost, errors stop after "
                 f"{report.errors_stop_after_s or 0:.0f} s")
    return fig

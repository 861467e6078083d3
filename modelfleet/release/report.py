"""The gate's report as text, and the config patch that hands a measured capacity to the
autoscaler (pure).

The autoscaler's thresholds (``autoscale.policy.tokens_threshold`` / ``queue_threshold``) and
the IaC's ScaledObjects read a version's ``capacity`` from the declared config, the reviewed
desired state; ``modelfleet gate --save`` stores the measurement in the registry and prints the
``capacity:`` line to put in ``config/models.yaml`` with a config PR, with the thresholds it
will give.
"""

from __future__ import annotations

from typing import Any

from autoscale.policy import queue_threshold, tokens_threshold
from modelfleet.config.autoscaling import AutoscalePolicy
from modelfleet.config.schema import Capacity, Version


def measured_capacity(cap: dict[str, Any]) -> Capacity:
    """A load-test capacity (tokens/s, tokens, streams per replica) as the config's record."""
    return Capacity(output_tokens_per_s=round(float(cap["output_tokens_per_s"]), 1),
                    tokens_in_flight=int(cap["tokens_in_flight"]), streams=int(cap["streams"]),
                    measured=True)


def config_patch(version: Version | None, model: str, name: str, cap: dict[str, Any],
                 policy: AutoscalePolicy | None = None) -> dict[str, Any]:
    """The ``capacity:`` line for ``model@name`` in ``config/models.yaml`` and, when the version
    is declared, the autoscaler thresholds per replica it gives (tokens, requests)."""
    capacity = measured_capacity(cap)
    c = capacity.model_dump()
    line = (f"capacity: {{output_tokens_per_s: {c['output_tokens_per_s']:g}, "
            f"tokens_in_flight: {c['tokens_in_flight']}, streams: {c['streams']}, measured: true}}")
    out: dict[str, Any] = {"file": "config/models.yaml", "version": f"{model}@{name}", "capacity_line": line}
    if version is not None:
        patched = version.model_copy(update={"capacity": capacity})
        p = policy or AutoscalePolicy()
        out["thresholds"] = {"tokens_in_flight": tokens_threshold(patched, p),
                             "queue_depth": queue_threshold(patched, p),
                             "was_tokens_in_flight": tokens_threshold(version, p),
                             "was_queue_depth": queue_threshold(version, p)}
    return out


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def render_quality(q: dict[str, Any]) -> list[str]:
    """Scores per category of both versions (task metrics, then the judge's)."""
    lines = [f"quality: {q['new_version']} vs {q['reference_version']} on {q['items']} prompts"]
    if pc := q.get("precision_change"):
        lines.append(f"  precision change: {pc['reference']} -> {pc['new']} (same model): "
                     "the scores compare the two precisions")
    lines.append(f"  {'CATEGORY':<12} {'NEW':>8} {'REFERENCE':>10}")
    lines += [f"  {cat:<12} {_pct(new):>8} {_pct(q['reference'].get(cat)):>10}"
              for cat, new in q["new"].items()]
    lines += [f"  drop: {d}" for d in q["drops"]]
    if j := q.get("judge"):
        means = j["mean_1_to_10"]
        lines.append(f"judge: {j['model']}, mean score 1..10")
        lines.append(f"  {'CATEGORY':<12} {'NEW':>8} {'REFERENCE':>10}")
        for cat in j["new"]:
            n, r = means[q["new_version"]].get(cat), means[q["reference_version"]].get(cat)
            lines.append(f"  {cat:<12} {'-' if n is None else f'{n:.1f}':>8} "
                         f"{'-' if r is None else f'{r:.1f}':>10}")
        bad = j["unparseable"]
        lines.append(f"  unparseable judge replies: {bad[q['new_version']]} new, "
                     f"{bad[q['reference_version']]} reference")
        lines += [f"  judge drop: {d}" for d in j["drops"]]
    return lines


def render_load(lt: dict[str, Any]) -> list[str]:
    """Steps of the load test and the capacity."""
    lines = []
    if lt.get("kind") == "platform":
        lines.append(f"load test through the platform ({lt['arrivals']} arrivals, "
                     f"{lt['output_tokens']} output tokens each, time scale {lt['time_scale']:g}):")
        lines.append(f"  {'RATE/s':>7} {'REQ':>5} {'p95 TTFT':>9} {'STREAM p50':>10} {'SLOW':>5} "
                     f"{'OUT tok/s':>9} {'IN FLIGHT':>9} {'STREAMS':>7}")
        for s in lt["steps"]:
            lines.append(f"  {s['rate_per_s']:>7g} {s['requests']:>5} {s['ttft_p95_s']:>8.2f}s "
                         f"{s['stream_tokens_per_s_p50']:>10.1f} {s['slow_share']:>5.0%} "
                         f"{s['output_tokens_per_s']:>9,.0f} {s['tokens_in_flight']:>9,} "
                         f"{s['streams']:>7}" + ("" if s["passed"] else "  FAIL: " + "; ".join(s["why"])))
    cap = lt["capacity"]
    lines.append("capacity: none of the load steps met the targets" if cap is None else
                 f"capacity: {cap['output_tokens_per_s']:,.0f} output tokens/s per replica at "
                 f"{cap['streams']} streams, {cap['tokens_in_flight']:,} tokens in flight "
                 f"(p95 TTFT {cap['ttft_p95_s']:.2f} s)")
    return lines


def render(report: dict[str, Any]) -> str:
    """The whole report as text."""
    lines = render_quality(report["quality"])
    if "load_test" in report:
        lines += render_load(report["load_test"])
    if patch := report.get("config_patch"):
        lines.append(f"autoscaler: put in {patch['file']} under {patch['version']} (config PR):")
        lines.append(f"  {patch['capacity_line']}")
        if t := patch.get("thresholds"):
            lines.append(f"  -> scale up at {t['tokens_in_flight']:,} tokens in flight per replica "
                         f"(was {t['was_tokens_in_flight']:,}), queue {t['queue_depth']} "
                         f"(was {t['was_queue_depth']})")
    if saved := report.get("saved"):
        lines.append(f"saved with {report['version']} in the registry: eval report"
                     + (", capacity" if saved.get("capacity") else " (no capacity)"))
    lines.append("gate: PASSED" if report["passed"] else "gate: FAILED")
    return "\n".join(lines)

"""``modelfleet gate MODEL@VERSION --eval FILE``: the quality eval and the load test of a version.

Quality: every prompt of the eval set (JSONL, :mod:`modelfleet.gate_eval`) is sent through the
platform's OpenAI API (``--api``, a team key) to ``MODEL@VERSION`` and to the reference version
(``--against``, default the model's live version), at temperature 0; each answer is scored by
its item's task metric; scores are reported per category (reasoning, maths, long outputs, ...)
and the gate fails when any category drops by more than ``--max-drop``. For a precision change,
name the other precision's version with ``--against``.

Load (``--load-test``): the closed loop of the replica engine with the version's parameters
(:mod:`modelfleet.gate_load`). With ``--save`` both results are saved with the version in the
registry through the admin API. Exit 0 when the gate passes, 1 when it fails, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from modelfleet.admin_client import (
    AdminClient,
    AdminError,
    add_connection_args,
    detail,
    local_facts,
    resolve_token,
    resolve_url,
)
from modelfleet.config import ConfigError, load_config
from modelfleet.gate_eval import EvalItem, EvalSetError, compare, load_eval_set, passed_map, scores
from modelfleet.gate_load import engine_runner, find_capacity

Ask = Callable[[str, EvalItem], str]


def register(sub: Any) -> None:
    """Add the ``gate`` sub-command to ``sub`` (an argparse sub-parsers object)."""
    p: argparse.ArgumentParser = sub.add_parser(
        "gate", help="quality eval and load test of a version (saved with it in the registry)",
        description="Score MODEL@VERSION and the reference version on the same eval set "
        "through the platform, per category; optionally load-test it; optionally save both "
        "with the version.")
    p.add_argument("target", metavar="MODEL@VERSION")
    p.add_argument("--eval", type=Path, required=True, help="eval set (JSONL)")
    p.add_argument("--against", default=None, help="reference version (default: the live one)")
    p.add_argument("--api", default=None, help="OpenAI base URL (default: base_url of .modelfleet/local.json)")
    p.add_argument("--key", default=None, help="team key (default: the first dev key of .modelfleet/local.json)")
    p.add_argument("--config", default="config", help="config directory (for the live version and the load test)")
    p.add_argument("--max-drop", type=float, default=0.02, help="largest score drop per category (share)")
    p.add_argument("--load-test", action="store_true", help="run the load test")
    p.add_argument("--save", action="store_true", help="save the results with the version (admin API)")
    add_connection_args(p)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(run=run)


def http_ask(api: str, key: str, timeout_s: float = 120.0) -> Ask:
    """``ask(model, item)``: one non-streamed chat completion through the platform."""
    client = httpx.Client(timeout=timeout_s, headers={"Authorization": f"Bearer {key}"})

    def ask(model: str, item: EvalItem) -> str:
        body = {"model": model, "messages": list(item.messages), "max_tokens": item.max_tokens,
                "temperature": 0}
        r = client.post(f"{api.rstrip('/')}/chat/completions", json=body)
        r.raise_for_status()
        return str(r.json()["choices"][0]["message"]["content"] or "")

    return ask


def quality(items: list[EvalItem], ask: Ask, new: str, reference: str,
            max_drop: float) -> dict[str, Any]:
    """Answers of both versions scored per category and compared (plain data)."""
    answers = {v: {i.id: ask(v, i) for i in items} for v in (new, reference)}
    got = {v: scores(items, passed_map(items, answers[v])) for v in (new, reference)}
    verdict = compare(got[new], got[reference], max_drop)
    return {"new_version": new, "reference_version": reference, "items": len(items),
            **verdict.as_dict(),
            "counts": {v: {c: [s.passed, s.total] for c, s in got[v].items()} for v in got}}


def run(args: argparse.Namespace) -> int:
    """Run the gate and print its report."""
    model, _, version = args.target.partition("@")
    try:
        config = load_config(args.config).config
        items = load_eval_set(args.eval)
    except (ConfigError, EvalSetError, OSError) as exc:
        print(f"modelfleet gate: {exc}", file=sys.stderr)
        return 2
    declared, m = config.version(model, version), config.model(model)
    facts = local_facts()
    api, key = args.api or facts.get("base_url"), args.key or next(iter(facts.get("keys", {}).values()), None)
    if m is None or not version or not api or not key:
        print("modelfleet gate: need MODEL@VERSION of a declared model, --api and --key", file=sys.stderr)
        return 2
    reference = f"{model}@{args.against or m.live}"
    try:
        report: dict[str, Any] = {"version": args.target, "quality": quality(
            items, http_ask(api, key), args.target, reference, args.max_drop)}
    except httpx.HTTPError as exc:
        print(f"modelfleet gate: the platform did not answer: {exc}", file=sys.stderr)
        return 2
    passed = bool(report["quality"]["passed"])
    if args.load_test:
        if declared is None:
            print(f"modelfleet gate: {args.target} is not in {args.config}: no engine parameters "
                  "for the load test", file=sys.stderr)
            return 2
        found = find_capacity(engine_runner(declared))
        report["load_test"] = found.as_dict()
        passed = passed and found.capacity is not None
    report["passed"] = passed
    if args.save and (code := save(args, model, version, report)) is not None:
        return code
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0 if passed else 1


def save(args: argparse.Namespace, model: str, version: str, report: dict[str, Any]) -> int | None:
    """Save the report with the version; an exit code on failure, else None."""
    cap = (report.get("load_test") or {}).get("capacity")
    body = {"eval_report": report["quality"], "load_test": None if cap is None else {
        "output_tokens_per_s": cap["output_tokens_per_s"],
        "tokens_in_flight": cap["tokens_in_flight"], "streams": cap["streams"]}}
    try:
        client = AdminClient(resolve_url(args.url), resolve_token(args.token_file))
        status, answer = client.call("PUT", f"/admin/models/{model}/versions/{version}/gate", body)
    except (AdminError, OSError) as exc:
        print(f"modelfleet gate: not saved: {exc}", file=sys.stderr)
        return 2
    if status != 200:
        print(f"modelfleet gate: not saved: {status} {detail(answer)}", file=sys.stderr)
        return 2
    return None


def render(report: dict[str, Any]) -> str:
    """The report as text: one line per category, then the capacity."""
    q = report["quality"]
    lines = [f"quality: {q['new_version']} vs {q['reference_version']} on {q['items']} prompts",
             f"  {'CATEGORY':<12} {'NEW':>8} {'REFERENCE':>10}"]
    for cat, new in q["new"].items():
        ref = q["reference"].get(cat)
        lines.append(f"  {cat:<12} {'-' if new is None else f'{new:.1%}':>8} "
                     f"{'-' if ref is None else f'{ref:.1%}':>10}")
    lines += [f"  drop: {d}" for d in q["drops"]]
    if "load_test" in report:
        cap = report["load_test"]["capacity"]
        lines.append("capacity: none of the load steps met the targets" if cap is None else
                     f"capacity: {cap['output_tokens_per_s']:,.0f} output tokens/s per replica at "
                     f"{cap['streams']} streams, {cap['tokens_in_flight']:,} tokens in flight "
                     f"(p95 TTFT {cap['ttft_p95_s']:.2f} s, {cap['stream_tokens_per_s']:.0f} tokens/s per stream)")
    lines.append("gate: PASSED" if report["passed"] else "gate: FAILED")
    return "\n".join(lines)

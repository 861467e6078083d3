"""``modelfleet gate MODEL@VERSION --eval FILE``: the quality eval and the load test of a version.

Quality (:mod:`modelfleet.release.quality`): every prompt of the eval set is sent through the
platform's OpenAI API (``--api``, a team ``--key``) to ``MODEL@VERSION`` and to the reference
version (``--against``, default the model's live version) at temperature 0, scored per category
by the items' task metrics and, with ``--judge MODEL[@V]``, by an LLM judge served by the
platform; the gate fails when a category drops by more than ``--max-drop``.

Load (``--load-test``): through the platform by default, an open loop at a fixed arrival rate
raised step by step (:mod:`modelfleet.release.platform_load`, :mod:`modelfleet.release.rate`), stopping at
the first step that misses the targets; ``--engine`` runs the replica engine's closed loop
instead (:mod:`modelfleet.release.load`). With
``--save`` both results are saved with the version through the admin API, and the report gives
the config line that makes the measured capacity the autoscaler's. Exit 0 when the gate passes,
1 when it fails, 2 on bad input or an unreachable platform.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import httpx

from modelfleet.cli.admin_client import (
    AdminClient,
    AdminError,
    add_connection_args,
    detail,
    local_facts,
    resolve_token,
    resolve_url,
)
from modelfleet.config import ConfigError, PlatformConfig, load_config
from modelfleet.release.eval import EvalSetError, load_eval_set
from modelfleet.release.load import engine_runner, find_capacity
from modelfleet.release.platform_load import PlatformLoad, platform_runner
from modelfleet.release.quality import Chat, http_chat, quality
from modelfleet.release.rate import RateStep, schedule, search
from modelfleet.release.report import config_patch, render


def register(sub: Any) -> None:
    """Add the ``gate`` sub-command to ``sub`` (an argparse sub-parsers object)."""
    p: argparse.ArgumentParser = sub.add_parser(
        "gate", help="quality eval and load test of a version (saved with it in the registry)",
        description="Score MODEL@VERSION and the reference version on the same eval set "
        "through the platform, per category, by task metrics and optionally an LLM judge; "
        "optionally load-test it at rising arrival rates; optionally save both with the version.")
    p.add_argument("target", metavar="MODEL@VERSION")
    p.add_argument("--eval", type=Path, required=True, help="eval set (JSONL)")
    p.add_argument("--against", default=None, help="reference version (default: the live one)")
    p.add_argument("--api", default=None, help="OpenAI base URL (default: base_url of .modelfleet/local.json)")
    p.add_argument("--key", default=None, help="team key (default: the first dev key of .modelfleet/local.json)")
    p.add_argument("--config", default="config", help="config directory (live version, precisions, engine load test)")
    p.add_argument("--max-drop", type=float, default=0.02, help="largest score drop per category (share)")
    p.add_argument("--judge", default=None, metavar="MODEL[@V]", help="LLM judge served by the platform")
    g = p.add_argument_group("load test")
    g.add_argument("--load-test", action="store_true", help="run the load test")
    g.add_argument("--engine", action="store_true", help="engine-only closed loop instead of the platform")
    g.add_argument("--rate-start", type=float, default=1.0, help="first arrival rate, requests per s")
    g.add_argument("--rate-factor", type=float, default=1.5, help="rate multiplier per step")
    g.add_argument("--steps", type=int, default=10, help="most steps")
    g.add_argument("--step-s", type=float, default=30.0, help="seconds per step (model time)")
    g.add_argument("--output-tokens", type=int, default=300, help="tokens per answer (ignore_eos)")
    g.add_argument("--arrivals", choices=("poisson", "fixed"), default="poisson")
    g.add_argument("--seed", type=int, default=1, help="seed of the Poisson arrivals")
    g.add_argument("--prompts", type=Path, default=None, help="prompts to replay, JSONL (default: the eval set's)")
    g.add_argument("--time-scale", type=float, default=None,
                   help="replicas' model s per wall s (default: the local stack config's)")
    p.add_argument("--save", action="store_true", help="save the results with the version (admin API)")
    add_connection_args(p)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(run=run)


def prompts_of(path: Path) -> list[list[dict[str, str]]]:
    """Chat messages of every line of a JSONL file with ``messages`` or ``prompt``."""
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                d = json.loads(line)
                out.append([{"role": str(m["role"]), "content": str(m["content"])} for m in d["messages"]]
                           if "messages" in d else [{"role": "user", "content": str(d["prompt"])}])
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{path}:{n}: {exc.__class__.__name__}: {exc}") from None
    if not out:
        raise ValueError(f"{path}: no prompts")
    return out


def _progress(step: RateStep) -> None:
    print(f"gate: {step.rate_per_s:g} req/s: p95 TTFT {step.ttft_p95_s:.2f} s, "
          f"{step.output_tokens_per_s:,.0f} tokens/s, {step.tokens_in_flight:,} in flight"
          + ("" if step.passed else " FAIL: " + "; ".join(step.why)), file=sys.stderr, flush=True)


def load_test(args: argparse.Namespace, config: PlatformConfig, api: str, key: str,
              facts: dict[str, Any]) -> dict[str, Any]:
    """Run the load test the flags ask for; its report (plain data). Raises ``ValueError``."""
    model, _, version = args.target.partition("@")
    if args.engine:
        declared = config.version(model, version)
        if declared is None:
            raise ValueError(f"{args.target} is not in {args.config}: no engine parameters")
        return {"kind": "engine", **find_capacity(engine_runner(declared)).as_dict()}
    scale = args.time_scale
    if scale is None:  # the local stack's, when the gate talks to it
        local = facts.get("config_dir") and args.api in (None, facts.get("base_url"))
        scale = (float(facts.get("time_scale") or
                       load_config(facts["config_dir"]).config.local.time_scale)
                 if local else 1.0)
    load = PlatformLoad(api, key, args.target, prompts_of(args.prompts or args.eval),
                        resolve_url(args.url), resolve_token(args.token_file),
                        output_tokens=args.output_tokens, step_s=args.step_s, time_scale=scale,
                        poisson=args.arrivals == "poisson", seed=args.seed)
    found = search(platform_runner(load, _progress), schedule(args.rate_start, args.rate_factor, args.steps))
    return {"kind": "platform", "arrivals": args.arrivals, "output_tokens": args.output_tokens,
            "time_scale": scale, "step_s": args.step_s, **found.as_dict()}


def run(args: argparse.Namespace) -> int:
    """Run the gate and print its report."""
    model, _, version = args.target.partition("@")
    try:
        config = load_config(args.config).config
        items = load_eval_set(args.eval)
    except (ConfigError, EvalSetError, OSError) as exc:
        print(f"modelfleet gate: {exc}", file=sys.stderr)
        return 2
    m, facts = config.model(model), local_facts()
    api, key = args.api or facts.get("base_url"), args.key or next(iter(facts.get("keys", {}).values()), None)
    if m is None or not version or not api or not key:
        print("modelfleet gate: need MODEL@VERSION of a declared model, --api and --key", file=sys.stderr)
        return 2
    against = args.against or m.live
    new_v, ref_v = config.version(model, version), config.version(model, against)
    precisions = (new_v.precision, ref_v.precision) if new_v and ref_v else None
    chat: Chat = http_chat(api, key)
    try:
        report: dict[str, Any] = {"version": args.target, "quality": quality(
            items, chat, args.target, f"{model}@{against}", args.max_drop, args.judge, precisions)}
        passed = bool(report["quality"]["passed"])
        if args.load_test:
            report["load_test"] = load_test(args, config, api, key, facts)
            cap = report["load_test"]["capacity"]
            passed = passed and cap is not None
            if cap is not None:
                report["config_patch"] = config_patch(new_v, model, version, cap, config.autoscaling)
    except httpx.HTTPError as exc:
        print(f"modelfleet gate: the platform did not answer: {exc}", file=sys.stderr)
        return 2
    except (ValueError, AdminError, ConfigError, OSError) as exc:
        print(f"modelfleet gate: {exc}", file=sys.stderr)
        return 2
    report["passed"] = passed
    if args.save and (code := save(args, model, version, report)) is not None:
        return code
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0 if passed else 1


def save(args: argparse.Namespace, model: str, version: str, report: dict[str, Any]) -> int | None:
    """Save the report with the version; an exit code on failure, else None."""
    cap = (report.get("load_test") or {}).get("capacity")
    saved = cap is not None and cap["tokens_in_flight"] > 0 and cap["output_tokens_per_s"] > 0
    body = {"eval_report": report["quality"], "load_test": {
        "output_tokens_per_s": cap["output_tokens_per_s"], "tokens_in_flight": cap["tokens_in_flight"],
        "streams": cap["streams"]} if saved and cap else None}
    try:
        client = AdminClient(resolve_url(args.url), resolve_token(args.token_file))
        status, answer = client.call("PUT", f"/admin/models/{model}/versions/{version}/gate", body)
    except (AdminError, OSError) as exc:
        print(f"modelfleet gate: not saved: {exc}", file=sys.stderr)
        return 2
    if status != 200:
        print(f"modelfleet gate: not saved: {status} {detail(answer)}", file=sys.stderr)
        return 2
    report["saved"] = {"eval_report": True, "capacity": saved}
    return None

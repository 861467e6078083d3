"""``modelfleet apply [DIR] --url URL``: push a config directory through the admin API.

The calls are planned from the differences with the running control plane's desired state
(:func:`plan_calls`, pure), in this order: new versions (``POST .../versions``), aliases
(``PUT .../alias``), canary and shadow stages (``PUT .../rollout``), team limits
(``PUT /admin/teams/.../limits``). Pools and removed entries have no admin endpoint: they are
listed as left to the config reload. The first refused call stops the run.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from typing import Any

from modelfleet.cli.admin_client import (
    AdminClient,
    AdminError,
    add_connection_args,
    detail,
    resolve_token,
    resolve_url,
)
from modelfleet.config import ConfigError, PlatformConfig, load_config
from modelfleet.config.desired import desired_data


@dataclass(frozen=True)
class Call:
    """One admin API call and why it is made."""

    method: str
    path: str
    body: dict[str, Any]
    why: str


def _stage_calls(model: str, kind: str, want: dict[str, Any] | None,
                 have: dict[str, Any] | None) -> list[Call]:
    if want == have:
        return []
    path = f"/admin/models/{model}/rollout"
    if want is None:
        assert have is not None
        return [Call("PUT", path, {"version": have["version"], "stage": kind, "percent": 0},
                     f"{model}: end the {kind} of {have['version']}")]
    percent = want["percent"] if kind == "canary" else want["fraction"] * 100
    return [Call("PUT", path, {"version": want["version"], "stage": kind, "percent": percent},
                 f"{model}: {kind} {want['version']} {percent:g}%")]


def plan_calls(config: PlatformConfig, running: dict[str, Any]) -> tuple[list[Call], list[str]]:
    """The calls that make ``running`` (``GET /admin/desired``) serve ``config``, and what no
    admin endpoint can change (left to a config reload)."""
    proposed = desired_data(config)
    calls: list[Call] = []
    left: list[str] = []
    have_versions = running.get("versions", {})
    for v in config.versions:
        if v.key not in have_versions:
            body = v.model_dump(mode="json", exclude={"model", "status"})
            calls.append(Call("POST", f"/admin/models/{v.model}/versions", body,
                              f"register {v.key}"))
    for model, want in proposed["routes"].items():
        have = dict(running.get("routes", {}).get(model) or {})
        if not have:
            left.append(f"model {model} is not served there: merge the config to declare it")
            continue
        if have["live"] != want["live"]:
            calls.append(Call("PUT", f"/admin/models/{model}/alias", {"version": want["live"]},
                              f"{model}: alias -> {want['live']}"))
            for kind in ("canary", "shadow"):  # the alias change ends the new live's stage
                if have.get(kind) and have[kind]["version"] == want["live"]:
                    have[kind] = None
        calls += _stage_calls(model, "canary", want["canary"], have.get("canary"))
        calls += _stage_calls(model, "shadow", want["shadow"], have.get("shadow"))
    have_limits = running.get("limits", {})
    for key, limit in proposed["limits"].items():
        if have_limits.get(key) != limit:
            team, _, model = key.partition("/")
            calls.append(Call("PUT", f"/admin/teams/{team}/limits", {"model": model, **limit},
                              f"{key}: limits"))
    left += [f"limits {k}: removed in the config (no admin endpoint)"
             for k in have_limits if k not in proposed["limits"]]
    have_pools = running.get("pools", {})
    left += [f"pool {k}: {have_pools.get(k)} -> {p} (pools change through the config reload)"
             for k, p in proposed["pools"].items() if have_pools.get(k) != p]
    return calls, left


def register(sub: Any) -> None:
    """Add the ``apply`` sub-command to ``sub`` (an argparse sub-parsers object)."""
    p: argparse.ArgumentParser = sub.add_parser(
        "apply",
        help="push a config directory to a running control plane through the admin API",
        description="Plan the admin calls that make the control plane serve the config in DIR "
        "(new versions, aliases, canary and shadow stages, team limits) and make them in order, "
        "stopping at the first refusal. Needs the admin token.",
    )
    p.add_argument("dir", nargs="?", default="config", help="config directory (default: config)")
    add_connection_args(p)
    p.add_argument("--dry-run", action="store_true", help="print the calls, make none")
    p.add_argument("--json", action="store_true", help="print the calls and answers as JSON")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Apply ``args.dir``; 0 when every call was accepted, 1 on a refusal, 2 when the config
    or the control plane cannot be read."""
    try:
        config = load_config(args.dir).config
        client = AdminClient(resolve_url(args.url), resolve_token(args.token_file))
        calls, left = plan_calls(config, client.desired())
    except (ConfigError, AdminError, OSError) as exc:
        print(f"modelfleet apply: {exc}", file=sys.stderr)
        return 2
    done: list[dict[str, Any]] = []
    code = 0
    for call in calls:
        if args.dry_run:
            done.append({**asdict(call), "status": None})
            continue
        try:
            status, answer = client.call(call.method, call.path, call.body)
        except AdminError as exc:
            print(f"modelfleet apply: {exc}", file=sys.stderr)
            return 2
        done.append({**asdict(call), "status": status, "answer": answer})
        if status >= 400:
            code = 1
            break
    if args.json:
        print(json.dumps({"calls": done, "left_to_config": left}, indent=2))
        return code
    for entry in done:
        mark = "plan" if entry["status"] is None else entry["status"]
        extra = "" if entry["status"] is None or entry["status"] < 400 else f": {detail(entry['answer'])}"
        print(f"[{mark}] {entry['method']} {entry['path']}  {entry['why']}{extra}")
    for line in left:
        print(f"[left] {line}")
    if not calls:
        print("nothing to apply: the control plane serves this config's routes, versions and limits")
    return code

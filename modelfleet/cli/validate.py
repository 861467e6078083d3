"""``modelfleet validate [DIR]``: check a config directory, as a pull request's CI does."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from modelfleet.config import ConfigError, load_config

DEFAULT_CONFIG_DIR = "config"


def register(sub: Any) -> None:
    """Add the ``validate`` sub-command to ``sub`` (an argparse sub-parsers object)."""
    p: argparse.ArgumentParser = sub.add_parser(
        "validate",
        help="check the declared config (every error with its file, line and field path)",
        description="Load every *.yaml in DIR, check each record and the cross-checks "
        "(aliases and pools name declared versions, guaranteed shares sum to at most 1, weights "
        "plus a useful KV cache fit the GPUs, tensor parallelism divides the heads). Exits 1 on "
        "any error; warnings alone exit 0.",
    )
    p.add_argument("dir", nargs="?", default=DEFAULT_CONFIG_DIR, help="config directory (default: config)")
    p.add_argument("--json", action="store_true", help="print findings as JSON")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Validate ``args.dir``; print findings; 0 if there is no error, else 1."""
    try:
        result = load_config(args.dir)
    except ConfigError as exc:
        problems = exc.problems
        if args.json:
            print(json.dumps({"ok": False, "problems": [p.as_dict() for p in problems]}, indent=2))
        else:
            for p in problems:
                print(p, file=sys.stderr)
            n = sum(p.severity == "error" for p in problems)
            print(f"{args.dir}: {n} error(s)", file=sys.stderr)
        return 1
    cfg = result.config
    if args.json:
        print(json.dumps({"ok": True, "problems": [p.as_dict() for p in result.warnings]}, indent=2))
        return 0
    for w in result.warnings:
        print(w, file=sys.stderr)
    print(
        f"{args.dir}: ok: {len(cfg.models)} models, {len(cfg.versions)} versions, "
        f"{len(cfg.pools)} pools, {len(cfg.teams)} teams"
        + (f", {len(result.warnings)} warning(s)" if result.warnings else "")
    )
    return 0

"""``modelfleet diff [--against URL|DIR] [DIR]``: what the config in DIR would change.

Against a running control plane (``GET /admin/desired``) or another config directory, in one
table: routes and weights (alias, canary share, shadow copy), versions, pools and team limits.
A value the running control plane holds as an override (an admin change, or a rollback by the
rollout controller) is marked in the NOTE column until the config acknowledges it.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from modelfleet.cli.admin_client import (
    AdminClient,
    AdminError,
    add_connection_args,
    resolve_token,
    resolve_url,
)
from modelfleet.config import ConfigError, load_config
from modelfleet.config.desired import DiffRow, desired_data, diff, render_table


def register(sub: Any) -> None:
    """Add the ``diff`` sub-command to ``sub`` (an argparse sub-parsers object)."""
    p: argparse.ArgumentParser = sub.add_parser(
        "diff",
        help="show what a config directory would change on a control plane or versus another config",
        description="Compare the config in DIR with a running control plane (URL: its "
        "GET /admin/desired) or another config directory: routes and weights, versions, pools, "
        "team limits. Overrides held by the control plane (admin changes, controller rollbacks) "
        "are noted until the config acknowledges them.",
    )
    p.add_argument("dir", nargs="?", default="config", help="config directory (default: config)")
    p.add_argument("--against", default=None,
                   help="control plane URL or config directory (default: the local stack's admin_url)")
    add_connection_args(p, url_flag=False)
    p.add_argument("--json", action="store_true", help="print the differences as JSON")
    p.add_argument("--exit-code", action="store_true", help="exit 1 when there are differences")
    p.set_defaults(run=run)


def running_state(against: str | None, token_file: Any) -> tuple[str, dict[str, Any], list[Any]]:
    """The state to compare with: a label, its desired data and its overrides."""
    if against is not None and not against.startswith(("http://", "https://")):
        return against, desired_data(load_config(against).config), []
    client = AdminClient(resolve_url(against), resolve_token(token_file))
    data = client.desired()
    return client.url, data, list(data.get("overrides", []))


def compute(args: argparse.Namespace) -> tuple[str, list[DiffRow]]:
    """The label of what DIR is compared with, and the differences; raises ConfigError or
    AdminError."""
    proposed = desired_data(load_config(args.dir).config)
    label, running, overrides = running_state(args.against, args.token_file)
    return label, diff(running, proposed, overrides)


def run(args: argparse.Namespace) -> int:
    """Print the differences; 0 (1 with ``--exit-code`` when any), 2 when either side cannot
    be read."""
    try:
        label, rows = compute(args)
    except ConfigError as exc:
        print(f"modelfleet diff: {exc}", file=sys.stderr)
        return 2
    except (AdminError, OSError) as exc:
        print(f"modelfleet diff: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"dir": args.dir, "against": label,
                          "differences": [r.as_dict() for r in rows]}, indent=2))
    elif not rows:
        print(f"{args.dir} vs {label}: no differences")
    else:
        print(f"{args.dir} vs {label}: {len(rows)} difference(s)\n")
        print(render_table(rows, "RUNNING" if label.startswith("http") else "AGAINST", "THIS CONFIG"))
    return 1 if rows and args.exit_code else 0

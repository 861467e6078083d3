"""``modelfleet keys add TEAM``: make a team key, print it once, store only its hash."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from modelfleet.config.edit import EditError, add_key_hash
from modelfleet.config.keyhash import hash_key
from modelfleet.config.keys import generate_key


def register(sub: Any) -> None:
    """Add the ``keys`` sub-command to ``sub``."""
    p: argparse.ArgumentParser = sub.add_parser(
        "keys", help="team keys: add one (printed once; only its hash is stored)",
        description="Team keys live in the config only as hashes. `keys add TEAM` makes a new "
        "key, writes its hash into the team's key_hashes (a change to review and merge like any "
        "other config change) and prints the key once: store it in the team's secret store.")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    add = actions.add_parser("add", help="add a new key to TEAM")
    add.add_argument("team", help="team name, as in the config")
    add.add_argument("--config", type=Path, default=Path("config"), help="config directory (default: config)")
    add.set_defaults(run=run_add)


def run_add(args: argparse.Namespace) -> int:
    """Generate a key for ``args.team``, store its hash, print the key."""
    key = generate_key()
    try:
        path = add_key_hash(args.config, args.team, hash_key(key))
    except EditError as exc:
        print(f"modelfleet keys add: {exc}", file=sys.stderr)
        return 1
    print(f"added a key for team {args.team}; its hash is in {path}. The key, shown only this once:",
          file=sys.stderr)
    print(key)
    return 0

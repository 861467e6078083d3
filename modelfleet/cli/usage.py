"""``modelfleet usage``: the metering table (one row per team, model, version, region, tier, minute)."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from gateway_ext.metering.meter import COUNTERS, UsageRow
from gateway_ext.metering.store import UsageStore
from modelfleet.local.state import read_state, state_path

DB_ENV = "MODELFLEET_USAGE_DB_URL"
_AGO = re.compile(r"^(\d+)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def register(sub: Any) -> None:
    """Add the ``usage`` sub-command to ``sub``."""
    p: argparse.ArgumentParser = sub.add_parser(
        "usage", help="tokens used, requests, 429s and sheds per team and model, from metering",
        description=f"Reads the usage database: --db, else ${DB_ENV}, else the local stack's "
        "(usage_db_url in .modelfleet/local.json).")
    p.add_argument("--db", default=None, help="SQLAlchemy URL of the usage database")
    p.add_argument("--team", default=None, help="only this team")
    p.add_argument("--model", default=None, help="only this model")
    p.add_argument("--tier", default=None, choices=["interactive", "standard", "batch"],
                   help="only this priority tier")
    p.add_argument("--since", default=None, help="only minutes since: 30m, 2h, 7d, or an ISO time")
    p.add_argument("--by-minute", action="store_true", help="one line per minute instead of totals")
    p.add_argument("--json", action="store_true", help="print rows as JSON")
    p.set_defaults(run=run)


def parse_since(text: str, now_s: float) -> float:
    """Seconds since the epoch for ``--since`` (``30m``/``2h``/``7d`` ago, or an ISO-8601 time)."""
    match = _AGO.match(text)
    if match:
        return now_s - int(match.group(1)) * _UNIT_S[match.group(2)]
    moment = datetime.fromisoformat(text)
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def totals(rows: list[UsageRow], by_minute: bool) -> list[dict[str, Any]]:
    """Rows summed per (team, model, version, region, tier), or per minute too when
    ``by_minute``."""
    sums: dict[tuple[Any, ...], dict[str, int]] = defaultdict(lambda: dict.fromkeys(COUNTERS, 0))
    for row in rows:
        k = row.key
        key: tuple[Any, ...] = (k.team, k.model, k.version, k.region, k.tier) + (
            (k.minute,) if by_minute else ())
        for name in COUNTERS:
            sums[key][name] += getattr(row.counts, name)
    out = []
    for key, counts in sorted(sums.items()):
        entry: dict[str, Any] = dict(zip(("team", "model", "version", "region", "tier"), key[:5],
                                         strict=True))
        if by_minute:
            entry["minute"] = datetime.fromtimestamp(key[5], UTC).strftime("%Y-%m-%d %H:%M")
        out.append({**entry, **counts})
    return out


def render(entries: list[dict[str, Any]]) -> str:
    """The human table."""
    cols = ["team", "model", "version", "region", "tier", *(["minute"] if entries and "minute" in entries[0] else []),
            *COUNTERS]
    widths = {c: max(len(c), *(len(f"{e[c]:,}" if isinstance(e[c], int) else str(e[c])) for e in entries))
              for c in cols}
    def cell(c: str, v: Any) -> str:
        text = f"{v:,}" if isinstance(v, int) else str(v)
        return text.rjust(widths[c]) if isinstance(v, int) else text.ljust(widths[c])
    lines = ["  ".join(c.upper().ljust(widths[c]) for c in cols)]
    lines += ["  ".join(cell(c, e[c]) for c in cols) for e in entries]
    return "\n".join(lines)


def database_url(args: argparse.Namespace) -> str | None:
    """Where to read: --db, the environment, or the local stack's facts."""
    if args.db:
        return str(args.db)
    if os.environ.get(DB_ENV):
        return os.environ[DB_ENV]
    facts = read_state(state_path(Path(".")))
    return str(facts["usage_db_url"]) if facts and facts.get("usage_db_url") else None


def run(args: argparse.Namespace) -> int:
    """Print the usage table."""
    url = database_url(args)
    if url is None:
        print(f"modelfleet usage: no database: pass --db URL or set {DB_ENV}", file=sys.stderr)
        return 1
    since = parse_since(args.since, time.time()) if args.since else None
    store = UsageStore(url)
    try:
        rows = store.rows(team=args.team, model=args.model, since_s=since, tier=args.tier)
    except SQLAlchemyError as exc:
        print(f"modelfleet usage: cannot read {url}: {exc.__class__.__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        store.dispose()
    entries = totals(rows, args.by_minute)
    if args.json:
        print(json.dumps(entries, indent=2))
    elif entries:
        print(render(entries))
    else:
        print("no usage recorded for this selection")
    return 0

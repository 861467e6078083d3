"""``.modelfleet/autoscale.json``, written by ``modelfleet up --autoscale`` after every sync, as
``modelfleet status`` reads and prints it (pure apart from the file read)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from modelfleet.local.state import read_state

AUTOSCALE_FILE = "autoscale.json"


def read_autoscale(state_dir: Path) -> dict[str, Any] | None:
    """The last ``autoscale.json`` a loop wrote under ``state_dir``, or None."""
    return read_state(state_dir / AUTOSCALE_FILE)


def render_autoscale(data: dict[str, Any]) -> list[str]:
    """The status lines: per pool serving, starting, draining, desired, bounds and why; each
    trigger's value against its target per replica."""
    lines = [f"AUTOSCALE (time scale {data.get('time_scale', 1):g}, sync every "
             f"{data.get('sync_period_s', 0):.2f} s, model time {data.get('model_time_s', 0):,.0f} s)",
             "POOL               SERVING  STARTING  DRAINING  DESIRED  MIN..MAX  WHY"]
    for p in data.get("pools", []):
        lines.append(f"{p['pool']:<18} {p['current']:<8} {p['starting']:<9} {p['draining']:<9} "
                     f"{p['desired']:<8} {p['min']}..{p['max']:<6} {p['why']}")
        for t in p.get("triggers", []):
            value = "failed" if t["value"] is None else f"{t['value']:,.0f}"
            proposal = "-" if t["proposal"] is None else t["proposal"]
            lines.append(f"  {t['trigger']:<17} value {value:<10} target {t['target']:,.0f}/replica"
                         f"  -> {proposal}")
    for key, why in sorted(data.get("not_autoscaled", {}).items()):
        lines.append(f"{key:<18} not autoscaled: {why}")
    return lines

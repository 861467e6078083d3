"""``.modelfleet/local.json``: the connection facts of a running local stack, for scripts."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

STATE_DIR = ".modelfleet"
STATE_FILE = "local.json"


def state_path(root: str | Path = ".") -> Path:
    """Where ``modelfleet up`` started from ``root`` writes its facts."""
    return Path(root) / STATE_DIR / STATE_FILE


def write_state(path: Path, facts: dict[str, Any]) -> None:
    """Write ``facts`` atomically (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(facts, indent=2) + "\n")
    os.replace(tmp, path)


def read_state(path: Path) -> dict[str, Any] | None:
    """The facts of a local stack, or None if none was started from here."""
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data

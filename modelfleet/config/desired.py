"""The desired state as plain data, and what one desired state would change in another (pure).

Both ``modelfleet diff`` and the control plane's ``GET /admin/desired`` use
:func:`desired_data`, so a config directory and a running control plane compare field by
field. Sections: ``routes`` (alias, canary weight, shadow copy per model), ``versions``,
``pools`` and ``limits``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from modelfleet.config import PlatformConfig

FORMAT = 1
VERSION_FIELDS = ("status", "weights_uri", "weights_hash", "tokenizer_hash", "chat_template_hash",
                  "precision", "gpu_type", "gpus_per_replica", "engine", "engine_config",
                  "architecture", "capacity")
OVERRIDE_PLACES = {"live": ("routes", "weights"), "canary": ("routes", "weights"),
                   "shadow": ("routes", "shadow"), "limit": ("limits", ""),
                   "version": ("versions", ""), "status": ("versions", "status")}


def desired_data(config: PlatformConfig) -> dict[str, Any]:
    """``config``'s routes, versions, pools and limits as plain data (JSON-ready)."""
    return {
        "format": FORMAT,
        "routes": {m.name: {"live": m.live,
                            "canary": m.canary.model_dump() if m.canary else None,
                            "shadow": m.shadow.model_dump() if m.shadow else None}
                   for m in config.models},
        "versions": {v.key: {f: v.model_dump(mode="json")[f] for f in VERSION_FIELDS}
                     for v in config.versions},
        "pools": {f"{p.key}/{p.region}": {"min_replicas": p.min_replicas,
                                          "max_replicas": p.max_replicas}
                  for p in config.pools},
        "limits": {f"{t.name}/{lim.model}": lim.model_dump(mode="json", exclude={"model"})
                   for t in config.teams for lim in t.limits},
    }


@dataclass(frozen=True)
class DiffRow:
    """One difference: ``running`` is the compared-against state, ``proposed`` this config;
    ``note`` says when the running value is an admin or controller override."""

    section: str
    key: str
    field: str
    running: str
    proposed: str
    note: str = ""

    def as_dict(self) -> dict[str, str]:
        """Plain data for ``--json``."""
        return asdict(self)


def weights(route: Mapping[str, Any] | None) -> str:
    """``v13 90% · v14 10%``: the share of conversations each version gets."""
    if route is None:
        return "(no model)"
    canary = route.get("canary")
    if not canary or not canary["percent"]:
        return f"{route['live']} 100%"
    p = float(canary["percent"])
    return f"{route['live']} {100 - p:g}% · {canary['version']} {p:g}%"


def shadow(route: Mapping[str, Any] | None) -> str:
    """``v15 1% copy`` or ``-``."""
    if route is None:
        return "(no model)"
    s = route.get("shadow")
    return f"{s['version']} {float(s['fraction']) * 100:g}% copy" if s else "-"


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list | tuple):
        return ",".join(_fmt(v) for v in value)
    if isinstance(value, dict):
        return " ".join(f"{k}={_fmt(v)}" for k, v in value.items())
    return str(value)


def _fields(section: str, key: str, running: Mapping[str, Any] | None,
            proposed: Mapping[str, Any] | None) -> list[DiffRow]:
    if running is None or proposed is None:
        side = proposed if running is None else running
        assert side is not None
        summary = ", ".join(f"{k} {_fmt(v)}" for k, v in side.items()
                            if k not in ("engine_config", "architecture", "capacity", "weights_uri",
                                         "tokenizer_hash", "chat_template_hash"))
        return [DiffRow(section, key, "(all)", "(absent)" if running is None else summary,
                        "(absent)" if proposed is None else summary)]
    return [DiffRow(section, key, f, _fmt(running.get(f)), _fmt(proposed.get(f)))
            for f in proposed if running.get(f) != proposed.get(f)]


def diff(running: Mapping[str, Any], proposed: Mapping[str, Any],
         overrides: Sequence[Mapping[str, Any]] = ()) -> list[DiffRow]:
    """What ``proposed`` (this config) would change in ``running`` (both from
    :func:`desired_data`), section by section; ``overrides`` (``GET /admin/desired``) annotate
    rows whose running value an admin or the rollout controller set."""
    rows: list[DiffRow] = []
    r_routes, p_routes = running.get("routes", {}), proposed.get("routes", {})
    for model in sorted(set(r_routes) | set(p_routes)):
        a, b = r_routes.get(model), p_routes.get(model)
        for field, show in (("weights", weights), ("shadow", shadow)):
            if show(a) != show(b):
                rows.append(DiffRow("routes", model, field, show(a), show(b)))
    for section in ("versions", "pools", "limits"):
        r, p = running.get(section, {}), proposed.get(section, {})
        for key in sorted(set(r) | set(p)):
            if r.get(key) != p.get(key):
                rows += _fields(section, key, r.get(key), p.get(key))
    notes: dict[tuple[str, str], str] = {}
    for o in overrides:
        section, field = OVERRIDE_PLACES.get(str(o.get("kind")), ("", ""))
        why = f": {o['reason']}" if o.get("reason") else ""
        notes[(section, str(o.get("target")))] = f"override by {o.get('source')}{why}"
        if field:
            notes[(section, f"{o.get('target')}#{field}")] = notes[(section, str(o.get("target")))]
    out = []
    for row in rows:
        note = notes.get((row.section, f"{row.key}#{row.field}")) or notes.get((row.section, row.key), "")
        out.append(DiffRow(row.section, row.key, row.field, row.running, row.proposed, note))
    return out


def render_table(rows: Sequence[DiffRow], running_label: str = "RUNNING",
                 proposed_label: str = "THIS CONFIG") -> str:
    """``rows`` as an aligned text table (one line per row, a header, no trailing spaces)."""
    header = ("SECTION", "KEY", "FIELD", running_label, proposed_label, "NOTE")
    cells = [header, *[(r.section, r.key, r.field, r.running, r.proposed, r.note) for r in rows]]
    widths = [max(len(c[i]) for c in cells) for i in range(len(header))]
    return "\n".join("  ".join(c[i].ljust(widths[i]) for i in range(len(header))).rstrip()
                     for c in cells)

"""``modelfleet status``: the local stack's processes (gateway included), versions, the gateway's
health, and Envoy's own view of the replicas."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import httpx

from modelfleet.config import ConfigError, load_config
from modelfleet.local.autoscaler_view import read_autoscale, render_autoscale
from modelfleet.local.processes import pid_alive
from modelfleet.local.state import read_state, state_path


def register(sub: Any) -> None:
    """Add the ``status`` sub-command to ``sub``."""
    p: argparse.ArgumentParser = sub.add_parser(
        "status",
        help="show the local stack: processes, versions, the gateway, and Envoy's view",
        description="Read .modelfleet/local.json, then ask the control plane and Envoy's admin "
        "interface what they hold. Exits 1 when no local stack is running from here.",
    )
    p.add_argument("--json", action="store_true", help="print everything as JSON")
    p.add_argument("--state", type=Path, default=None, help="path of local.json (default: ./.modelfleet/local.json)")
    p.set_defaults(run=run)


def envoy_view(admin_url: str) -> list[dict[str, Any]]:
    """Envoy's clusters and hosts from its admin ``/clusters?format=json``.

    Each entry: ``{"cluster", "hosts": [{"address", "hostname", "health", "rq_active", "rq_total"}]}``.
    """
    data = httpx.get(f"{admin_url}/clusters", params={"format": "json"}, timeout=2.0).json()
    out = []
    for cs in data.get("cluster_statuses", []):
        hosts = []
        for h in cs.get("host_statuses", []):
            sa = h.get("address", {}).get("socket_address", {})
            stats = {s.get("name"): int(s.get("value", 0)) for s in h.get("stats", [])}
            health = h.get("health_status", {})
            state = health.get("eds_health_status", "HEALTHY")
            if any(k.startswith("failed") and v for k, v in health.items()):
                state = "UNHEALTHY"
            hosts.append({
                "address": f"{sa.get('address')}:{sa.get('port_value')}",
                "hostname": h.get("hostname", ""),
                "health": state,
                "rq_active": stats.get("rq_active", 0),
                "rq_total": stats.get("rq_total", 0),
            })
        out.append({"cluster": cs.get("name"), "hosts": hosts})
    return out


def collect(facts: dict[str, Any]) -> dict[str, Any]:
    """Everything ``status`` shows, as plain data; unreachable parts are reported, not raised."""
    report: dict[str, Any] = {"base_url": facts["base_url"], "processes": []}
    for p in facts.get("processes", []):
        report["processes"].append({**p, "alive": pid_alive(int(p["pid"]))})
    try:
        cfg = load_config(facts["config_dir"]).config
        report["models"] = [
            {
                "model": m.name,
                "live": m.live,
                "canary": m.canary.model_dump() if m.canary else None,
                "shadow": m.shadow.model_dump() if m.shadow else None,
            }
            for m in cfg.models
        ]
    except ConfigError as exc:
        report["models_error"] = str(exc)
    cp_url = facts["control_plane"]["http_url"]
    for key, path in (("replicas", "/v1/replicas"), ("xds", "/v1/xds/status")):
        try:
            report[key] = httpx.get(cp_url + path, timeout=2.0).json()
        except (httpx.HTTPError, ValueError) as exc:
            report[f"{key}_error"] = f"control plane unreachable: {exc}"
    gateway = facts.get("gateway")
    if gateway:
        try:
            report["gateway"] = {"url": gateway["url"],
                                 **httpx.get(gateway["url"] + "/health", timeout=2.0).json()}
        except (httpx.HTTPError, ValueError) as exc:
            report["gateway_error"] = f"gateway unreachable: {exc}"
    batch = facts.get("batch")
    if batch:
        try:
            report["batch"] = {"url": batch["url"],
                               **httpx.get(batch["url"] + "/health", timeout=2.0).json()}
        except (httpx.HTTPError, ValueError) as exc:
            report["batch_error"] = f"batch service unreachable: {exc}"
    try:
        report["envoy"] = envoy_view(facts["envoy_admin_url"])
    except (httpx.HTTPError, ValueError) as exc:
        report["envoy_error"] = f"envoy admin unreachable: {exc}"
    return report


def render(report: dict[str, Any]) -> str:
    """The human table of ``report``."""
    lines = [f"API base URL: {report['base_url']}", "", "PROCESS                ROLE           MODEL@VERSION      PORT   PID     ALIVE"]
    for p in report["processes"]:
        lines.append(f"{p['name']:<22} {p['role']:<14} {p.get('model_version', '-'):<18} {p['port']:<6} "
                     f"{p['pid']:<7} {'yes' if p['alive'] else 'NO'}")
    lines += ["", "MODEL        LIVE   CANARY          SHADOW"]
    for m in report.get("models", []):
        canary = f"{m['canary']['version']} {m['canary']['percent']:g}%" if m["canary"] else "-"
        shadow = f"{m['shadow']['version']} {m['shadow']['fraction']:g}" if m["shadow"] else "-"
        lines.append(f"{m['model']:<12} {m['live']:<6} {canary:<15} {shadow}")
    if "gateway" in report:
        g = report["gateway"]
        lines += ["", f"GATEWAY {g['url']}: {g.get('status')}, {g.get('running', 0)} running, "
                      f"{g.get('queued', 0)} queued, bucket store {g.get('bucket_store', '-')}"]
    if "batch" in report:
        b = report["batch"]
        lines += [f"BATCH   {b['url']}: {b.get('status')}, role {b.get('role', '-')} "
                  f"(/v1/batches and /v1/files on the API base URL)"]
    if "envoy" in report:
        lines += ["", "ENVOY CLUSTER      HOST                   REPLICA              HEALTH     ACTIVE  TOTAL"]
        for c in report["envoy"]:
            if not c["cluster"] or "@" not in c["cluster"]:
                continue
            for h in c["hosts"] or [{"address": "(no endpoints)", "hostname": "", "health": "-", "rq_active": 0, "rq_total": 0}]:
                lines.append(f"{c['cluster']:<18} {h['address']:<22} {h['hostname']:<20} {h['health']:<10} "
                             f"{h['rq_active']:<7} {h['rq_total']}")
    if "autoscale" in report:
        lines += ["", *render_autoscale(report["autoscale"])]
    for key in ("models_error", "replicas_error", "xds_error", "gateway_error", "batch_error",
                "envoy_error"):
        if key in report:
            lines.append(f"! {report[key]}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Print the status of the local stack started from this directory."""
    path = args.state or state_path(".")
    facts = read_state(path)
    if facts is None:
        print("modelfleet status: no local stack is running from here (no .modelfleet/local.json)", file=sys.stderr)
        return 1
    report = collect(facts)
    autoscale = read_autoscale(path.parent)
    if autoscale is not None:
        report["autoscale"] = autoscale
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0

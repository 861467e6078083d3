"""The command line of ``python -m envoy_control`` (:mod:`envoy_control.__main__`) and what is
derived from it alone."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from envoy_control.api.deps import TOKEN_ENV


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (see :mod:`envoy_control.__main__`). Ports are TCP ports."""
    p = argparse.ArgumentParser(
        prog="python -m envoy_control", description="modelfleet xDS control plane"
    )
    p.add_argument("--config", required=True, type=Path, help="config directory (config/*.yaml)")
    p.add_argument("--xds-port", required=True, type=int, help="ADS gRPC port")
    p.add_argument("--http-port", required=True, type=int, help="HTTP API port")
    p.add_argument(
        "--listener-port", required=True, type=int, help="Envoy's public API listener port"
    )
    p.add_argument("--host", default="127.0.0.1", help="address the xDS and HTTP servers bind")
    p.add_argument(
        "--listener-host", default=None, help="address of Envoy's listener (default: --host)"
    )
    p.add_argument(
        "--region", default=None, help="endpoint locality (default: the config's local region)"
    )
    p.add_argument(
        "--watch-interval", type=float, default=0.2, help="config poll interval, seconds"
    )
    p.add_argument(
        "--state-file",
        type=Path,
        default=None,
        help="keep the router state in this JSON file (and restore replicas from it at start)",
    )
    p.add_argument(
        "--no-access-log", action="store_true", help="no per-request log lines on Envoy's stdout"
    )
    p.add_argument(
        "--debug", action="store_true", help="enable /v1/debug/* (inject invalid resources)"
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument(
        "--admin-token-file",
        type=Path,
        default=None,
        help=f"file whose first line is the admin token (default: ${TOKEN_ENV})",
    )
    p.add_argument(
        "--registry-url",
        default=None,
        help="SQLAlchemy URL of the registry (default: registry.db beside --state-file, "
        "else in memory)",
    )
    p.add_argument("--registry-table-prefix", default="mf_", help="registry table name prefix")
    p.add_argument(
        "--prometheus-url", default=None, help="Prometheus with the replicas' metrics: "
        "enables the rollout controller"
    )
    p.add_argument("--rollout-interval", type=float, default=5.0, help="controller tick, seconds")
    p.add_argument(
        "--rollout-hold", type=float, default=None,
        help="every stage's hold, seconds (default: the config's rollout.stages)",
    )
    p.add_argument(
        "--guard-window", type=float, default=None,
        help="guard window, seconds (default: the config's rollout.window_s)",
    )
    p.add_argument(
        "--guard-min-requests", type=int, default=None,
        help="finished requests per side to judge (default: the config's rollout.min_requests)",
    )
    return p.parse_args(argv)


def registry_url(opts: argparse.Namespace) -> str:
    """``--registry-url``, else a SQLite file beside ``--state-file``, else in-memory SQLite."""
    if opts.registry_url:
        return str(opts.registry_url)
    if opts.state_file is not None:
        return f"sqlite:///{Path(opts.state_file).resolve().parent / 'registry.db'}"
    return "sqlite://"

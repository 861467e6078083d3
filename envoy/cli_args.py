"""The command line of ``python -m envoy_control`` (:mod:`envoy_control.__main__`), what is
derived from it alone, and :class:`ControlPlaneSettings`: the one setting that is not a flag.

:class:`ControlPlaneSettings` is a pydantic-settings ``BaseSettings``: each field ``name`` comes
from the environment variable ``MODELFLEET_CONTROL_PLANE_<NAME>``, else a secret file of that
same name in the secrets directory (``$MODELFLEET_SECRETS_DIR``, default
``/run/secrets/modelfleet``; names match without regard to case, surrounding whitespace is
dropped; a missing directory is ignored), else the default. The admin token is also read from
its older name ``MODELFLEET_ADMIN_TOKEN`` (variable or file); ``--admin-token-file`` wins over
all of them.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from envoy_control.api.deps import MIN_TOKEN_CHARS, TOKEN_ENV
from pydantic import AliasChoices, Field

from modelfleet.settings import (
    DEFAULT_SECRETS_DIR,
    SECRETS_DIR_ENV,
    ServiceSettings,
    service_config,
)

ENV_PREFIX = "MODELFLEET_CONTROL_PLANE_"
ADMIN_TOKEN_ENV = ENV_PREFIX + "ADMIN_TOKEN"



class ControlPlaneSettings(ServiceSettings):
    """The control plane's settings that are not flags (see the module's docstring)."""

    model_config = service_config(ENV_PREFIX, env_ignore_empty=True, validate_by_name=True,
                                  hide_input_in_errors=True)

    admin_token: str | None = Field(
        default=None, min_length=MIN_TOKEN_CHARS, repr=False,
        validation_alias=AliasChoices(ADMIN_TOKEN_ENV, TOKEN_ENV))
    """The admin API's bearer token (None: admin changes are refused)."""


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
        help=f"file whose first line is the admin token (default: ${ADMIN_TOKEN_ENV} or "
        f"${TOKEN_ENV}, or a secret file of either name in ${SECRETS_DIR_ENV} "
        f"(default {DEFAULT_SECRETS_DIR}))",
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

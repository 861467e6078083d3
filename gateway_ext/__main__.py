"""``python -m gateway_ext``: the ext_authz service Envoy calls before routing any API request.

    python -m gateway_ext --config config --host 127.0.0.1 --port 8090 \\
        [--redis-url redis://127.0.0.1:6379/0] [--usage-db-url sqlite:///usage.db] \\
        [--spool usage-spool.jsonl] [--region us-east-1] [--debug] \\
        [--control-plane-url http://127.0.0.1:8081] [--router-state-file router-state.json]

Every flag, and every other setting, has a ``MODELFLEET_GATEWAY_*`` environment variable and may
come from a secret file of the same name (see ``gateway_ext.settings``); flags win over both.
Exits 2 on an invalid setting or config.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import uvicorn
from pydantic import ValidationError
from pydantic_settings import SettingsError

from gateway_ext.runtime import build_runtime
from gateway_ext.service import create_app
from gateway_ext.settings import Settings
from modelfleet.config import ConfigError
from modelfleet.settings import settings_error


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line; an absent flag leaves the environment's (or the default) value."""
    ap = argparse.ArgumentParser(prog="python -m gateway_ext", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", dest="config_dir", type=Path, help="config directory")
    ap.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    ap.add_argument("--port", type=int, help="TCP port (default 8090)")
    ap.add_argument("--redis-url", help="token buckets in Redis (default: in this process)")
    ap.add_argument("--usage-db-url", help="SQLAlchemy URL of the usage database")
    ap.add_argument("--usage-table-prefix", help="prefix of the usage tables (default mf_)")
    ap.add_argument("--spool", type=Path, help="usage spool file (JSONL)")
    ap.add_argument("--region", help="region on usage rows (default: the config's local region)")
    ap.add_argument("--flush-interval", dest="flush_interval_s", type=float,
                    help="seconds between usage flushes (default 5)")
    ap.add_argument("--debug", action="store_true", default=None,
                    help="serve /v1/debug/* (bucket, pool and routing state)")
    ap.add_argument("--control-plane-url",
                    help="long-poll the control plane's router state (aliases, replicas, loads)")
    ap.add_argument("--router-state-file", type=Path,
                    help="router state to start from when the control plane is down")
    ap.add_argument("--picking", choices=["affinity", "least_tokens", "round_robin"],
                    help="replica picking (default affinity: ring bounded by tokens in flight)")
    ap.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Serve until SIGTERM or SIGINT; flushes usage on the way out."""
    args = parse_args(argv)
    try:
        settings = Settings.from_env(**vars(args))
    except (ValidationError, SettingsError, OSError) as exc:
        print(f"gateway_ext: {settings_error(exc)}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per router-state long poll
    try:
        runtime = build_runtime(settings)
    except ConfigError as exc:
        print(f"gateway_ext: {exc}", file=sys.stderr)
        return 2
    uvicorn.run(create_app(runtime), host=settings.host, port=settings.port,
                log_level="warning", access_log=False, timeout_graceful_shutdown=5)
    return 0


if __name__ == "__main__":
    sys.exit(main())

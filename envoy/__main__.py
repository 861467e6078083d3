"""``python -m envoy_control``: the control-plane process (ADS on gRPC + HTTP API, one asyncio loop).

    python -m envoy_control --config DIR --xds-port P --http-port Q --listener-port L \\
        [--host 127.0.0.1] [--listener-host H] [--state-file PATH] [--debug] [--log-level info]
        [--admin-token-file F] [--registry-url URL] [--prometheus-url URL] [--rollout-hold S]
        [--guard-window S] [--guard-min-requests N]

Stops cleanly on SIGTERM or SIGINT: HTTP first, then the ADS streams (Envoys keep serving the last
configuration they received). With ``--state-file`` the router state is kept in that file
(rewritten atomically when it changes, at most 4 times a second) for gateways that start while
the control plane is down, and read back at start: its replicas are routable again at once.

The admin API needs the admin token: ``--admin-token-file``, else ``ControlPlaneSettings``
(``envoy_control.cli_args``): ``MODELFLEET_CONTROL_PLANE_ADMIN_TOKEN`` or
``MODELFLEET_ADMIN_TOKEN``, as a variable or as a secret file in ``$MODELFLEET_SECRETS_DIR``
(default ``/run/secrets/modelfleet``).
The registry is ``--registry-url`` (default: ``registry.db`` beside ``--state-file``, else an
in-memory SQLite); it is seeded from the config at start. With ``--prometheus-url`` the rollout
controller runs (guard metrics from that Prometheus); its thresholds and stages are the config's
``rollout:`` section (the ``--rollout-hold``/``--guard-*`` flags override them), and rollouts
the registry records as in progress are resumed at start.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Generator, Sequence
from pathlib import Path

import httpx
import uvicorn
from envoy_control.api.deps import read_admin_token
from envoy_control.api.http import create_app
from envoy_control.cli_args import ADMIN_TOKEN_ENV, ControlPlaneSettings, parse_args, registry_url
from envoy_control.registry.store import Registry
from envoy_control.resources.build import ListenerSpec
from envoy_control.rollouts.driver import RolloutDriver
from envoy_control.rollouts.prom import PromGuardReader
from envoy_control.state.plane import ControlPlane
from envoy_control.state.publish import RouterPublisher
from envoy_control.xds.cache import SnapshotCache
from envoy_control.xds.server import start_ads_server
from sqlalchemy.exc import SQLAlchemyError

from modelfleet.config import ConfigError
from modelfleet.contract.router_state import load_router_state
from modelfleet.contract.router_state_types import RouterState, RouterStateError

__all__ = ["main", "parse_args", "registry_url", "run"]

log = logging.getLogger("envoy_control")


class _Server(uvicorn.Server):
    """uvicorn without its own signal handlers: this process owns SIGTERM/SIGINT."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


async def run(opts: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT; returns the exit code (2 when the config is invalid)."""
    cache = SnapshotCache()
    listener = ListenerSpec(
        opts.listener_host or opts.host, opts.listener_port, not opts.no_access_log
    )
    saved = _saved_state(opts.state_file)
    router = RouterPublisher(first_version=saved.state_version + 1 if saved else 1)
    try:
        token = (read_admin_token(opts.admin_token_file) if opts.admin_token_file is not None
                 else ControlPlaneSettings.from_env().admin_token)
        registry = Registry(registry_url(opts), opts.registry_table_prefix)
        registry.create_tables()
    except (OSError, ValueError, SQLAlchemyError) as exc:
        print(f"envoy_control: {exc}", file=sys.stderr)
        return 2
    if token is None:
        log.warning("no admin token (--admin-token-file or %s): admin changes are refused",
                    ADMIN_TOKEN_ENV)
    plane = ControlPlane(
        opts.config, cache, listener, region=opts.region, router=router, store=registry
    )
    try:
        first = plane.load()
    except ConfigError as exc:
        print(f"envoy_control: {exc}", file=sys.stderr)
        return 2
    prom_client = httpx.AsyncClient() if opts.prometheus_url else None
    controller = RolloutDriver(
        plane,
        PromGuardReader(prom_client, opts.prometheus_url) if prom_client else None,
        registry=registry,
        hold_s=opts.rollout_hold,
        window_s=opts.guard_window,
        min_requests=opts.guard_min_requests,
    )
    try:
        controller.resume()
    except SQLAlchemyError as exc:
        log.error("rollouts in progress not resumed: %s", exc)
    log.info("config %s loaded: snapshot %s", opts.config, first.snapshot.version)
    if saved is not None:
        try:
            restored = plane.restore(saved)
            log.info(
                "replicas restored from %s: snapshot %s", opts.state_file, restored.snapshot.version
            )
        except ValueError as exc:
            log.warning("state file %s not restored: %s", opts.state_file, exc)

    ads, xds_port = await start_ads_server(cache, opts.host, opts.xds_port)
    http = _Server(
        uvicorn.Config(
            create_app(
                plane, debug=opts.debug, admin_token=token, registry=registry, controller=controller
            ),
            host=opts.host,
            port=opts.http_port,
            log_level="warning",
            lifespan="off",
            access_log=False,
        )
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    http_task = asyncio.create_task(http.serve())
    watch_task = asyncio.create_task(plane.watch_config(opts.watch_interval))
    beats_task = asyncio.create_task(plane.watch_beats(0.25, opts.state_file))
    rollout_task = asyncio.create_task(controller.run(opts.rollout_interval))
    stop_task = asyncio.create_task(stop.wait())
    log.info(
        "control plane up: xDS %s:%d, HTTP %s:%d, listener %s:%d%s",
        opts.host,
        xds_port,
        opts.host,
        opts.http_port,
        listener.host,
        listener.port,
        " (debug endpoints on)" if opts.debug else "",
    )
    try:
        await asyncio.wait({http_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        log.info("control plane stopping")
        http.should_exit = True
        watch_task.cancel()
        beats_task.cancel()
        rollout_task.cancel()
        stop_task.cancel()
        await ads.stop(1.0)
        with contextlib.suppress(asyncio.CancelledError):
            await http_task
        with contextlib.suppress(asyncio.CancelledError):
            await watch_task
        with contextlib.suppress(asyncio.CancelledError):
            await beats_task
        with contextlib.suppress(asyncio.CancelledError):
            await rollout_task
        if prom_client is not None:
            await prom_client.aclose()
        registry.dispose()
        if opts.state_file is not None:
            with contextlib.suppress(OSError):
                await plane.router.save(opts.state_file)
    return 0 if stop.is_set() else 1


def _saved_state(path: Path | None) -> RouterState | None:
    """The router state saved at ``path`` (None without a file; a broken file is logged)."""
    if path is None:
        return None
    try:
        return load_router_state(path)
    except (RouterStateError, OSError) as exc:
        log.warning("state file %s ignored: %s", path, exc)
        return None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m envoy_control``."""
    opts = parse_args(argv)
    logging.basicConfig(
        level=opts.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return asyncio.run(run(opts))


if __name__ == "__main__":
    sys.exit(main())

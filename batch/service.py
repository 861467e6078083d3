"""``python -m batch``: the batch service: the ``/v1/batches`` and ``/v1/files``
API and/or the worker that sends batch lines through the platform's API at tier ``batch``.

    python -m batch --config config --host 127.0.0.1 --port 8091 \\
        --db-url sqlite:///modelfleet-usage.db --table-prefix mf_ \\
        --api-base-url http://127.0.0.1:8080/v1 (--team-keys keys.json | --dev-keys) \\
        [--role all|api|worker] [--concurrency 8] [--file-root DIR ...] \\
        [--s3-endpoint-url URL] [--worker-id ID] [--lease 15] [--urgent-window 3600]

Every flag, and every other setting, has a ``MODELFLEET_BATCH_*`` environment variable and may
come from a secret file of the same name (``batch.settings``); flags win over both. Exit 2 on
invalid settings or config. Every role serves ``/health`` and ``/metrics``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import random
import sys
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import ValidationError
from pydantic_settings import SettingsError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from batch.api import ApiFailure, batch_router
from batch.context import RunContext, tiers_from
from batch.files import BatchFiles
from batch.files_api import files_router
from batch.metrics import make_batch_metrics
from batch.settings import BatchSettings, team_keys
from batch.store import BatchStore
from batch.uploads import UploadStore
from batch.worker import BatchWorker
from modelfleet.config import ConfigError, PlatformConfig, load_config
from modelfleet.config.keys import Authenticated, KeyRing
from modelfleet.contract.errors import ApiError, invalid
from modelfleet.settings import settings_error

log = logging.getLogger("gateway_ext.batch")


def _error(error: ApiError) -> Response:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


def checked_keys(settings: BatchSettings, config: PlatformConfig, ring: KeyRing) -> dict[str, str]:
    """The worker's team keys, each checked against its team's key hashes (ValueError if not)."""
    keys = team_keys(settings, config.local.dev_keys)
    for team, key in keys.items():
        auth = ring.authenticate(f"Bearer {key}")
        if not isinstance(auth, Authenticated) or auth.team.name != team:
            raise ValueError(f"the key given for team {team!r} is not one of its keys")
    return keys


def create_batch_app(settings: BatchSettings, config: PlatformConfig,
                     store: BatchStore | None = None, files: BatchFiles | None = None,
                     transport: httpx.AsyncBaseTransport | None = None) -> FastAPI:
    """The service for ``settings``: routes by role, the worker in the lifespan. ``store``,
    ``files`` and the worker's HTTP ``transport`` may be given (tests); ValueError on bad keys."""
    ring = KeyRing(config.teams)
    store = store or BatchStore(settings.db_url, settings.table_prefix)
    files = files or BatchFiles(settings.file_roots, settings.s3_buckets, settings.s3_endpoint_url,
                                files_dir=settings.files_dir)
    uploads = UploadStore(store.engine, settings.table_prefix)
    registry = CollectorRegistry()
    metrics = make_batch_metrics(registry)
    keys = checked_keys(settings, config, ring) if settings.role != "api" else {}

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await asyncio.to_thread(store.create_tables)
        stop, task = asyncio.Event(), None
        client = httpx.AsyncClient(base_url=settings.api_base_url.rstrip("/") + "/",
                                   timeout=settings.request_timeout_s, transport=transport,
                                   limits=httpx.Limits(max_connections=None))
        if settings.role != "api":
            ctx = RunContext(store, files, settings, client, keys, tiers_from(config), metrics,
                             time.time, random.Random())
            task = asyncio.create_task(BatchWorker(ctx).run(stop), name="batch-worker")
        try:
            yield
        finally:
            stop.set()
            if task is not None:
                await task
            await client.aclose()
            store.dispose()

    app = FastAPI(title="modelfleet batch", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)

    async def api_failure(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiFailure)
        return _error(exc.error)

    async def bad_request(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        param = ".".join(str(p) for p in first["loc"] if p != "body") or None
        return _error(invalid(f"{param or 'body'}: {first['msg']}", param))

    app.add_exception_handler(ApiFailure, api_failure)
    app.add_exception_handler(RequestValidationError, bad_request)
    if settings.role != "worker":
        app.include_router(batch_router(store, ring, config, files, settings, uploads=uploads))
        app.include_router(files_router(uploads, store, ring, files, settings))

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "role": settings.role, "worker_id": settings.worker_id}

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app


def batch_service_argv(config_dir: Path, host: str, port: int, db_url: str, api_base_url: str,
                       *, table_prefix: str | None = None, role: str = "all",
                       file_roots: Sequence[Path] = (), dev_keys: bool = True,
                       extra: Sequence[str] = ()) -> list[str]:
    """The command line that starts the batch service for the local stack: the metering
    database ``db_url``, lines sent through Envoy's ``api_base_url`` (``http://host:port/v1``)
    with the config's dev keys, ``file://`` URIs allowed under ``file_roots``."""
    argv = [sys.executable, "-P", "-m", "batch", "--config", str(config_dir),
            "--host", host, "--port", str(port), "--role", role, "--db-url", db_url,
            "--api-base-url", api_base_url]
    if table_prefix is not None:
        argv += ["--table-prefix", table_prefix]
    for root in file_roots:
        argv += ["--file-root", str(root)]
    return argv + (["--dev-keys"] if dev_keys else []) + list(extra)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line; an absent flag leaves the environment's (or the default) value."""
    ap = argparse.ArgumentParser(prog="python -m batch", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", dest="config_dir", type=Path, help="config directory")
    ap.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    ap.add_argument("--port", type=int, help="TCP port (default 8091)")
    ap.add_argument("--role", choices=["all", "api", "worker"], help="default all")
    ap.add_argument("--db-url", help="SQLAlchemy URL of the metering database")
    ap.add_argument("--table-prefix", help="prefix of the batch tables (default mf_)")
    ap.add_argument("--api-base-url", help="the platform's API (Envoy), e.g. http://host:8080/v1")
    ap.add_argument("--team-keys", dest="team_keys_file", type=Path,
                    help="JSON file {team: key}: the keys batch lines are sent with")
    ap.add_argument("--dev-keys", action="store_true", default=None,
                    help="send with the config's local dev keys (local stack only)")
    ap.add_argument("--worker-id", help="lease owner name (default host-pid)")
    ap.add_argument("--concurrency", type=int, help="lines of one batch in flight (default 8)")
    ap.add_argument("--max-active-batches", type=int, help="batches run at once (default 4)")
    ap.add_argument("--lease", dest="lease_s", type=float, help="lease in seconds (default 15)")
    ap.add_argument("--poll-interval", dest="poll_interval_s", type=float,
                    help="seconds between status checks and claims (default 1)")
    ap.add_argument("--request-timeout", dest="request_timeout_s", type=float,
                    help="seconds to wait for one line's answer (default 300)")
    ap.add_argument("--urgent-window", dest="urgent_window_s", type=float,
                    help="seconds before the deadline when a batch at risk may go standard "
                         "(default 3600; 0: never)")
    ap.add_argument("--file-root", dest="file_roots", type=Path, action="append",
                    help="directory file:// URIs must be under; with {team}: that team's only "
                         "(repeatable; default: cwd)")
    ap.add_argument("--files-dir", type=Path,
                    help="where /v1/files uploads live, one folder per team "
                         "(default ./batch-files)")
    ap.add_argument("--s3-bucket", dest="s3_buckets", action="append",
                    help="bucket or bucket/prefix/{team}/ s3:// URIs must start with "
                         "(repeatable; default: any)")
    ap.add_argument("--s3-endpoint-url", help="S3-compatible endpoint (default: AWS)")
    ap.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Serve until SIGTERM or SIGINT; the worker gives its leases back on the way out."""
    args = parse_args(argv)
    try:
        settings = BatchSettings.from_env(**vars(args))
    except (ValidationError, SettingsError, OSError) as exc:
        print(f"batch: {settings_error(exc)}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    try:
        app = create_batch_app(settings, load_config(settings.config_dir).config)
    except (ConfigError, ValueError, OSError) as exc:
        print(f"batch: {exc}", file=sys.stderr)
        return 2
    uvicorn.run(app, host=settings.host, port=settings.port, log_level="warning",
                access_log=False, timeout_graceful_shutdown=5)
    return 0

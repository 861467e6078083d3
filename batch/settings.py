"""The batch service's settings: one :class:`BatchSettings`, a pydantic-settings ``BaseSettings``.

Each field ``name`` comes from, first to last: the command-line flag (``python -m batch``,
passed as an init keyword), the environment variable ``MODELFLEET_BATCH_<NAME>``
(``MODELFLEET_BATCH_DB_URL``; lists and mappings as JSON:
``MODELFLEET_BATCH_FILE_ROOTS='["/data/batches"]'``), a secret file of that same name in the
secrets directory (``$MODELFLEET_SECRETS_DIR``, default ``/run/secrets/modelfleet``: e.g. a
Kubernetes Secret mounted there; names match without regard to case, surrounding whitespace is
dropped; a missing directory is ignored), then the default.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import Field

from batch.files import MAX_INPUT_BYTES
from batch.lines import MAX_LINES
from modelfleet.db import DEFAULT_TABLE_PREFIX, DEFAULT_URL
from modelfleet.settings import ServiceSettings, service_config

ENV_PREFIX = "MODELFLEET_BATCH_"



def default_worker_id() -> str:
    """``<host>-<pid>``: unique per process, so a restarted worker waits out its old lease
    unless it is given the old id back."""
    return f"{socket.gethostname()}-{os.getpid()}"


class BatchSettings(ServiceSettings):
    """Everything the batch service needs; units in the names (seconds, bytes)."""

    model_config = service_config(ENV_PREFIX)

    config_dir: Path = Path("config")
    """The declared platform config (teams, key hashes, tiers, models)."""
    host: str = "127.0.0.1"
    port: int = Field(default=8091, ge=0, le=65535)
    role: Literal["all", "api", "worker"] = "all"
    """Serve the batch API, run the worker, or both (every role serves /health and /metrics)."""
    db_url: str = DEFAULT_URL
    """The metering database (SQLAlchemy URL): the batch tables live beside the usage tables."""
    table_prefix: str = DEFAULT_TABLE_PREFIX
    api_base_url: str = "http://127.0.0.1:8080/v1"
    """The platform's public API (Envoy): the worker sends every line through it."""
    team_keys_file: Path | None = None
    """JSON ``{team: key}``: the key the worker sends each team's lines with."""
    dev_keys: bool = False
    """Use the config's ``local.dev_keys`` as the teams' keys (local stack only)."""
    worker_id: str = Field(default_factory=default_worker_id)
    concurrency: int = Field(default=8, ge=1, le=1024)
    """Most lines of one batch in flight at once."""
    max_active_batches: int = Field(default=4, ge=1)
    """Batches one worker runs at the same time."""
    lease_s: float = Field(default=15.0, gt=0)
    """How long a worker's claim on a batch lasts without renewal, in seconds."""
    poll_interval_s: float = Field(default=1.0, gt=0)
    """How often the worker looks for new batches, and re-reads status and deadline, in seconds."""
    request_timeout_s: float = Field(default=300.0, gt=0)
    """Longest wait for one line's answer, in seconds (the gateway may queue batch for 120 s)."""
    max_attempts: int = Field(default=5, ge=1)
    """Attempts per line on transient failures (5xx, no answer); 429/503 do not count."""
    urgent_window_s: float = Field(default=3600.0, ge=0)
    """Inside this many seconds before its deadline, a batch at risk is sent at ``standard``
    where its team may send ``standard`` (0: never)."""
    risk_min_lead_s: float = Field(default=60.0, ge=0)
    """With less than this many seconds left and lines remaining, a batch is at risk."""
    default_completion_window_s: float = Field(default=86400.0, gt=0)
    """Deadline of a batch created with neither ``deadline`` nor ``completion_window``."""
    max_completion_window_s: float = Field(default=7 * 86400.0, gt=0)
    file_roots: list[Path] = Field(default_factory=lambda: [Path.cwd()])
    """``file://`` inputs and outputs must lie under one of these directories; one holding
    ``{team}`` is that team's alone, one without it is shared by every team."""
    files_dir: Path = Field(default_factory=lambda: Path.cwd() / "batch-files")
    """Files uploaded through ``/v1/files`` and the outputs of batches made from them, one
    folder per team (``<files_dir>/<team>/``, readable by that team only)."""
    s3_buckets: list[str] | None = None
    """``bucket`` or ``bucket/prefix/{team}/`` entries ``s3://`` URIs must start with (None:
    any bucket the service's credentials reach)."""
    s3_endpoint_url: str | None = None
    """An S3-compatible endpoint (tests: moto's server); None: AWS."""
    max_lines: int = Field(default=MAX_LINES, ge=1)
    max_input_bytes: int = Field(default=MAX_INPUT_BYTES, ge=1)
    log_level: str = "info"


def team_keys(settings: BatchSettings, dev_keys: Mapping[str, str]) -> dict[str, str]:
    """Team -> key for the worker: the keys file, else (``dev_keys`` set) the config's dev keys,
    else none."""
    if settings.team_keys_file is not None:
        data = json.loads(settings.team_keys_file.read_text())
        if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
            raise ValueError(f"{settings.team_keys_file}: expected a JSON object team -> key")
        return {str(k): v for k, v in data.items()}
    return dict(dev_keys) if settings.dev_keys else {}

"""gateway_ext's settings: one :class:`Settings`, a pydantic-settings ``BaseSettings``.

Each field ``name`` comes from, first to last: the command-line flag (``python -m gateway_ext``,
passed as an init keyword), the environment variable ``MODELFLEET_GATEWAY_<NAME>``
(``MODELFLEET_GATEWAY_REDIS_URL``; lists and mappings as JSON:
``MODELFLEET_GATEWAY_REPLICAS='{"chat-7b@v13": 3}'``), a secret file of that same name in the
secrets directory (``$MODELFLEET_SECRETS_DIR``, default ``/run/secrets/modelfleet``: e.g. a
Kubernetes Secret mounted there; names match without regard to case, surrounding whitespace is
dropped; a missing directory is ignored), then the default.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from modelfleet.config.schema import Tier
from modelfleet.contract.headers import MAX_BODY_BYTES
from modelfleet.db import DEFAULT_TABLE_PREFIX, DEFAULT_URL
from modelfleet.settings import ServiceSettings, service_config

ENV_PREFIX = "MODELFLEET_GATEWAY_"



class Settings(ServiceSettings):
    """Everything the service needs; units in the names (seconds, bytes, tokens)."""

    model_config = service_config(ENV_PREFIX)

    config_dir: Path = Path("config")
    """The declared platform config (teams, keys, limits, models)."""
    host: str = "127.0.0.1"
    port: int = Field(default=8090, ge=0, le=65535)
    region: str | None = None
    """Region written on usage rows (default: the config's ``local.region``)."""
    redis_url: str | None = None
    """Token buckets, ``max_concurrency`` counts, the live-gateway set (pool capacity shares) and
    settle announcements in Redis, shared by every gateway process; None: all in this process."""
    redis_prefix: str = "mf"
    redis_timeout_s: float = Field(default=0.1, gt=0)
    """Connect and read timeout of one Redis call, in seconds."""
    redis_retry_s: float = Field(default=1.0, gt=0)
    """After a Redis failure, per-process buckets for this many seconds before trying again."""
    heartbeat_s: float = Field(default=1.0, gt=0)
    """With Redis: seconds between this process's heartbeats (the live gateway count)."""
    peer_ttl_s: float = Field(default=3.0, gt=0)
    """With Redis: a gateway silent this long (seconds) no longer shares the pools' capacity."""
    usage_db_url: str = DEFAULT_URL
    usage_table_prefix: str = DEFAULT_TABLE_PREFIX
    spool: Path = Path("usage-spool.jsonl")
    """Usage batches not yet in the database (JSONL)."""
    flush_interval_s: float = Field(default=5.0, gt=0)
    replicas: dict[str, int] = Field(default_factory=dict)
    """Serving replicas per ``model@version`` (default: the config's ``local.replicas``)."""
    max_queue: int = Field(default=256, ge=0)
    """Queued requests per pool before the lowest tier is shed."""
    queue_timeout_interactive_s: float = Field(default=60.0, gt=0)
    queue_timeout_standard_s: float = Field(default=20.0, gt=0)
    queue_timeout_batch_s: float = Field(default=120.0, gt=0)
    """Longest queue waits; all must stay below Envoy's ext_authz timeout (150 s)."""
    max_body_bytes: int = Field(default=MAX_BODY_BYTES, gt=0)
    seed: int | None = None
    """Seed of Retry-After jitter and the canary draw (None: from the OS)."""
    control_plane_url: str | None = None
    """The control plane's HTTP API: its router state is long-polled (``/v1/router/state``)."""
    router_state_file: Path | None = None
    """Router state read at start (the control plane's ``--state-file``, or this gateway's own
    copy with ``router_state_write``), so a restart while the control plane is down keeps routing."""
    router_state_write: bool = False
    """Keep ``router_state_file`` current with each state received (when the gateway cannot read
    the control plane's own file)."""
    router_poll_wait_s: float = Field(default=1.0, gt=0, le=10)
    """Longest long poll of the router state, seconds: the state is at most this old."""
    pin_ttl_s: float = Field(default=3600.0, gt=0)
    """A conversation idle this long (seconds) loses its version pin."""
    pin_max_entries: int = Field(default=1_000_000, ge=1)
    """Pins kept in this process's memory (without Redis, or while it is down)."""
    picking: Literal["affinity", "least_tokens", "round_robin"] = "affinity"
    """Replica picking: ring with bounded load (production), or a routing A/B baseline."""
    pick_bound: float = Field(default=1.25, ge=1)
    """Skip a replica above this multiple of its pool's average tokens in flight."""
    pick_floor_fraction: float = Field(default=0.1, ge=0, le=1)
    """...unless it holds at most this share of its load-tested tokens in flight."""
    debug: bool = False
    """Serve ``/v1/debug/*`` (bucket and pool state) on the gateway's own port."""
    log_level: str = "info"

    @property
    def queue_timeouts_s(self) -> dict[Tier, float | None]:
        """Queue timeout per tier, in seconds."""
        return {"interactive": self.queue_timeout_interactive_s,
                "standard": self.queue_timeout_standard_s, "batch": self.queue_timeout_batch_s}

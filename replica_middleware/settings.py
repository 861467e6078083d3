"""The replica middleware's settings, read from ``MODELFLEET_*`` environment variables.

``vllm serve --middleware replica_middleware.middleware.ModelfleetMiddleware`` instantiates the middleware
with no arguments, so a real replica is configured by its environment; the Pulumi ``ModelPool``
sets the first eight (``components/k8s/pool_manifests.py``). The simulated replica passes a
:class:`MiddlewareSettings` built from its flags instead.

| variable | field | meaning |
|---|---|---|
| ``MODELFLEET_REPLICA_ID`` | ``replica_id`` | the pod name: ring key, Envoy hostname, ``replica_id`` in answers |
| ``MODELFLEET_REPLICA_IP`` (or ``_HOST``) | ``host`` | the address Envoy connects to (the pod IP) |
| ``MODELFLEET_REPLICA_PORT`` | ``port`` | the engine's HTTP port (default 8000) |
| ``MODELFLEET_REGION`` | ``region`` | ``region`` in answers and beats |
| ``MODELFLEET_MODEL``, ``MODELFLEET_VERSION`` | ``model``, ``version`` | the ``model@version`` served |
| ``MODELFLEET_POOL`` | ``pool`` | the pool's name (logs only) |
| ``MODELFLEET_CONTROL_PLANE_URL`` | ``control_plane_url`` | heartbeats go to ``<url>/v1/heartbeats``; empty: none |
| ``MODELFLEET_SETTLE_URL`` | ``settle_url`` | gateway_ext's ``/v1/settle``; empty: usage is not reported |
| ``MODELFLEET_BEAT_INTERVAL_S`` | ``beat_interval_s`` | seconds between beats (1) |
| ``MODELFLEET_DEFAULT_MAX_TOKENS`` | ``default_max_tokens`` | output assumed for a request without ``max_tokens`` (4096) |
| ``MODELFLEET_DRAIN_GRACE_S`` | ``drain_grace_s`` | after SIGTERM, seconds of beating ``draining`` before the server stops accepting (0) |
| ``MODELFLEET_HANDLE_SIGTERM`` | ``handle_sigterm`` | chain a SIGTERM handler (``1``) |
| ``MODELFLEET_TIME_SCALE`` | ``time_scale`` | simulated replicas only: model seconds per wall second, for latency metrics (1) |
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

ENV = {
    "replica_id": "MODELFLEET_REPLICA_ID",
    "host": "MODELFLEET_REPLICA_IP",
    "port": "MODELFLEET_REPLICA_PORT",
    "region": "MODELFLEET_REGION",
    "model": "MODELFLEET_MODEL",
    "version": "MODELFLEET_VERSION",
    "pool": "MODELFLEET_POOL",
    "control_plane_url": "MODELFLEET_CONTROL_PLANE_URL",
    "settle_url": "MODELFLEET_SETTLE_URL",
    "beat_interval_s": "MODELFLEET_BEAT_INTERVAL_S",
    "default_max_tokens": "MODELFLEET_DEFAULT_MAX_TOKENS",
    "drain_grace_s": "MODELFLEET_DRAIN_GRACE_S",
    "handle_sigterm": "MODELFLEET_HANDLE_SIGTERM",
    "time_scale": "MODELFLEET_TIME_SCALE",
}
"""Field -> environment variable."""
HOST_ALIAS = "MODELFLEET_REPLICA_HOST"


@dataclass(frozen=True)
class MiddlewareSettings:
    """Who this replica is and where it reports (see the module's table); seconds, tokens."""

    replica_id: str = ""
    host: str = ""
    port: int = 8000
    region: str = ""
    model: str = ""
    version: str = ""
    pool: str = ""
    control_plane_url: str = ""
    settle_url: str = ""
    beat_interval_s: float = 1.0
    default_max_tokens: int = 4096
    drain_grace_s: float = 0.0
    handle_sigterm: bool = True
    time_scale: float = 1.0

    def __post_init__(self) -> None:
        if self.beat_interval_s <= 0 or self.time_scale <= 0 or self.drain_grace_s < 0:
            raise ValueError("beat_interval_s and time_scale must be positive, "
                             "drain_grace_s not negative")
        if self.default_max_tokens < 1 or not 0 < self.port < 65536:
            raise ValueError("default_max_tokens must be >= 1 and port a TCP port")

    @property
    def beats(self) -> bool:
        """Whether heartbeats can be sent: a control plane, an id and an address."""
        return bool(self.control_plane_url and self.replica_id and self.host and self.model
                    and self.version)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> MiddlewareSettings:
        """Settings from ``environ`` (default ``os.environ``); ``overrides`` (not None) win.
        Raises ValueError on a malformed number."""
        env = os.environ if environ is None else environ
        kinds = {f.name: f.type for f in fields(cls)}
        values: dict[str, Any] = {}
        for name, var in ENV.items():
            raw = env.get(var)
            if raw is None and name == "host":
                raw = env.get(HOST_ALIAS)
            if raw is None or raw == "":
                continue
            kind = kinds[name]
            if kind == "int":
                values[name] = int(raw)
            elif kind == "float":
                values[name] = float(raw)
            elif kind == "bool":
                values[name] = raw.strip().lower() not in ("0", "false", "no", "off")
            else:
                values[name] = raw
        values.update({k: v for k, v in overrides.items() if v is not None})
        return replace(cls(), **values)

"""The replica middleware's settings: :class:`MiddlewareSettings`, a pydantic-settings
``BaseSettings`` read from ``MODELFLEET_*`` environment variables.

``vllm serve --middleware replica_middleware.middleware.ModelfleetMiddleware`` instantiates the middleware
with no arguments, so a real replica is configured by its environment; the Pulumi ``ModelPool``
sets the first eight (``components/k8s/pool_manifests.py``). The simulated replica passes its
flags as init keywords (:meth:`MiddlewareSettings.from_env`), which win over the environment.

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
| ``MODELFLEET_HANDLE_SIGTERM`` | ``handle_sigterm`` | chain a SIGTERM handler (``1``; ``0``/``false``/``no``/``off``: not) |
| ``MODELFLEET_TIME_SCALE`` | ``time_scale`` | simulated replicas only: model seconds per wall second, for latency metrics (1) |
| ``MODELFLEET_SHUTDOWN_TIMEOUT_S`` | ``shutdown_timeout_s`` | simulated replicas only: seconds open streams may take after the drain grace, as vLLM's ``--shutdown-timeout`` (10) |

An empty variable counts as unset. Each value may also come from a secret file of the same name
in the secrets directory (``$MODELFLEET_SECRETS_DIR``, default ``/run/secrets/modelfleet``; names
match without regard to case, surrounding whitespace is dropped; a missing directory is
ignored); a variable wins over a file. A malformed value raises ``pydantic.ValidationError``.
"""

from __future__ import annotations

from pydantic import AliasChoices, Field

from modelfleet.settings import ServiceSettings, service_config

ENV_PREFIX = "MODELFLEET_"



class MiddlewareSettings(ServiceSettings):
    """Who this replica is and where it reports (see the module's table); seconds, tokens.

    ``host`` and ``port`` are read from ``MODELFLEET_REPLICA_IP`` (or ``_HOST``) and
    ``MODELFLEET_REPLICA_PORT``; as keywords they keep their field names."""

    model_config = service_config(ENV_PREFIX, env_ignore_empty=True, validate_by_name=True)
    variables_only = True
    """``host`` and ``port`` by their variables only (not ``MODELFLEET_HOST``/``_PORT``): their
    field names are for keywords."""

    replica_id: str = ""
    host: str = Field(default="", validation_alias=AliasChoices("MODELFLEET_REPLICA_IP",
                                                                 "MODELFLEET_REPLICA_HOST"))
    port: int = Field(default=8000, ge=1, le=65535, validation_alias="MODELFLEET_REPLICA_PORT")
    region: str = ""
    model: str = ""
    version: str = ""
    pool: str = ""
    control_plane_url: str = ""
    settle_url: str = ""
    beat_interval_s: float = Field(default=1.0, gt=0)
    default_max_tokens: int = Field(default=4096, ge=1)
    drain_grace_s: float = Field(default=0.0, ge=0)
    handle_sigterm: bool = True
    time_scale: float = Field(default=1.0, gt=0)
    shutdown_timeout_s: float = Field(default=10.0, ge=0)

    @property
    def beats(self) -> bool:
        """Whether heartbeats can be sent: a control plane, an id and an address."""
        return bool(self.control_plane_url and self.replica_id and self.host and self.model
                    and self.version)

"""How the local stack starts one simulated replica for a version of the config, and gateway_ext
(pure: command lines).

The simulated replica takes vLLM's flags (``--host``, ``--port``, ``--served-model-name``) plus
its engine parameters, which come from the version record: weights and KV bytes from the
architecture and precision, memory from the GPU type, capacity from the load test.
"""

from __future__ import annotations

import json
from pathlib import Path

from modelfleet.config import Version
from modelfleet.local.processes import python_module
from replica.version_params import engine_params


def served_model_names(version: Version) -> list[str]:
    """Names the replica answers to: the model name and the explicit ``model@version``."""
    return [version.model, version.key]


def replica_argv(version: Version, replica_id: str, host: str, port: int, region: str,
                 time_scale: float, seed: int, settle_url: str = "", control_plane_url: str = "",
                 debug: bool = False) -> list[str]:
    """The command line of one simulated replica of ``version`` on ``host:port``: its
    middleware reports the usage of admitted requests to ``settle_url`` (gateway_ext) and beats
    to ``control_plane_url``, if given; ``debug`` serves its failure-test endpoint."""
    return python_module(
        "replica",
        "--host", host,
        "--port", str(port),
        "--served-model-name", *served_model_names(version),
        "--model-version", version.version,
        "--replica-id", replica_id,
        "--region", region,
        "--seed", str(seed),
        "--time-scale", repr(time_scale),
        "--engine-params", json.dumps(engine_params(version)),
        *(["--settle-url", settle_url] if settle_url else []),
        *(["--control-plane-url", control_plane_url, "--advertise-host", host]
          if control_plane_url else []),
        *(["--debug"] if debug else []),
    )


def gateway_argv(config_dir: Path, host: str, port: int, usage_db_url: str, spool: Path, region: str,
                 redis_url: str | None = None, debug: bool = False, control_plane_url: str = "",
                 router_state_file: Path | None = None) -> list[str]:
    """The command line of gateway_ext on ``host:port`` for the local stack: it long-polls the
    router state of ``control_plane_url`` and starts from ``router_state_file`` if the control
    plane is down. Other settings come from ``MODELFLEET_GATEWAY_*`` variables in the
    environment (``gateway_ext.settings``)."""
    return python_module(
        "gateway_ext",
        "--config", str(config_dir),
        "--host", host,
        "--port", str(port),
        "--usage-db-url", usage_db_url,
        "--spool", str(spool),
        "--region", region,
        *(["--redis-url", redis_url] if redis_url else []),
        *(["--debug"] if debug else []),
        *(["--control-plane-url", control_plane_url] if control_plane_url else []),
        *(["--router-state-file", str(router_state_file)] if router_state_file else []),
    )

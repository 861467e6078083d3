"""``modelfleet up --autoscale`` before the stack starts: the replicas' drain environment and the
options it goes into (see :mod:`modelfleet.local.autoscaler`)."""

from __future__ import annotations

from autoscale.drain import prestop_s, stream_bound_s
from modelfleet.config import PlatformConfig, load_config
from modelfleet.local.launch import StackOptions

MIN_PRESTOP_WALL_S = 1.5
"""A draining replica answers 503 at least this long (wall seconds) whatever the time scale:
its removal spreads through the control plane, Envoy and the gateway in real time."""


def replica_env(cfg: PlatformConfig, time_scale: float) -> dict[str, str]:
    """Environment of every simulated replica under ``--autoscale``: the drain grace (the scaled
    preStop, at least :data:`MIN_PRESTOP_WALL_S`) between SIGTERM and closing the listener, then
    the scaled stream bound of the slowest version for open streams to finish (vLLM's
    ``--shutdown-timeout``; uvicorn's default 10 s would cut them at time scale 1)."""
    grace = max(prestop_s(cfg.autoscaling.drain) / time_scale, MIN_PRESTOP_WALL_S)
    bounds = [stream_bound_s(m, v, cfg.autoscaling.drain) for v in cfg.versions
              if (m := cfg.model(v.model)) is not None]
    streams = max(bounds, default=0.0) / time_scale
    return {"MODELFLEET_DRAIN_GRACE_S": f"{grace:.3f}",
            "MODELFLEET_SHUTDOWN_TIMEOUT_S": f"{max(streams, 1.0):.3f}"}


def prepare_options(options: StackOptions) -> tuple[PlatformConfig, float]:
    """Before the stack starts under ``--autoscale``: the config and the time scale in force,
    and the replicas' drain grace set in ``options.replica_env``. Raises ``ConfigError``."""
    cfg = load_config(options.config_dir).config
    time_scale = options.time_scale or cfg.local.time_scale
    options.replica_env.update(replica_env(cfg, time_scale))
    return cfg, time_scale

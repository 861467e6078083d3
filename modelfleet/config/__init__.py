"""The declared platform config: typed records, loading from ``config/*.yaml``, and checks."""

from modelfleet.config.load import ConfigError, LoadResult, load_config
from modelfleet.config.problems import Location, Problem
from modelfleet.config.schema import (
    TIERS,
    Canary,
    LocalStack,
    Model,
    PlatformConfig,
    Pool,
    Shadow,
    Team,
    TeamLimit,
    Tier,
    Version,
)

__all__ = [
    "TIERS",
    "Canary",
    "ConfigError",
    "LoadResult",
    "LocalStack",
    "Location",
    "Model",
    "PlatformConfig",
    "Pool",
    "Problem",
    "Shadow",
    "Team",
    "TeamLimit",
    "Tier",
    "Version",
    "load_config",
]

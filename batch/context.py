"""What every running batch of one worker shares: the store, the files, the settings, the HTTP
client to the platform's API, the teams' keys and tiers, the metrics, the clock and randomness.
Passed in (never global), so tests build one over fakes of any part."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import httpx

from batch.files import BatchFiles
from batch.lines import base_model
from batch.metrics import BatchMetrics
from batch.settings import BatchSettings
from batch.store import BatchStore
from modelfleet.config import PlatformConfig, Tier


def tiers_from(config: PlatformConfig) -> Callable[[str, str], tuple[Tier, ...]]:
    """``(team, model) -> tiers`` the team may send to the model (``model@vN``: its model's)."""
    table = {(t.name, lim.model): tuple(lim.tiers) for t in config.teams for lim in t.limits}

    def tiers(team: str, model: str) -> tuple[Tier, ...]:
        return table.get((team, base_model(model)), ())
    return tiers


@dataclass
class RunContext:
    """The worker's shared parts; ``clock`` is wall-clock seconds since the epoch."""

    store: BatchStore
    files: BatchFiles
    settings: BatchSettings
    client: httpx.AsyncClient
    keys: Mapping[str, str]
    tiers: Callable[[str, str], tuple[Tier, ...]]
    metrics: BatchMetrics
    clock: Callable[[], float] = time.time
    rng: random.Random = field(default_factory=random.Random)

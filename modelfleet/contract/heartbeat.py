"""The heartbeat: what every replica's middleware sends the control plane once a second
(``POST`` :data:`HEARTBEAT_PATH`, JSON of :class:`Heartbeat`), and the rule both sides agree on.

The replica middleware (:mod:`replica_middleware.heartbeat`) builds a :class:`Heartbeat` and
posts ``dataclasses.asdict`` of it; the control plane (``envoy_control.api.state``) validates the
body with the same fields and keeps it (``envoy_control.state.beats``). A receiver ignores fields
it does not know, so a newer replica is never dropped by an older control plane.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

HEARTBEAT_PATH = "/v1/heartbeats"
"""Where a replica posts its beats, on the control plane's HTTP API."""
BEAT_INTERVAL_S = 1.0
"""Seconds between two beats of one replica."""
MISSED_BEATS = 3
"""Beats a replica may miss before it leaves the ring (3 x 1 s)."""

ReplicaPhase = Literal["starting", "serving", "draining"]
"""A replica's state as it reports it."""


@dataclass(frozen=True)
class Heartbeat:
    """One beat as a replica sends it; token counts in tokens."""

    replica_id: str
    model: str
    version: str
    host: str
    """The address Envoy connects to (the pod IP)."""
    port: int
    region: str
    state: ReplicaPhase
    tokens_in_flight: int
    """Prompt plus remaining output of every request the replica holds, in tokens."""
    queue_depth: int
    """Requests waiting (the engine's own queue when it reports one)."""
    running: int
    """Requests in the running batch."""
    kv_cache_usage: float
    """Share (0..1) of the KV cache in use."""
    prefix_cache_queries: int
    """Cumulative prompt tokens looked up in the prefix cache since the replica started."""
    prefix_cache_hits: int
    """Cumulative prompt tokens found there."""
    sent_at: float | None = None
    """The sender's clock (Unix seconds); informational only."""

    @property
    def key(self) -> str:
        """``model@version``."""
        return f"{self.model}@{self.version}"

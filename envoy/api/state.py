"""HTTP endpoints for heartbeats and pool/router state (added to the app by ``create_app``).

| method | path | body / query | answer |
|---|---|---|---|
| POST | /v1/heartbeats | :class:`HeartbeatIn` | ``{replica_id, routable, why_not, snapshot_version, changed, beat_interval_s}``; 422 on a bad beat |
| GET | /admin/pools/{model}/state | | ``{model, replicas, queue_depth, tokens_in_flight, running, prefix_hit_rate, routable, versions}``; 404 for an unknown model |
| GET | /v1/router/state | ``?after=N&wait_s=S`` | the router state (:mod:`modelfleet.contract.router_state`); long-polls while its ``state_version`` is ``N`` |
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any, Literal

from envoy_control.api.deps import Admin
from envoy_control.state.plane import ControlPlane
from envoy_control.state.pool_state import MemberState, PoolTotals, totals
from envoy_control.state.replicas import REPLICA_ID_PATTERN
from fastapi import FastAPI, HTTPException, Query
from pydantic import BaseModel, ConfigDict, Field, model_validator

from modelfleet.config.schema import Name, VersionName
from modelfleet.contract.heartbeat import HEARTBEAT_PATH, Heartbeat

MAX_WAIT_S = 10.0
"""The longest long poll, in seconds (it also bounds how long a shutdown waits for one)."""


class HeartbeatIn(BaseModel):
    """Body of ``POST /v1/heartbeats``; token counts in tokens, sent once a second.

    Unknown fields are ignored, not refused: a newer replica must not be dropped from the ring
    by an older control plane.
    """

    model_config = ConfigDict(extra="ignore")
    replica_id: str = Field(pattern=REPLICA_ID_PATTERN)
    model: Name
    version: VersionName
    host: str = Field(min_length=1, description="IP address Envoy connects to")
    port: int = Field(ge=1, le=65535)
    region: Name
    state: Literal["starting", "serving", "draining"]
    tokens_in_flight: int = Field(ge=0, description="prompt + remaining output of all held, tokens")
    queue_depth: int = Field(ge=0, description="requests waiting")
    running: int = Field(ge=0, description="requests in the running batch")
    kv_cache_usage: float = Field(ge=0, le=1, description="share of the KV cache in use")
    prefix_cache_queries: int = Field(ge=0, description="cumulative prompt tokens looked up")
    prefix_cache_hits: int = Field(ge=0, description="cumulative prompt tokens found cached")
    sent_at: float | None = Field(default=None, description="sender clock, Unix s; informational")

    @model_validator(mode="after")
    def _hits_within_queries(self) -> HeartbeatIn:
        if self.prefix_cache_hits > self.prefix_cache_queries:
            raise ValueError(
                f"prefix_cache_hits {self.prefix_cache_hits} exceeds "
                f"prefix_cache_queries {self.prefix_cache_queries}"
            )
        return self


def member_dict(m: MemberState) -> dict[str, Any]:
    """One pool member as JSON, with its ``address`` (``host:port``)."""
    return {**asdict(m), "address": f"{m.host}:{m.port}"}


def totals_dict(t: PoolTotals) -> dict[str, Any]:
    """Pool sums as JSON (tokens, requests; hit rate 0..1 or null)."""
    return {
        "replicas": t.replicas,
        "routable": t.routable,
        "tokens_in_flight": t.tokens_in_flight,
        "queue_depth": t.queue_depth,
        "running": t.running,
        "prefix_hit_rate": t.prefix_hit_rate,
    }


def model_state(plane: ControlPlane, model: str) -> dict[str, Any] | None:
    """``GET /admin/pools/{model}/state``: every member of every version of ``model`` and the
    sums; None when the model is neither declared nor served by any replica."""
    pools = [p for p in plane.pool_states().values() if p.model == model]
    if plane.config.model(model) is None and not pools:
        return None
    members = [m for p in pools for m in p.members]
    versions = {v.version: totals([]) for v in plane.config.versions_of(model)}
    versions.update({p.version: p.totals for p in pools})
    rules = plane.beats.rules
    return {
        "model": model,
        "replicas": [member_dict(m) for m in members],
        **{k: v for k, v in totals_dict(totals(members)).items() if k != "replicas"},
        "versions": {v: totals_dict(t) for v, t in sorted(versions.items())},
        "beat_interval_s": rules.interval_s,
        "missed_beats": rules.missed_beats,
    }


def add_state_routes(app: FastAPI, plane: ControlPlane) -> None:
    """Add the heartbeat, pool-state and router-state endpoints to ``app``."""

    @app.post(HEARTBEAT_PATH)
    async def heartbeat(body: HeartbeatIn) -> dict[str, Any]:
        beat = Heartbeat(**body.model_dump())
        try:
            published = plane.heartbeat(beat)
        except ValueError as exc:
            raise HTTPException(422, str(exc)) from None
        why_not = plane.why_not_routable(beat.replica_id)
        return {
            "replica_id": beat.replica_id,
            "routable": why_not is None,
            "why_not": why_not,
            "snapshot_version": published.snapshot.version,
            "changed": published.changed,
            "beat_interval_s": plane.beats.rules.interval_s,
        }

    @app.get("/admin/pools/{model}/state")
    async def pool_state(model: str, _: Admin) -> dict[str, Any]:
        state = model_state(plane, model)
        if state is None:
            raise HTTPException(404, f"model {model} is not declared and no replica serves it")
        return state

    @app.get("/v1/router/state")
    async def router_state(
        after: Annotated[int | None, Query(ge=0)] = None,
        wait_s: Annotated[float, Query(ge=0, le=MAX_WAIT_S)] = 0.0,
    ) -> dict[str, Any]:
        state = await plane.router.wait_past(after, wait_s)
        if state is None:
            raise HTTPException(503, "no router state published yet")
        return state.as_dict()

"""The control plane's HTTP API (FastAPI): replicas, config reload, xDS status, debug injection.

| method | path | body | answer |
|---|---|---|---|
| PUT | /v1/replicas/{replica_id} | ``{model, version, host, port}`` | the replica, ``snapshot_version`` |
| DELETE | /v1/replicas/{replica_id} | | ``snapshot_version`` (404 if unknown) |
| GET | /v1/replicas | | ``{replicas: [...]}`` with ``routable`` |
| POST | /v1/config/reload | | ``{changed, snapshot_version, warnings}``; 422 + problems |
| GET | /v1/xds/status | | current snapshot versions; per node and type: sent, ACKed, NACK |
| GET | /v1/xds/snapshot | | resource names per type |
| GET | /health | | ``{status: "ok", snapshot_version}`` |
| POST | /v1/debug/invalid-resource | ``{type?, resource?}`` | only with ``--debug`` |
| DELETE | /v1/debug/invalid-resource | | only with ``--debug`` |

Heartbeats, pool state and router state: :mod:`envoy_control.api.state`; the admin API
(registry, rollouts, aliases, limits, desired state): :mod:`envoy_control.api.admin`, behind the
admin credential of :mod:`envoy_control.api.deps`.
"""

from __future__ import annotations

from typing import Annotated, Any

from envoy_control.api.admin import add_admin_routes
from envoy_control.api.deps import AdminCredential
from envoy_control.api.state import add_state_routes
from envoy_control.registry.store import Registry
from envoy_control.resources.clusters import seconds
from envoy_control.rollouts.driver import RolloutDriver
from envoy_control.state.plane import ControlPlane, Published
from envoy_control.state.replicas import Replica
from envoy_control.xds.consistency import InconsistentSnapshot
from envoy_control.xds.snapshot import MESSAGE_TYPES, PUSH_ORDER, SHORT_NAMES, Snapshot
from fastapi import Body, FastAPI, HTTPException
from fastapi.responses import JSONResponse
from google.protobuf import json_format
from pydantic import BaseModel, ConfigDict, Field

from envoy.config.cluster.v3 import cluster_pb2
from modelfleet.config import ConfigError

TYPE_BY_SHORT_NAME = {v: k for k, v in SHORT_NAMES.items()}
DEBUG_INVALID_CLUSTER = "modelfleet-debug-invalid"


class ReplicaIn(BaseModel):
    """Body of ``PUT /v1/replicas/{replica_id}``: what the replica serves and where (TCP port)."""

    model_config = ConfigDict(extra="forbid")
    model: str = Field(min_length=1)
    version: str = Field(min_length=1)
    host: str = Field(min_length=1)
    port: int = Field(ge=1, le=65535)


class InjectIn(BaseModel):
    """Body of ``POST /v1/debug/invalid-resource``: a raw resource as proto JSON, by type."""

    model_config = ConfigDict(extra="forbid")
    type: str = Field(default="cds", pattern="^(cds|eds|lds|rds)$")
    resource: dict[str, Any] | None = None
    """Proto-JSON of the resource; default: a STATIC cluster with a negative connect timeout."""


def default_invalid_cluster() -> cluster_pb2.Cluster:
    """A cluster Envoy rejects (``connect_timeout`` must be > 0) but our consistency check passes."""
    return cluster_pb2.Cluster(
        name=DEBUG_INVALID_CLUSTER, type=cluster_pb2.Cluster.STATIC, connect_timeout=seconds(-1)
    )


def snapshot_summary(snapshot: Snapshot) -> dict[str, Any]:
    """Version, per-type versions and resource counts of ``snapshot``."""
    return {
        "version": snapshot.version,
        "types": {SHORT_NAMES[t]: snapshot.type_version(t) for t in PUSH_ORDER},
        "resources": {SHORT_NAMES[t]: len(snapshot.resources.get(t, ())) for t in PUSH_ORDER},
    }


def _published(p: Published) -> dict[str, Any]:
    return {"snapshot_version": p.snapshot.version, "changed": p.changed}


def _replica_dict(r: Replica, why_not: str | None) -> dict[str, Any]:
    return {
        "replica_id": r.replica_id,
        "model": r.model,
        "version": r.version,
        "host": r.host,
        "port": r.port,
        "key": r.key,
        "routable": why_not is None,
        "why_not": why_not,
    }


def create_app(
    plane: ControlPlane,
    *,
    debug: bool = False,
    admin_token: str | None = None,
    registry: Registry | None = None,
    controller: RolloutDriver | None = None,
) -> FastAPI:
    """The HTTP API over ``plane``; ``debug`` adds the invalid-resource injection endpoints.

    ``admin_token`` guards ``/admin/...`` (None: admin reads open, admin changes refused; see
    :mod:`envoy_control.api.deps`); ``registry`` keeps versions and rollout decisions;
    ``controller`` runs automatic rollouts.
    """
    app = FastAPI(
        title="modelfleet control plane",
        version="1",
        description="xDS control plane of modelfleet: replicas and heartbeats, router state for "
        "gateways, and the admin API (versions, rollouts, aliases, team limits). Admin "
        "endpoints need the admin token as `Authorization: Bearer`; team keys are refused.",
    )
    app.state.admin_credential = AdminCredential(
        admin_token,
        lambda: frozenset(h for t in plane.config.teams for h in t.key_hashes),
    )

    @app.exception_handler(InconsistentSnapshot)
    async def inconsistent(_request: Any, exc: InconsistentSnapshot) -> JSONResponse:
        return JSONResponse(
            status_code=500, content={"detail": {"message": str(exc), "problems": exc.problems}}
        )

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "snapshot_version": plane.snapshot.version}

    @app.put("/v1/replicas/{replica_id}")
    async def put_replica(replica_id: str, body: ReplicaIn) -> dict[str, Any]:
        try:
            replica = Replica(replica_id, body.model, body.version, body.host, body.port)
        except ValueError as exc:
            raise HTTPException(422, str(exc)) from None
        published = _published(plane.put_replica(replica))
        return {"replica": _replica_dict(replica, plane.why_not_routable(replica_id)), **published}

    @app.delete("/v1/replicas/{replica_id}")
    async def delete_replica(replica_id: str) -> dict[str, Any]:
        published = plane.delete_replica(replica_id)
        if published is None:
            raise HTTPException(404, f"replica {replica_id} is not registered")
        return {"deleted": replica_id, **_published(published)}

    @app.get("/v1/replicas")
    async def list_replicas() -> dict[str, Any]:
        replicas = sorted(plane.replicas.values(), key=lambda r: r.replica_id)
        return {
            "replicas": [_replica_dict(r, plane.why_not_routable(r.replica_id)) for r in replicas]
        }

    @app.post("/v1/config/reload")
    async def reload() -> Any:
        try:
            published = plane.reload()
        except ConfigError as exc:
            problems = [p.as_dict() for p in exc.problems]
            return JSONResponse(
                status_code=422,
                content={
                    "detail": {
                        "message": f"config refused; snapshot {plane.snapshot.version} keeps serving",
                        "problems": problems,
                    }
                },
            )
        return {**_published(published), "warnings": [p.as_dict() for p in plane.warnings]}

    @app.get("/v1/xds/status")
    async def xds_status() -> dict[str, Any]:
        snapshot = plane.snapshot
        status = plane.cache.status
        return {
            "snapshot": {**snapshot_summary(snapshot), "published_at": plane.cache.published_at},
            "converged": status.all_acked(snapshot.versions),
            "nodes": status.as_dict(),
        }

    @app.get("/v1/xds/snapshot")
    async def xds_snapshot() -> dict[str, Any]:
        snapshot = plane.snapshot
        return {
            **snapshot_summary(snapshot),
            "names": {SHORT_NAMES[t]: sorted(snapshot.names(t)) for t in PUSH_ORDER},
        }

    add_state_routes(app, plane)
    add_admin_routes(app, plane, registry, controller)
    if debug:
        _add_debug_routes(app, plane)
    return app


def _add_debug_routes(app: FastAPI, plane: ControlPlane) -> None:
    @app.post("/v1/debug/invalid-resource")
    async def inject(body: Annotated[InjectIn | None, Body()] = None) -> dict[str, Any]:
        spec = body or InjectIn()
        type_url = TYPE_BY_SHORT_NAME[spec.type]
        if spec.resource is None:
            if type_url != TYPE_BY_SHORT_NAME["cds"]:
                raise HTTPException(422, "give a resource for types other than cds")
            message = default_invalid_cluster()
        else:
            message = MESSAGE_TYPES[type_url]()
            try:
                json_format.ParseDict(spec.resource, message)
            except json_format.ParseError as exc:
                raise HTTPException(422, f"not a {type(message).__name__}: {exc}") from None
        return {"injected": spec.type, **_published(plane.inject(type_url, message))}

    @app.delete("/v1/debug/invalid-resource")
    async def clear() -> dict[str, Any]:
        return _published(plane.clear_injected())

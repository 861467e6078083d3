"""The admin API (``/admin/...``, behind :func:`envoy_control.api.deps.admin_access`).

| method | path | body | answer |
|---|---|---|---|
| POST | /admin/models/{model}/versions | :class:`VersionIn` | 201 new, 200 same record again; 409 different record; 422 |
| PUT | /admin/models/{model}/rollout | ``{version, stage: shadow\\|canary, percent}`` | the model's routes; 422 |
| PUT | /admin/models/{model}/alias | ``{version}`` | the model's routes; 422 |
| PUT | /admin/teams/{team}/limits | ``{model, tokens_per_minute, max_concurrency, guaranteed_share}`` | the limit; 422 |
| GET | /admin/desired | | the served desired state and the overrides held over the config |
| GET | /admin/models/{model}/versions | | registered versions |
| PUT | /admin/models/{model}/versions/{version}/gate | ``{eval_report?, eval_report_uri?, load_test?}`` | saved with the version; 404 |
| POST | /admin/models/{model}/rollouts | ``{version, hold_s?, window_s?, min_requests?}`` | the controller's rollout; 409 |
| GET | /admin/models/{model}/rollouts | | the current rollout and every recorded decision |

Accepted changes are overrides over the config directory (:mod:`envoy_control.state.overrides`),
published to every Envoy (xDS) and gateway (router state) at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from envoy_control.api.admin_models import (
    AliasIn,
    ConflictBody,
    GateIn,
    LimitIn,
    LimitOut,
    RefusalBody,
    RolloutIn,
    RolloutStartIn,
    RouteOut,
    VersionIn,
    VersionOut,
)
from envoy_control.api.deps import Admin
from envoy_control.registry.records import VersionConflict, identity, record_hash
from envoy_control.registry.store import Registry
from envoy_control.rollouts.driver import RolloutDriver, RolloutError
from envoy_control.state.changes import (
    alias_changes,
    limit_changes,
    rollout_changes,
    version_changes,
)
from envoy_control.state.overrides import Override
from envoy_control.state.plane import ControlPlane, Published
from fastapi import FastAPI, HTTPException
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from modelfleet.config import ConfigError, TeamLimit, Version
from modelfleet.config.desired import desired_data

REFUSED: dict[int | str, dict[str, Any]] = {422: {"model": RefusalBody,
                                                "description": "Refused: nothing changed."}}


def refusal(plane: ControlPlane, problems: list[Any], what: str = "change") -> JSONResponse:
    """422 with every problem; the previous state keeps serving."""
    return JSONResponse(status_code=422, content={"detail": {
        "message": f"{what} refused; snapshot {plane.snapshot.version} keeps serving",
        "problems": [p.as_dict() for p in problems]}})


def add_admin_routes(app: FastAPI, plane: ControlPlane, registry: Registry | None = None,
                     controller: RolloutDriver | None = None,
                     clock: Callable[[], float] = time.time) -> None:
    """Add the admin endpoints (table in the module docstring) to ``app``."""

    def known_model(model: str) -> None:
        if plane.config.model(model) is None:
            raise HTTPException(404, f"model {model} is not declared")

    def commit(changes: list[Override], by: str, model: str | None = None) -> Published | JSONResponse:
        try:
            published = plane.change(changes, f"admin:{by}")
        except ConfigError as exc:
            return refusal(plane, exc.problems)
        if controller is not None and model is not None:
            controller.abort(model, f"manual change by admin:{by}")
        return published

    def route(model: str, published: Published) -> dict[str, Any]:
        m = plane.config.model(model)
        assert m is not None
        return {"model": model, "live": m.live,
                "canary": m.canary.model_dump() if m.canary else None,
                "shadow": m.shadow.model_dump() if m.shadow else None,
                "snapshot_version": published.snapshot.version, "changed": published.changed,
                "router_state_version": current.state_version if (current := plane.router.current) else None,
                "warnings": [p.as_dict() for p in plane.warnings]}

    @app.post("/admin/models/{model}/versions", tags=["admin"], status_code=201,
              response_model=VersionOut, summary="Register a version (immutable)",
              responses={200: {"model": VersionOut, "description": "Registered before, same record."},
                         409: {"model": ConflictBody, "description": "Registered differently."},
                         **REFUSED})
    async def register_version(model: str, body: VersionIn, admin: Admin) -> Any:
        try:
            version = Version(model=model, chat_template_hash=body.template_hash(),
                              **body.model_dump(exclude={"chat_template", "chat_template_hash"}))
        except ValidationError as exc:
            raise HTTPException(422, exc.errors(include_url=False, include_context=False)) from None
        declared = plane.config.version(model, version.version)
        registered = registry.differences(version) if registry is not None else None
        if declared is not None and registered is None:
            mine, theirs = identity(version), identity(declared)
            registered = [(f, theirs[f], mine[f]) for f in mine if mine[f] != theirs[f]]
        if registered:
            conflict = VersionConflict(version.key, registered)
            return JSONResponse(status_code=409, content={"detail": {
                "message": str(conflict), "differences": [
                    {"field": f, "registered": a, "given": b} for f, a, b in registered]}})
        changes = version_changes(plane.desired.declared, version, source=f"admin:{admin.name}",
                                  reason="registered", at=clock())
        created = registered is None and declared is None
        published = commit(changes, admin.name) if changes else Published(plane.snapshot, False)
        if isinstance(published, JSONResponse):
            return published
        out = {"model": model, "version": version.version, "created": created,
               "record_hash": record_hash(identity(version)),
               "status": (plane.config.version(model, version.version) or version).status,
               "snapshot_version": published.snapshot.version}
        return JSONResponse(status_code=201 if created else 200, content=out)

    @app.put("/admin/models/{model}/rollout", tags=["admin"], response_model=RouteOut,
             summary="Put a version at a rollout stage", responses=REFUSED)
    async def put_rollout(model: str, body: RolloutIn, admin: Admin) -> Any:
        known_model(model)
        changes = rollout_changes(plane.config, plane.desired.declared, model, body.version,
                                  body.stage, body.percent, source=f"admin:{admin.name}",
                                  reason=f"{body.stage} {body.percent:g}%", at=clock())
        published = commit(changes, admin.name, model)
        return published if isinstance(published, JSONResponse) else route(model, published)

    @app.put("/admin/models/{model}/alias", tags=["admin"], response_model=RouteOut,
             summary="Point the model name at a version (promote or roll back)", responses=REFUSED)
    async def put_alias(model: str, body: AliasIn, admin: Admin) -> Any:
        known_model(model)
        changes = alias_changes(plane.config, plane.desired.declared, model, body.version,
                                source=f"admin:{admin.name}", reason=f"alias -> {body.version}",
                                at=clock())
        published = commit(changes, admin.name, model)
        return published if isinstance(published, JSONResponse) else route(model, published)

    @app.put("/admin/teams/{team}/limits", tags=["admin"], response_model=LimitOut,
             summary="Set a team's limits on one model", responses=REFUSED)
    async def put_limits(team: str, body: LimitIn, admin: Admin) -> Any:
        found = next((t for t in plane.config.teams if t.name == team), None)
        if found is None:
            raise HTTPException(404, f"team {team} is not declared")
        old = next((x for x in found.limits if x.model == body.model), None)
        tiers = body.tiers or (old.tiers if old else None)
        limit = TeamLimit.model_validate(
            {**body.model_dump(exclude={"tiers"}), **({"tiers": tiers} if tiers else {})})
        changes = limit_changes(plane.desired.declared, team, limit, source=f"admin:{admin.name}",
                                reason="limits", at=clock())
        published = commit(changes, admin.name)
        if isinstance(published, JSONResponse):
            return published
        return {"team": team, "limit": limit.model_dump(mode="json"),
                "snapshot_version": published.snapshot.version, "changed": published.changed}

    @app.get("/admin/desired", tags=["admin"], summary="The served desired state")
    async def get_desired(_: Admin) -> dict[str, Any]:
        desired = plane.desired
        return {**desired_data(desired.served), "snapshot_version": plane.snapshot.version,
                "overrides": [o.as_dict() for o in desired.overrides]}

    @app.get("/admin/models/{model}/versions", tags=["admin"], summary="Registered versions")
    async def list_versions(model: str, _: Admin) -> dict[str, Any]:
        if registry is not None:
            rows = [{k: (v.timestamp() if hasattr(v, "timestamp") else v) for k, v in r.items()}
                    for r in registry.versions(model)]
        else:
            rows = [v.model_dump(mode="json") for v in plane.config.versions_of(model)]
        return {"model": model, "versions": rows}

    @app.put("/admin/models/{model}/versions/{version}/gate", tags=["admin"],
             summary="Save the gate's eval report and load-tested capacity with a version")
    async def save_gate(model: str, version: str, body: GateIn, _: Admin) -> dict[str, Any]:
        if registry is None:
            raise HTTPException(409, "no registry on this control plane")
        lt = body.load_test
        try:
            registry.save_gate(model, version, eval_report=body.eval_report,
                               eval_report_uri=body.eval_report_uri,
                               tokens_per_s=lt.output_tokens_per_s if lt else None,
                               tokens_in_flight=lt.tokens_in_flight if lt else None,
                               streams=lt.streams if lt else None)
        except KeyError:
            raise HTTPException(404, f"{model}@{version} is not registered") from None
        return {"model": model, "version": version, "saved": True}

    @app.post("/admin/models/{model}/rollouts", tags=["admin"], status_code=201,
              summary="Hand a version to the rollout controller",
              responses={409: {"description": "Cannot start: the reason is in `detail`."}})
    async def start_rollout(model: str, body: RolloutStartIn, _: Admin) -> dict[str, Any]:
        known_model(model)
        if controller is None:
            raise HTTPException(409, "no rollout controller: start the control plane with "
                                     "--prometheus-url")
        policy = controller.policy_for(body.hold_s, body.window_s, body.min_requests)
        try:
            r = controller.start(model, body.version, policy)
        except (RolloutError, ConfigError) as exc:
            raise HTTPException(409, str(exc)) from None
        return rollout_view(r)

    @app.get("/admin/models/{model}/rollouts", tags=["admin"], summary="Rollout and decisions")
    async def get_rollouts(model: str, _: Admin) -> dict[str, Any]:
        current = controller.rollouts.get(model) if controller is not None else None
        decisions = controller.decisions(model) if controller is not None else (
            registry.decisions(model) if registry is not None else [])
        return {"model": model, "rollout": rollout_view(current) if current else None,
                "decisions": decisions}


def rollout_view(r: Any) -> dict[str, Any]:
    """A rollout as plain data."""
    return {"model": r.model, "version": r.version, "previous": r.previous,
            "phase": r.phase.value, "stage": asdict(r.stage), "stage_started_s": r.stage_started_s,
            "promoted_s": r.promoted_s, "waiting": r.waiting,
            "stages": [asdict(s) for s in r.policy.stages], "window_s": r.policy.window_s}

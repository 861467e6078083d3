"""The batch API (FastAPI routes): create, read, list and cancel a team's batches.

| method | path | answer |
|---|---|---|
| POST | ``/v1/batches`` | the new batch (``validating``) |
| GET | ``/v1/batches`` | the team's batches, newest first (``limit``, ``after``) |
| GET | ``/v1/batches/{batch_id}`` | status, counts, timestamps |
| POST | ``/v1/batches/{batch_id}/cancel`` | the batch, ``cancelling`` until the worker stops it |

The input is ``input_uri`` (``file://``, ``s3://``) or, as OpenAI's client sends it,
``input_file_id`` of a file uploaded through ``/v1/files`` (:mod:`batch.files_api`);
the answer carries ``input_file_id``, ``output_file_id`` (once the output is written) and
``completion_window`` for that client.

Every route needs ``Authorization: Bearer <team key>`` (:class:`~modelfleet.config.keys.KeyRing`).
A batch belongs to the team whose key created it: any other team gets the same 404 as for an
unknown id. Errors are OpenAI-shaped (:mod:`modelfleet.contract.errors`), raised here at the edge only;
the checks of a new batch are a pure function (:func:`new_batch`).
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Body, Header, Query
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from batch.files import BatchFileError, BatchFiles
from batch.lines import base_model, first_model
from batch.models import ACTIVE, CHAT_ENDPOINT, BatchRecord, BatchStatus, batch_view
from batch.settings import BatchSettings
from batch.store import BatchStore
from batch.uploads import UploadStore, output_file_id, upload_id_of
from modelfleet.config import PlatformConfig, Team
from modelfleet.config.keys import Authenticated, KeyRing, authorize
from modelfleet.contract.errors import ApiError, ErrorType, invalid, not_found

WINDOW = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd])\s*$")
UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
Auth = Annotated[str | None, Header()]
"""The ``Authorization`` header (module level: FastAPI resolves annotations here)."""


class ApiFailure(Exception):
    """An :class:`ApiError` leaving a route; the app's handler answers it as JSON."""

    def __init__(self, error: ApiError) -> None:
        super().__init__(error.message)
        self.error = error


class CreateBatch(BaseModel):
    """``POST /v1/batches``: this API's shape, with OpenAI's ``endpoint``,
    ``completion_window`` and ``metadata`` accepted too."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1, max_length=127)
    input_uri: str = Field(min_length=1, max_length=2048)
    """``file://`` or ``s3://``; or, for a create with ``input_file_id``, the upload's URI."""
    output_uri: str | None = Field(default=None, min_length=1, max_length=2048)
    deadline: float | str | None = None
    """Seconds since the epoch, or an RFC 3339 time with a zone."""
    completion_window: str | None = None
    """Instead of ``deadline``: ``24h``, ``90m``, ``3600s``, ``2d`` from now."""
    endpoint: str = CHAT_ENDPOINT
    metadata: dict[str, Annotated[str, Field(max_length=512)]] = Field(default_factory=dict,
                                                                        max_length=16)


def parse_deadline(body: CreateBatch, now: float, default_window_s: float) -> float | ApiError:
    """The deadline in seconds since the epoch from ``deadline`` or ``completion_window``."""
    if body.deadline is not None and body.completion_window is not None:
        return invalid("Give either deadline or completion_window, not both.", "deadline")
    if body.completion_window is not None:
        match = WINDOW.match(body.completion_window)
        if match is None:
            return invalid("completion_window must look like 24h, 90m, 3600s or 2d.",
                           "completion_window")
        return now + float(match.group(1)) * UNIT_S[match.group(2)]
    if body.deadline is None:
        return now + default_window_s
    if isinstance(body.deadline, str):
        try:
            parsed = datetime.fromisoformat(body.deadline.replace("Z", "+00:00"))
        except ValueError:
            return invalid("deadline must be seconds since the epoch or an RFC 3339 time.",
                           "deadline")
        if parsed.tzinfo is None:
            return invalid("deadline needs a time zone (e.g. 2030-01-01T00:00:00Z).", "deadline")
        return parsed.timestamp()
    return float(body.deadline)


def default_output_uri(input_uri: str) -> str:
    """``…/in.jsonl`` -> ``…/in.output.jsonl`` (any other name: ``.output.jsonl`` appended)."""
    stem = input_uri[:-len(".jsonl")] if input_uri.endswith(".jsonl") else input_uri
    return stem + ".output.jsonl"


def new_batch(body: CreateBatch, team: Team, config: PlatformConfig, files: BatchFiles,
              settings: BatchSettings, now: float,
              batch_id: str | None = None) -> BatchRecord | ApiError:
    """The record of a new batch ``batch_id`` (default: a fresh id) of ``team`` at ``now``
    (seconds), or why it is refused: 404 unknown model, 403 no batch tier on it, 400 for the
    rest. URIs must be the team's (:meth:`BatchFiles.check`)."""
    if body.endpoint != CHAT_ENDPOINT:
        return invalid(f"endpoint must be {CHAT_ENDPOINT}.", "endpoint")
    name, _, version = body.model.partition("@")
    if config.model(name) is None or (version and config.version(name, version) is None):
        return not_found(f"The model '{body.model}' does not exist.")
    allowed = authorize(team, base_model(body.model), "batch")
    if isinstance(allowed, ApiError):
        return allowed
    deadline = parse_deadline(body, now, settings.default_completion_window_s)
    if isinstance(deadline, ApiError):
        return deadline
    if not now < deadline <= now + settings.max_completion_window_s:
        return invalid(f"The deadline must be in the future and at most "
                       f"{settings.max_completion_window_s:.0f} s away.", "deadline")
    output_uri = body.output_uri or default_output_uri(body.input_uri)
    for param, uri in (("input_uri", body.input_uri), ("output_uri", output_uri)):
        try:
            files.check(uri, team.name)
        except BatchFileError as exc:
            return invalid(exc.message, param, exc.code)
    if files.check(output_uri, team.name) == files.check(body.input_uri, team.name):
        return invalid("output_uri must differ from input_uri.", "output_uri")
    return BatchRecord(batch_id=batch_id or f"batch_{uuid.uuid4().hex}", team=team.name,
                       model=body.model,
                       input_uri=body.input_uri, output_uri=output_uri, deadline=deadline,
                       created_at=now, metadata=dict(body.metadata))


def batch_not_found(batch_id: str) -> ApiError:
    """The 404 for an unknown batch or another team's."""
    return not_found(f"No batch found with id '{batch_id[:80]}'.", "batch_id", "batch_not_found")


def window_text(seconds: float) -> str:
    """A completion window as OpenAI writes it: ``24h`` (whole hours), else ``5400s``."""
    whole = round(seconds)
    return f"{whole // 3600}h" if whole % 3600 == 0 else f"{whole}s"


def from_upload(payload: dict[str, Any], team: str, uploads: UploadStore | None,
                files: BatchFiles, batch_id: str) -> dict[str, Any]:
    """A create body with ``input_file_id`` turned into ``input_uri`` (the upload's) and, unless
    given, ``output_uri`` beside it (``<batch_id>.output.jsonl`` in the team's files folder) and
    ``model`` from the file's first line that names one. Raises :class:`ApiFailure` for an
    unknown file (or another team's), a body giving both inputs, a file naming no model."""
    body = dict(payload)
    file_id = body.pop("input_file_id")
    if "input_uri" in body:
        raise ApiFailure(invalid("Give input_file_id or input_uri, not both.", "input_file_id"))
    record = uploads.get(str(file_id), team) if uploads is not None else None
    team_dir = files.team_dir(team)
    if record is None or team_dir is None:
        raise ApiFailure(not_found(f"No such File object: {str(file_id)[:80]}",
                                   "input_file_id", "file_not_found"))
    body["input_uri"] = record.uri
    body.setdefault("output_uri", (team_dir / f"{batch_id}.output.jsonl").as_uri())
    if not body.get("model"):
        try:
            model = first_model(files.read(record.uri, team=team))
        except BatchFileError as exc:
            raise ApiFailure(invalid(exc.message, "input_file_id", exc.code)) from None
        if model is None:
            raise ApiFailure(invalid("No line of the file names a model (body.model).",
                                     "model"))
        body["model"] = model
    return body


def batch_router(store: BatchStore, keys: KeyRing, config: PlatformConfig, files: BatchFiles,
                 settings: BatchSettings, clock: Callable[[], float] = time.time,
                 uploads: UploadStore | None = None) -> APIRouter:
    """The routes over ``store`` (and ``uploads`` for ``input_file_id``); ``clock`` is
    wall-clock seconds. Routes are plain functions (FastAPI runs them in its thread pool: the
    store's calls block)."""
    router = APIRouter()

    def team_of(authorization: str | None) -> Team:
        auth = keys.authenticate(authorization)
        if isinstance(auth, ApiError):
            raise ApiFailure(auth)
        assert isinstance(auth, Authenticated)
        return auth.team

    def view(record: BatchRecord) -> dict[str, Any]:
        out = batch_view(record, store.counts(record.batch_id))
        out.update(input_file_id=upload_id_of(record.input_uri), error_file_id=None,
                   output_file_id=None if record.output_written_at is None
                   else output_file_id(record.batch_id),
                   completion_window=window_text(record.deadline - record.created_at))
        return out

    @router.post("/v1/batches")
    def create(payload: Annotated[Any, Body()], authorization: Auth = None) -> dict[str, Any]:
        team = team_of(authorization)
        batch_id = f"batch_{uuid.uuid4().hex}"
        if isinstance(payload, dict) and "input_file_id" in payload:
            payload = from_upload(payload, team.name, uploads, files, batch_id)
        try:
            body = CreateBatch.model_validate(payload)
        except ValidationError as exc:
            first = exc.errors()[0]
            param = ".".join(str(p) for p in first["loc"]) or None
            raise ApiFailure(invalid(f"{param or 'body'}: {first['msg']}", param)) from None
        record = new_batch(body, team, config, files, settings, clock(), batch_id)
        if isinstance(record, ApiError):
            raise ApiFailure(record)
        store.insert(record)
        return view(record)

    @router.get("/v1/batches")
    def list_batches(authorization: Auth = None,
                     limit: Annotated[int, Query(ge=1, le=100)] = 20,
                     after: str | None = None) -> dict[str, Any]:
        team = team_of(authorization)
        records = store.list_team(team.name, limit + 1, after)
        data = [view(r) for r in records[:limit]]
        return {"object": "list", "data": data, "has_more": len(records) > limit,
                "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None}

    @router.get("/v1/batches/{batch_id}")
    def get(batch_id: str, authorization: Auth = None) -> dict[str, Any]:
        team = team_of(authorization)
        record = store.get(batch_id, team.name)
        if record is None:
            raise ApiFailure(batch_not_found(batch_id))
        return view(record)

    @router.post("/v1/batches/{batch_id}/cancel")
    def cancel(batch_id: str, authorization: Auth = None) -> dict[str, Any]:
        team = team_of(authorization)
        record = store.request_cancel(batch_id, team.name, clock())
        if record is None:
            raise ApiFailure(batch_not_found(batch_id))
        if record.status not in (*ACTIVE, BatchStatus.CANCELLED) or (
                record.status is BatchStatus.FINALIZING):
            raise ApiFailure(ApiError(409, ErrorType.INVALID_REQUEST,
                                      f"Cannot cancel a batch that is {record.status}.",
                                      "batch_not_cancellable", "batch_id"))
        return view(record)

    return router

"""The ``/v1/files`` routes (FastAPI) that OpenAI's client uses around batches:

| method | path | answer |
|---|---|---|
| POST | ``/v1/files`` (multipart ``file``, ``purpose=batch``) | the file object |
| GET | ``/v1/files`` | the team's uploads, newest first (``limit``) |
| GET | ``/v1/files/{file_id}`` | the file object (an upload, or a batch's output) |
| GET | ``/v1/files/{file_id}/content`` | the content (JSONL) |
| DELETE | ``/v1/files/{file_id}`` | ``{id, object: file, deleted: true}`` (uploads only) |

Team key auth as for batches; a file belongs to its team and any other team gets the same 404 as
for an unknown id (:mod:`batch.uploads`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, File, Form, Query, UploadFile
from starlette.responses import Response

from batch.api import ApiFailure, Auth
from batch.files import BatchFileError, BatchFiles, atomic_write
from batch.settings import BatchSettings
from batch.store import BatchStore
from batch.uploads import (
    FILE_PURPOSE,
    OUTPUT_PURPOSE,
    FileRecord,
    UploadStore,
    batch_of_output,
    file_view,
    new_file_id,
    record_view,
)
from modelfleet.config.keys import Authenticated, KeyRing
from modelfleet.contract.errors import ApiError, invalid, not_found

CHUNK_BYTES = 1024 * 1024


def file_not_found(file_id: str) -> ApiError:
    """The 404 for an unknown file or another team's."""
    return not_found(f"No such File object: {file_id[:80]}", "file_id", "file_not_found")


def files_router(uploads: UploadStore, store: BatchStore, keys: KeyRing, files: BatchFiles,
                 settings: BatchSettings, clock: Callable[[], float] = time.time) -> APIRouter:
    """The routes over ``uploads`` (and ``store`` for batch outputs); ``clock``: wall seconds."""
    router = APIRouter()

    def team_of(authorization: str | None) -> str:
        auth = keys.authenticate(authorization)
        if isinstance(auth, ApiError):
            raise ApiFailure(auth)
        assert isinstance(auth, Authenticated)
        return auth.team.name

    def output_of(file_id: str, team: str) -> tuple[dict[str, Any], str] | None:
        batch_id = batch_of_output(file_id)
        record = store.get(batch_id, team) if batch_id else None
        if record is None or record.output_written_at is None:
            return None
        name = record.output_uri.rsplit("/", 1)[-1]
        return {"filename": name, "created_at": record.output_written_at}, record.output_uri

    def read(uri: str, team: str) -> bytes:
        try:
            return files.read(uri, settings.max_input_bytes * 4, team)
        except BatchFileError as exc:
            raise ApiFailure(not_found(exc.message, "file_id", exc.code)) from None

    @router.post("/v1/files")
    async def upload(file: Annotated[UploadFile, File()], purpose: Annotated[str, Form()],
                     authorization: Auth = None) -> dict[str, Any]:
        team = team_of(authorization)
        if purpose != FILE_PURPOSE:
            raise ApiFailure(invalid(f"purpose must be '{FILE_PURPOSE}' here.", "purpose"))
        chunks, size = [], 0
        while chunk := await file.read(CHUNK_BYTES):
            size += len(chunk)
            if size > settings.max_input_bytes:
                raise ApiFailure(invalid(f"The file is over {settings.max_input_bytes} bytes.",
                                         "file", "file_too_large"))
            chunks.append(chunk)
        team_dir = files.team_dir(team)
        assert team_dir is not None
        file_id = new_file_id()
        path = team_dir / f"{file_id}.jsonl"
        await asyncio.to_thread(atomic_write, path, b"".join(chunks))
        record = FileRecord(file_id, team, (file.filename or "upload.jsonl")[:255], purpose,
                            size, clock(), path.as_uri())
        await asyncio.to_thread(uploads.insert, record)
        return record_view(record)

    @router.get("/v1/files")
    def list_files(authorization: Auth = None,
                   limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000) -> dict[str, Any]:
        team = team_of(authorization)
        data = [record_view(r) for r in uploads.list_team(team, limit + 1)]
        return {"object": "list", "data": data[:limit], "has_more": len(data) > limit}

    @router.get("/v1/files/{file_id}")
    def get_file(file_id: str, authorization: Auth = None) -> dict[str, Any]:
        team = team_of(authorization)
        record = uploads.get(file_id, team)
        if record is not None:
            return record_view(record)
        found = output_of(file_id, team)
        if found is None:
            raise ApiFailure(file_not_found(file_id))
        meta, uri = found
        return file_view(file_id, len(read(uri, team)), meta["created_at"], meta["filename"],
                         OUTPUT_PURPOSE)

    @router.get("/v1/files/{file_id}/content")
    def content(file_id: str, authorization: Auth = None) -> Response:
        team = team_of(authorization)
        record = uploads.get(file_id, team)
        found = output_of(file_id, team) if record is None else None
        if record is None and found is None:
            raise ApiFailure(file_not_found(file_id))
        uri = record.uri if record is not None else found[1] if found else ""
        return Response(read(uri, team), media_type="application/jsonl")

    @router.delete("/v1/files/{file_id}")
    def delete_file(file_id: str, authorization: Auth = None) -> dict[str, Any]:
        team = team_of(authorization)
        record = uploads.get(file_id, team)
        if record is None or not uploads.delete(file_id, team):
            raise ApiFailure(file_not_found(file_id))
        location = files.check(record.uri, team)
        if location.path is not None:
            location.path.unlink(missing_ok=True)
        return {"id": file_id, "object": "file", "deleted": True}

    return router

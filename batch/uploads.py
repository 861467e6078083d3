"""Files uploaded through ``/v1/files`` (OpenAI's file objects), for batches made with
``input_file_id``: one row per file in ``<prefix>files`` (the metering database), the content on
disk at ``<files_dir>/<team>/<file_id>.jsonl`` (written atomically).

A batch's output is a file too, without a row of its own: its id is :func:`output_file_id` of
the batch (``file-`` + the batch id), readable once the output is written, by the batch's team
only. Ids are random (``file-`` + 32 hex digits); every lookup names the team, so another team's
id reads as unknown.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from sqlalchemy import (
    Engine,
    MetaData,
    delete,
    select,
)

from batch.tables import files_table

FILE_PURPOSE = "batch"
OUTPUT_PURPOSE = "batch_output"
UPLOAD_NAME = re.compile(r"^(file-[0-9a-f]{32})\.jsonl$")
OUTPUT_PREFIX = "file-"


def new_file_id() -> str:
    """A fresh upload id."""
    return f"file-{uuid.uuid4().hex}"


def output_file_id(batch_id: str) -> str:
    """The file id of ``batch_id``'s output."""
    return OUTPUT_PREFIX + batch_id


def batch_of_output(file_id: str) -> str | None:
    """The batch whose output ``file_id`` is, or None for any other id."""
    rest = file_id[len(OUTPUT_PREFIX):] if file_id.startswith(OUTPUT_PREFIX) else ""
    return rest if rest.startswith("batch_") else None


def upload_id_of(uri: str) -> str | None:
    """The upload id of an input URI that names an uploaded file (its file name), else None."""
    match = UPLOAD_NAME.match(Path(unquote(urlparse(uri).path)).name)
    return match.group(1) if match else None


@dataclass(frozen=True, slots=True)
class FileRecord:
    """An uploaded file: ``bytes`` its size, ``created_at`` seconds since the epoch, ``uri``
    where its content lives."""

    file_id: str
    team: str
    filename: str
    purpose: str
    bytes: int
    created_at: float
    uri: str


def file_view(file_id: str, size: int, created_at: float, filename: str,
              purpose: str) -> dict[str, Any]:
    """OpenAI's file object (``created_at`` whole seconds)."""
    return {"id": file_id, "object": "file", "bytes": size, "created_at": int(created_at),
            "filename": filename, "purpose": purpose, "status": "processed",
            "status_details": None}


def record_view(record: FileRecord) -> dict[str, Any]:
    """The file object of an upload."""
    return file_view(record.file_id, record.bytes, record.created_at, record.filename,
                     record.purpose)


class UploadStore:
    """The ``<prefix>files`` table on ``engine`` (the batch store's, which creates and migrates it
    with the other batch tables: :meth:`batch.store.BatchStore.create_tables`)."""

    def __init__(self, engine: Engine, table_prefix: str) -> None:
        self.engine = engine
        self.files = files_table(MetaData(), table_prefix)

    def insert(self, record: FileRecord) -> None:
        """Store a new upload's row."""
        with self.engine.begin() as conn:
            conn.execute(self.files.insert().values(**asdict(record)))

    def get(self, file_id: str, team: str) -> FileRecord | None:
        """``team``'s upload ``file_id`` (None: unknown, or another team's)."""
        query = select(self.files).where(self.files.c.file_id == file_id,
                                         self.files.c.team == team)
        with self.engine.connect() as conn:
            row = conn.execute(query).mappings().first()
        return None if row is None else FileRecord(**dict(row))

    def list_team(self, team: str, limit: int) -> list[FileRecord]:
        """``team``'s uploads, newest first, at most ``limit``."""
        query = (select(self.files).where(self.files.c.team == team)
                 .order_by(self.files.c.created_at.desc(), self.files.c.file_id).limit(limit))
        with self.engine.connect() as conn:
            return [FileRecord(**dict(r)) for r in conn.execute(query).mappings()]

    def delete(self, file_id: str, team: str) -> bool:
        """Forget ``team``'s upload ``file_id``; False if there was none."""
        with self.engine.begin() as conn:
            result = conn.execute(delete(self.files).where(self.files.c.file_id == file_id,
                                                           self.files.c.team == team))
        return bool(result.rowcount)

"""The batch tables' Alembic history (``versions/``), run in code at start by
:func:`modelfleet.db.run_migrations` under the version table ``<prefix>alembic_batch`` (in the metering
database, beside the usage history's ``<prefix>alembic_usage``).

Revisions: ``batch0001`` ``<prefix>batches`` and ``<prefix>batch_lines`` as first released;
``batch0002`` ``<prefix>files`` (uploads through ``/v1/files``). Both predate Alembic: :func:`detect`
recognises their tables (see :class:`modelfleet.db.History`).
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Connection

from modelfleet import db


def detect(conn: Connection, prefix: str) -> str | None:
    """``batch0002`` when the batch tables and the files table are there, ``batch0001`` with the
    batch tables alone, None when one of those is missing."""
    if not db.has_tables(conn, f"{prefix}batches", f"{prefix}batch_lines"):
        return None
    return "batch0002" if db.has_tables(conn, f"{prefix}files") else "batch0001"


HISTORY = db.History(Path(__file__).resolve().parent, "batch", detect,
                     frozenset({"batch0001", "batch0002"}))

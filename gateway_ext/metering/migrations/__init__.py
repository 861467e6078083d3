"""The usage tables' Alembic history (``versions/``), run in code at start by
:func:`modelfleet.db.run_migrations` under the version table ``<prefix>alembic_usage``.

Revisions: ``usage0001`` the first two tables (``<prefix>usage`` keyed by team, model, version,
region, minute; ``<prefix>usage_batches``); ``usage0002`` the ``tier`` column (default
``standard``) in the usage table's key. Both predate Alembic: :func:`detect` tells them apart by
the tables' shape (see :class:`modelfleet.db.History`).
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Connection, inspect

from modelfleet import db


def detect(conn: Connection, prefix: str) -> str | None:
    """``usage0002`` when both tables are there and the usage table has ``tier``, ``usage0001``
    when it has not, None when a table is missing."""
    usage = f"{prefix}usage"
    if not db.has_tables(conn, usage, f"{prefix}usage_batches"):
        return None
    columns = {c["name"] for c in inspect(conn).get_columns(usage)}
    return "usage0002" if "tier" in columns else "usage0001"


HISTORY = db.History(Path(__file__).resolve().parent, "usage", detect,
                     frozenset({"usage0001", "usage0002"}))

"""The registry's Alembic history (``versions/``), run in code at start by :func:`modelfleet.db.run_migrations`
under the version table ``<prefix>alembic_registry``.

Revisions: ``reg0001`` the seven tables as first released (``rollouts`` without ``previous``);
``reg0002`` the nullable ``rollouts.previous``. Both predate Alembic: :func:`detect` tells them
apart by the tables' shape (see :class:`modelfleet.db.History`).
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Connection, inspect

from modelfleet import db

TABLES = ("models", "model_versions", "pools", "rollouts", "teams", "team_limits",
          "desired_overrides")
"""The registry's table names without their prefix."""


def detect(conn: Connection, prefix: str) -> str | None:
    """``reg0002`` when every table is there and ``rollouts`` has ``previous``, ``reg0001``
    when it has not, None when a table is missing."""
    if not db.has_tables(conn, *(prefix + t for t in TABLES)):
        return None
    columns = {c["name"] for c in inspect(conn).get_columns(f"{prefix}rollouts")}
    return "reg0002" if "previous" in columns else "reg0001"


HISTORY = db.History(Path(__file__).resolve().parent, "registry", detect,
                     frozenset({"reg0001", "reg0002"}))

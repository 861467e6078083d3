"""The batch tables (SQLAlchemy Core), in the metering database, named with its prefix:

* ``<prefix>batches``: one row per batch: team, model, URIs, status, deadline, timestamps
  (seconds since the epoch, floats), whole-file ``errors`` and ``metadata`` (JSON text), the
  worker's progress fields (``deadline_risk``, ``tier``, ``paused_until``, ``throttled``) and
  its lease (``lease_owner``, ``lease_until``).
* ``<prefix>batch_lines``: one row per input line (``batch_id``, ``line_no``): ``custom_id``,
  ``state`` (:class:`~batch.models.LineState`), the ``request`` body to send (JSON
  text) and, once there is one, the ``result``: the line's whole output line (JSON text). The
  output file is written from these rows at the end, so a result is kept exactly once.
* ``<prefix>files``: one row per file uploaded through ``/v1/files`` (:mod:`batch.uploads`):
  team, name, purpose, size in bytes, upload time and the URI of its content.

These declarations are the head revision's shape, for queries: the tables are created and
upgraded by the Alembic history in :mod:`batch.migrations` (a change here needs a new revision
there).
"""

from __future__ import annotations

from sqlalchemy import Column, Float, Index, Integer, MetaData, String, Table, Text


def batch_tables(metadata: MetaData, prefix: str) -> tuple[Table, Table]:
    """The ``batches`` and ``batch_lines`` tables with ``prefix``, added to ``metadata``."""
    batches = Table(
        f"{prefix}batches", metadata,
        Column("batch_id", String(64), primary_key=True),
        Column("team", String(63), nullable=False, index=True),
        Column("model", String(127), nullable=False),
        Column("endpoint", String(64), nullable=False),
        Column("input_uri", Text, nullable=False),
        Column("output_uri", Text, nullable=False),
        Column("status", String(16), nullable=False, index=True),
        Column("deadline", Float, nullable=False),
        Column("created_at", Float, nullable=False),
        *(Column(name, Float, nullable=True) for name in (
            "in_progress_at", "finalizing_at", "completed_at", "failed_at", "expired_at",
            "cancelling_at", "cancelled_at", "output_written_at")),
        Column("errors", Text, nullable=False, default="[]"),
        Column("metadata", Text, nullable=False, default="{}"),
        Column("deadline_risk", String(16), nullable=True),
        Column("tier", String(16), nullable=False, default="batch"),
        Column("paused_until", Float, nullable=True),
        Column("throttled", Integer, nullable=False, default=0),
        Column("lease_owner", String(255), nullable=True),
        Column("lease_until", Float, nullable=True),
    )
    lines = Table(
        f"{prefix}batch_lines", metadata,
        Column("batch_id", String(64), primary_key=True),
        Column("line_no", Integer, primary_key=True),
        Column("custom_id", String(512), nullable=True),
        Column("state", String(16), nullable=False),
        Column("request", Text, nullable=True),
        Column("result", Text, nullable=True),
        Column("attempts", Integer, nullable=False, default=0),
        Column("updated_at", Float, nullable=False),
        Index(f"ix_{prefix}batch_lines_state", "batch_id", "state"),
    )
    return batches, lines


def files_table(metadata: MetaData, prefix: str) -> Table:
    """The ``files`` table (uploads for ``/v1/files``) with ``prefix``, added to ``metadata``."""
    return Table(
        f"{prefix}files", metadata,
        Column("file_id", String(64), primary_key=True),
        Column("team", String(63), nullable=False, index=True),
        Column("filename", String(255), nullable=False),
        Column("purpose", String(32), nullable=False),
        Column("bytes", Integer, nullable=False),
        Column("created_at", Float, nullable=False),
        Column("uri", Text, nullable=False),
    )

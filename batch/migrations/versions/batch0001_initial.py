"""batch0001: ``<prefix>batches`` (indexed by team and status) and ``<prefix>batch_lines``
(indexed by batch and state), as first released. Predates Alembic: a table already there is
left as it is.

Revision ID: batch0001
Revises: (none)
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from modelfleet.db import migration_prefix

revision = "batch0001"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None

STAMPS = ("in_progress_at", "finalizing_at", "completed_at", "failed_at", "expired_at",
          "cancelling_at", "cancelled_at", "output_written_at")


def _missing(name: str) -> bool:
    """True unless ``name`` exists (a database from before Alembic may have it already)."""
    return not sa.inspect(op.get_bind()).has_table(name)


def upgrade() -> None:
    p = migration_prefix()
    if _missing(f"{p}batches"):
        _create_batches(f"{p}batches", p)
    if _missing(f"{p}batch_lines"):
        _create_lines(f"{p}batch_lines", p)


def _create_batches(name: str, p: str) -> None:
    op.create_table(
        name,
        sa.Column("batch_id", sa.String(64), primary_key=True),
        sa.Column("team", sa.String(63), nullable=False),
        sa.Column("model", sa.String(127), nullable=False),
        sa.Column("endpoint", sa.String(64), nullable=False),
        sa.Column("input_uri", sa.Text, nullable=False),
        sa.Column("output_uri", sa.Text, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("deadline", sa.Float, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        *(sa.Column(c, sa.Float, nullable=True) for c in STAMPS),
        sa.Column("errors", sa.Text, nullable=False),
        sa.Column("metadata", sa.Text, nullable=False),
        sa.Column("deadline_risk", sa.String(16), nullable=True),
        sa.Column("tier", sa.String(16), nullable=False),
        sa.Column("paused_until", sa.Float, nullable=True),
        sa.Column("throttled", sa.Integer, nullable=False),
        sa.Column("lease_owner", sa.String(255), nullable=True),
        sa.Column("lease_until", sa.Float, nullable=True),
    )
    op.create_index(f"ix_{p}batches_team", name, ["team"])
    op.create_index(f"ix_{p}batches_status", name, ["status"])


def _create_lines(name: str, p: str) -> None:
    op.create_table(
        name,
        sa.Column("batch_id", sa.String(64), primary_key=True),
        sa.Column("line_no", sa.Integer, primary_key=True),
        sa.Column("custom_id", sa.String(512), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("request", sa.Text, nullable=True),
        sa.Column("result", sa.Text, nullable=True),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
    op.create_index(f"ix_{p}batch_lines_state", name, ["batch_id", "state"])


def downgrade() -> None:
    p = migration_prefix()
    op.drop_table(f"{p}batch_lines")  # with its indexes
    op.drop_table(f"{p}batches")

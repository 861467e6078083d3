"""batch0002: ``<prefix>files``, the uploads of ``/v1/files`` (indexed by team). Predates Alembic
(the upload store created it): a table already there is left as it is.

Revision ID: batch0002
Revises: batch0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from modelfleet.db import migration_prefix

revision = "batch0002"
down_revision: str | None = "batch0001"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    p = migration_prefix()
    name = f"{p}files"
    if sa.inspect(op.get_bind()).has_table(name):
        return
    op.create_table(
        name,
        sa.Column("file_id", sa.String(64), primary_key=True),
        sa.Column("team", sa.String(63), nullable=False),
        sa.Column("filename", sa.String(255), nullable=False),
        sa.Column("purpose", sa.String(32), nullable=False),
        sa.Column("bytes", sa.Integer, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("uri", sa.Text, nullable=False),
    )
    op.create_index(f"ix_{p}files_team", name, ["team"])


def downgrade() -> None:
    op.drop_table(f"{migration_prefix()}files")  # with its index

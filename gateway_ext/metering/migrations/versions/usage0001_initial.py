"""usage0001: ``<prefix>usage`` keyed by (team, model, version, region, minute) with the six
counters, and ``<prefix>usage_batches`` (the id of every batch written). Predates Alembic: a
table already there is left as it is.

Revision ID: usage0001
Revises: (none)
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from modelfleet.db import migration_prefix

revision = "usage0001"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None

COUNTERS = ("prompt_tokens", "cached_tokens", "output_tokens", "requests", "rejected_429",
            "shed_503")


def _missing(name: str) -> bool:
    """True unless ``name`` exists (a database from before Alembic may have it already)."""
    return not sa.inspect(op.get_bind()).has_table(name)


def upgrade() -> None:
    prefix = migration_prefix()
    if _missing(f"{prefix}usage"):
        _create_usage(f"{prefix}usage")
    if _missing(f"{prefix}usage_batches"):
        op.create_table(
            f"{prefix}usage_batches",
            sa.Column("batch_id", sa.String(64), primary_key=True),
            sa.Column("rows", sa.Integer, nullable=False),
            sa.Column("written_at", sa.DateTime(timezone=True), nullable=False),
        )


def _create_usage(name: str) -> None:
    op.create_table(
        name,
        sa.Column("team", sa.String(63), primary_key=True),
        sa.Column("model", sa.String(63), primary_key=True),
        sa.Column("version", sa.String(63), primary_key=True),
        sa.Column("region", sa.String(63), primary_key=True),
        sa.Column("minute", sa.DateTime(timezone=True), primary_key=True),
        *(sa.Column(c, sa.BigInteger, nullable=False) for c in COUNTERS),
    )


def downgrade() -> None:
    prefix = migration_prefix()
    op.drop_table(f"{prefix}usage_batches")
    op.drop_table(f"{prefix}usage")

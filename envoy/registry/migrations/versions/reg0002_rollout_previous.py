"""reg0002: ``rollouts.previous`` (``VARCHAR(63)``, nullable): the version a rollout replaced.
Older rows keep NULL (the live alias stands in for them). Predates Alembic: a ``rollouts``
table that has ``previous`` already is left as it is.

Revision ID: reg0002
Revises: reg0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from modelfleet.db import migration_prefix

revision = "reg0002"
down_revision: str | None = "reg0001"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    table = f"{migration_prefix()}rollouts"
    if all(c["name"] != "previous" for c in sa.inspect(op.get_bind()).get_columns(table)):
        op.add_column(table, sa.Column("previous", sa.String(63)))


def downgrade() -> None:
    with op.batch_alter_table(f"{migration_prefix()}rollouts") as batch:
        batch.drop_column("previous")

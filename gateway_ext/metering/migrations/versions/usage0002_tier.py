"""usage0002: ``tier`` (``VARCHAR(16) NOT NULL DEFAULT 'standard'``) in ``<prefix>usage`` and its
key, so rows of one team, model and minute in different tiers are kept apart; older rows read as
``standard``.

Postgres alters the table in place (add the column, drop and re-add the primary key); SQLite
cannot change a primary key, so Alembic's batch mode copies the rows into the new shape. The
primary key is named ``<table>_pkey`` (Postgres's own default name) on both. Predates Alembic:
a usage table that has ``tier`` already is left as it is.

Revision ID: usage0002
Revises: usage0001
"""

from __future__ import annotations

from typing import Literal

import sqlalchemy as sa
from alembic import op
from sqlalchemy.schema import SchemaItem

from modelfleet.db import migration_prefix

revision = "usage0002"
down_revision: str | None = "usage0001"
branch_labels: str | None = None
depends_on: str | None = None

COUNTERS = ("prompt_tokens", "cached_tokens", "output_tokens", "requests", "rejected_429",
            "shed_503")
KEY_BEFORE = ("team", "model", "version", "region", "minute")
KEY = ("team", "model", "version", "region", "tier", "minute")


def _columns(pk: str, tiered: bool) -> list[SchemaItem]:
    """The columns of ``<prefix>usage`` before (``tiered`` False) or after this revision, its
    key named ``pk``."""
    key: list[SchemaItem] = [sa.Column(c, sa.String(63), nullable=False)
                              for c in KEY_BEFORE[:-1]]
    if tiered:
        key.append(sa.Column("tier", sa.String(16), nullable=False, server_default="standard"))
    return [
        *key,
        sa.Column("minute", sa.DateTime(timezone=True), nullable=False),
        *(sa.Column(c, sa.BigInteger, nullable=False) for c in COUNTERS),
        sa.PrimaryKeyConstraint(*(KEY if tiered else KEY_BEFORE), name=pk),
    ]


def _shape(name: str, pk: str, tiered: bool) -> sa.Table:
    """The table batch mode copies from on SQLite (no reflection)."""
    return sa.Table(name, sa.MetaData(), *_columns(pk, tiered))


def _pk_name(table: str) -> str:
    found = sa.inspect(op.get_bind()).get_pk_constraint(table).get("name")
    return str(found) if found else f"{table}_pkey"


def _recreate() -> Literal["always", "never"]:
    """SQLite copies the table into its new shape; Postgres alters it in place."""
    return "always" if op.get_context().dialect.name == "sqlite" else "never"


def upgrade() -> None:
    table = f"{migration_prefix()}usage"
    if any(c["name"] == "tier" for c in sa.inspect(op.get_bind()).get_columns(table)):
        return
    pk = _pk_name(table)
    with op.batch_alter_table(table, recreate=_recreate(),
                              copy_from=_shape(table, pk, tiered=False)) as batch:
        batch.add_column(sa.Column("tier", sa.String(16), nullable=False,
                                   server_default="standard"),
                         # ALTER can only append a column; a copied table keeps the key's order
                         insert_before="minute" if _recreate() == "always" else None)
        batch.drop_constraint(pk, type_="primary")
        batch.create_primary_key(f"{table}_pkey", list(KEY))


def downgrade() -> None:
    """Back to one row per (team, model, version, region, minute): the tiers' counters summed."""
    table = f"{migration_prefix()}usage"
    pk = _pk_name(table)
    merged = op.create_table(f"{table}__merged", *_columns(f"{table}__merged_pkey", False))
    columns = [*KEY_BEFORE, *COUNTERS]
    current = sa.table(table, *(sa.column(c) for c in (*KEY, *COUNTERS)))
    op.execute(sa.insert(merged).from_select(columns, sa.select(
        *(current.c[c] for c in KEY_BEFORE), *(sa.func.sum(current.c[c]) for c in COUNTERS),
    ).group_by(*(current.c[c] for c in KEY_BEFORE))))
    op.execute(sa.delete(current))
    with op.batch_alter_table(table, recreate=_recreate(),
                              copy_from=_shape(table, pk, tiered=True)) as batch:
        batch.drop_constraint(pk, type_="primary")
        batch.drop_column("tier")
        batch.create_primary_key(f"{table}_pkey", list(KEY_BEFORE))
    op.execute(sa.insert(sa.table(table, *(sa.column(c) for c in columns))).from_select(
        columns, sa.select(*(merged.c[c] for c in columns))))
    op.drop_table(merged.name)

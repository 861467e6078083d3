"""reg0001: the registry's tables as first released: ``models``, ``model_versions``, ``pools``,
``rollouts`` (without ``previous``), ``teams``, ``team_limits``, ``desired_overrides``, each
named ``<prefix><table>``. Predates Alembic: a table already there is left as it is.

Revision ID: reg0001
Revises: (none)
"""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from alembic import op
from sqlalchemy.schema import SchemaItem

from modelfleet.db import migration_prefix

revision = "reg0001"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None

NAME = 63
def _when(name: str, nullable: bool = False) -> sa.Column[datetime]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def _missing(name: str) -> bool:
    """True unless ``name`` exists (a database from before Alembic may have it already)."""
    return not sa.inspect(op.get_bind()).has_table(name)


def upgrade() -> None:
    p = migration_prefix()
    for name, items in _tables(p).items():
        if _missing(name):
            op.create_table(name, *items)
            if name == f"{p}rollouts":
                op.create_index(f"ix_{p}rollouts_model", name, ["model"])


def _tables(p: str) -> dict[str, list[SchemaItem]]:
    """Every table's columns by name, in creation order."""
    return {
        f"{p}models": [
            sa.Column("model", sa.String(NAME), primary_key=True),
            sa.Column("live_version", sa.String(NAME), nullable=False),
            sa.Column("canary_version", sa.String(NAME)),
            sa.Column("canary_percent", sa.Float, nullable=False),
            sa.Column("shadow_version", sa.String(NAME)),
            sa.Column("shadow_fraction", sa.Float, nullable=False),
            sa.Column("task", sa.String(32), nullable=False),
            sa.Column("max_output_tokens", sa.Integer, nullable=False),
            _when("updated_at"),
        ],
        f"{p}model_versions": [
            sa.Column("model", sa.String(NAME), primary_key=True),
            sa.Column("version", sa.String(NAME), primary_key=True),
            sa.Column("weights_uri", sa.Text, nullable=False),
            *(sa.Column(c, sa.String(80), nullable=False)
              for c in ("weights_hash", "tokenizer_hash", "chat_template_hash")),
            sa.Column("precision", sa.String(8), nullable=False),
            sa.Column("gpu_type", sa.String(32), nullable=False),
            sa.Column("gpus_per_replica", sa.Integer, nullable=False),
            sa.Column("engine", sa.String(16), nullable=False),
            sa.Column("engine_config", sa.JSON, nullable=False),
            sa.Column("architecture", sa.JSON, nullable=False),
            sa.Column("record_hash", sa.String(80), nullable=False),
            sa.Column("eval_report_uri", sa.Text),
            sa.Column("eval_report", sa.JSON),
            sa.Column("load_test_tokens_per_s", sa.Float, nullable=False),
            sa.Column("load_test_tokens_in_flight", sa.BigInteger, nullable=False),
            sa.Column("load_test_streams", sa.Integer, nullable=False),
            sa.Column("capacity_measured", sa.Boolean, nullable=False),
            sa.Column("status", sa.String(16), nullable=False),
            _when("registered_at"),
            sa.Column("registered_by", sa.String(128), nullable=False),
        ],
        f"{p}pools": [
            *(sa.Column(c, sa.String(NAME), primary_key=True)
              for c in ("model", "version", "region")),
            sa.Column("min_replicas", sa.Integer, nullable=False),
            sa.Column("max_replicas", sa.Integer, nullable=False),
            _when("released_at", nullable=True),
        ],
        f"{p}rollouts": [
            sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
            sa.Column("model", sa.String(NAME), nullable=False),
            sa.Column("version", sa.String(NAME), nullable=False),
            sa.Column("stage", sa.String(32), nullable=False),
            sa.Column("percent", sa.Float, nullable=False),
            _when("started_at"),
            _when("decided_at"),
            sa.Column("decision", sa.String(16), nullable=False),
            sa.Column("reasons", sa.JSON, nullable=False),
            sa.Column("guard_metrics", sa.JSON),
            sa.Column("source", sa.String(128), nullable=False),
        ],
        f"{p}teams": [
            sa.Column("team", sa.String(NAME), primary_key=True),
            sa.Column("name", sa.Text, nullable=False),
        ],
        f"{p}team_limits": [
            sa.Column("team", sa.String(NAME), primary_key=True),
            sa.Column("model", sa.String(NAME), primary_key=True),
            sa.Column("tokens_per_minute", sa.BigInteger, nullable=False),
            sa.Column("max_concurrency", sa.Integer, nullable=False),
            sa.Column("guaranteed_share", sa.Float, nullable=False),
            sa.Column("tiers", sa.JSON, nullable=False),
        ],
        f"{p}desired_overrides": [
            sa.Column("kind", sa.String(16), primary_key=True),
            sa.Column("target", sa.String(160), primary_key=True),
            sa.Column("value", sa.JSON),
            sa.Column("base", sa.JSON),
            sa.Column("source", sa.String(128), nullable=False),
            sa.Column("reason", sa.Text, nullable=False),
            sa.Column("at", sa.Float, nullable=False),
        ],
    }


def downgrade() -> None:
    p = migration_prefix()
    for name in reversed(list(_tables(p))):
        op.drop_table(name)  # with its indexes

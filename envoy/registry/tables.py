"""The registry's tables (the seed's ``models``, ``model_versions``, ``pools``, ``rollouts``,
``teams``, ``team_limits``, plus ``desired_overrides``), named with a prefix (default ``mf_``)
so that tests and other data never collide. Times are ``DateTime(timezone=True)`` in UTC.
These declarations are the head revision's shape, for queries: the tables are created and
upgraded by the Alembic history in :mod:`envoy_control.registry.migrations` (a change here needs
a new revision there).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    Integer,
    MetaData,
    String,
    Table,
    Text,
)

IDENTITY_FIELDS = (
    "weights_uri", "weights_hash", "tokenizer_hash", "chat_template_hash", "precision",
    "gpu_type", "gpus_per_replica", "engine", "engine_config", "architecture",
)
"""What a version *is*: registering it again with any of these different is refused. Status
(lifecycle), the gate's capacity and eval report are facts about it, recorded later."""


@dataclass(frozen=True)
class RegistryTables:
    """Every registry table on one ``MetaData``."""

    metadata: MetaData
    models: Table
    versions: Table
    pools: Table
    rollouts: Table
    teams: Table
    team_limits: Table
    overrides: Table


def make_tables(prefix: str = "mf_") -> RegistryTables:
    """The registry's tables, each named ``<prefix><table>``."""
    md = MetaData()
    name = 63
    models = Table(
        f"{prefix}models", md,
        Column("model", String(name), primary_key=True),
        Column("live_version", String(name), nullable=False),
        Column("canary_version", String(name)),
        Column("canary_percent", Float, nullable=False, default=0.0),
        Column("shadow_version", String(name)),
        Column("shadow_fraction", Float, nullable=False, default=0.0),
        Column("task", String(32), nullable=False),
        Column("max_output_tokens", Integer, nullable=False),
        Column("updated_at", DateTime(timezone=True), nullable=False),
    )
    versions = Table(
        f"{prefix}model_versions", md,
        Column("model", String(name), primary_key=True),
        Column("version", String(name), primary_key=True),
        Column("weights_uri", Text, nullable=False),
        Column("weights_hash", String(80), nullable=False),
        Column("tokenizer_hash", String(80), nullable=False),
        Column("chat_template_hash", String(80), nullable=False),
        Column("precision", String(8), nullable=False),
        Column("gpu_type", String(32), nullable=False),
        Column("gpus_per_replica", Integer, nullable=False),
        Column("engine", String(16), nullable=False),
        Column("engine_config", JSON, nullable=False),
        Column("architecture", JSON, nullable=False),
        Column("record_hash", String(80), nullable=False),
        Column("eval_report_uri", Text),
        Column("eval_report", JSON),
        Column("load_test_tokens_per_s", Float, nullable=False),
        Column("load_test_tokens_in_flight", BigInteger, nullable=False),
        Column("load_test_streams", Integer, nullable=False),
        Column("capacity_measured", Boolean, nullable=False, default=False),
        Column("status", String(16), nullable=False),
        Column("registered_at", DateTime(timezone=True), nullable=False),
        Column("registered_by", String(128), nullable=False),
    )
    pools = Table(
        f"{prefix}pools", md,
        Column("model", String(name), primary_key=True),
        Column("version", String(name), primary_key=True),
        Column("region", String(name), primary_key=True),
        Column("min_replicas", Integer, nullable=False),
        Column("max_replicas", Integer, nullable=False),
        Column("released_at", DateTime(timezone=True)),
    )
    rollouts = Table(
        f"{prefix}rollouts", md,
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column("model", String(name), nullable=False, index=True),
        Column("version", String(name), nullable=False),
        Column("stage", String(32), nullable=False),
        Column("percent", Float, nullable=False),
        Column("started_at", DateTime(timezone=True), nullable=False),
        Column("decided_at", DateTime(timezone=True), nullable=False),
        Column("decision", String(16), nullable=False),
        Column("reasons", JSON, nullable=False),
        Column("guard_metrics", JSON),
        Column("source", String(128), nullable=False),
        Column("previous", String(name)),
    )
    teams = Table(
        f"{prefix}teams", md,
        Column("team", String(name), primary_key=True),
        Column("name", Text, nullable=False),
    )
    team_limits = Table(
        f"{prefix}team_limits", md,
        Column("team", String(name), primary_key=True),
        Column("model", String(name), primary_key=True),
        Column("tokens_per_minute", BigInteger, nullable=False),
        Column("max_concurrency", Integer, nullable=False),
        Column("guaranteed_share", Float, nullable=False),
        Column("tiers", JSON, nullable=False),
    )
    overrides = Table(
        f"{prefix}desired_overrides", md,
        Column("kind", String(16), primary_key=True),
        Column("target", String(160), primary_key=True),
        Column("value", JSON),
        Column("base", JSON),
        Column("source", String(128), nullable=False),
        Column("reason", Text, nullable=False),
        Column("at", Float, nullable=False),
    )
    return RegistryTables(md, models, versions, pools, rollouts, teams, team_limits, overrides)

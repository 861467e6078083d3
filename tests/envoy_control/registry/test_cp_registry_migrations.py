"""The registry's Alembic history on SQLite and real Postgres: an empty database, tables made
before Alembic (today's shape, and the older one without ``rollouts.previous``), a second
start, two prefixes in one database, a downgrade, and two processes starting together."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from envoy_control.registry.migrations import HISTORY
from envoy_control.registry.store import Registry
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
    event,
    insert,
    inspect,
    text,
)

from modelfleet import db, testing

REPO = Path(__file__).resolve().parents[3]
AT = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


def pre_alembic_tables(prefix: str, previous: bool) -> MetaData:
    """The registry's tables as ``Registry.create_tables`` made them before Alembic: at HEAD~2
    (``previous``), or as first released (``rollouts`` without ``previous``)."""
    md, name = MetaData(), 63

    def when(column: str, nullable: bool = False) -> Column[datetime]:
        return Column(column, DateTime(timezone=True), nullable=nullable)

    Table(f"{prefix}models", md, Column("model", String(name), primary_key=True),
          Column("live_version", String(name), nullable=False), Column("canary_version", String(name)),
          Column("canary_percent", Float, nullable=False, default=0.0),
          Column("shadow_version", String(name)),
          Column("shadow_fraction", Float, nullable=False, default=0.0),
          Column("task", String(32), nullable=False),
          Column("max_output_tokens", Integer, nullable=False), when("updated_at"))
    Table(f"{prefix}model_versions", md, Column("model", String(name), primary_key=True),
          Column("version", String(name), primary_key=True),
          Column("weights_uri", Text, nullable=False),
          *(Column(c, String(80), nullable=False)
            for c in ("weights_hash", "tokenizer_hash", "chat_template_hash")),
          Column("precision", String(8), nullable=False), Column("gpu_type", String(32), nullable=False),
          Column("gpus_per_replica", Integer, nullable=False),
          Column("engine", String(16), nullable=False), Column("engine_config", JSON, nullable=False),
          Column("architecture", JSON, nullable=False), Column("record_hash", String(80), nullable=False),
          Column("eval_report_uri", Text), Column("eval_report", JSON),
          Column("load_test_tokens_per_s", Float, nullable=False),
          Column("load_test_tokens_in_flight", BigInteger, nullable=False),
          Column("load_test_streams", Integer, nullable=False),
          Column("capacity_measured", Boolean, nullable=False, default=False),
          Column("status", String(16), nullable=False), when("registered_at"),
          Column("registered_by", String(128), nullable=False))
    Table(f"{prefix}pools", md,
          *(Column(c, String(name), primary_key=True) for c in ("model", "version", "region")),
          Column("min_replicas", Integer, nullable=False),
          Column("max_replicas", Integer, nullable=False), when("released_at", True))
    Table(f"{prefix}rollouts", md, Column("id", Integer, primary_key=True, autoincrement=True),
          Column("model", String(name), nullable=False, index=True),
          Column("version", String(name), nullable=False), Column("stage", String(32), nullable=False),
          Column("percent", Float, nullable=False), when("started_at"), when("decided_at"),
          Column("decision", String(16), nullable=False), Column("reasons", JSON, nullable=False),
          Column("guard_metrics", JSON), Column("source", String(128), nullable=False),
          *([Column("previous", String(name))] if previous else []))
    Table(f"{prefix}teams", md, Column("team", String(name), primary_key=True),
          Column("name", Text, nullable=False))
    Table(f"{prefix}team_limits", md, Column("team", String(name), primary_key=True),
          Column("model", String(name), primary_key=True),
          Column("tokens_per_minute", BigInteger, nullable=False),
          Column("max_concurrency", Integer, nullable=False),
          Column("guaranteed_share", Float, nullable=False), Column("tiers", JSON, nullable=False))
    Table(f"{prefix}desired_overrides", md, Column("kind", String(16), primary_key=True),
          Column("target", String(160), primary_key=True), Column("value", JSON),
          Column("base", JSON), Column("source", String(128), nullable=False),
          Column("reason", Text, nullable=False), Column("at", Float, nullable=False))
    return md


def make_pre_alembic(url: str, prefix: str, previous: bool) -> None:
    """Create the tables of :func:`pre_alembic_tables` with a team, a rollout and an override."""
    md = pre_alembic_tables(prefix, previous)
    registry = Registry(url, prefix)  # its engine: the same database
    md.create_all(registry.engine)
    with registry.engine.begin() as conn:
        conn.execute(insert(md.tables[f"{prefix}teams"]).values(team="search", name="Search"))
        conn.execute(insert(md.tables[f"{prefix}rollouts"]).values(
            model="chat-7b", version="v14", stage="canary-1", percent=1.0, started_at=AT,
            decided_at=AT, decision="advance", reasons=["ok"], guard_metrics={"p95": 0.4},
            source="controller", **({"previous": "v13"} if previous else {})))
        conn.execute(insert(md.tables[f"{prefix}desired_overrides"]).values(
            kind="canary", target="chat-7b", value={"version": "v14", "percent": 1.0}, base=None,
            source="controller", reason="canary", at=1.5))
    registry.dispose()


def schema_diffs(registry: Registry) -> list[Any]:
    """What Alembic's autogenerate finds between the declared tables and the database."""
    return testing.schema_diffs(registry.engine, registry.t.metadata)


def recorded(registry: Registry) -> list[str]:
    return testing.recorded_revisions(registry.engine, db.version_table(registry.table_prefix, "registry"))


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A database URL and a table prefix of this test; its registry tables dropped after."""
    url, prefix = testing.migration_database(request, tmp_path, "registry")
    yield url, prefix
    registry = Registry(url, prefix)
    registry.drop_tables()
    registry.dispose()


def test_an_empty_database_is_created_at_head(database: tuple[str, str]) -> None:
    registry = Registry(*database)
    registry.create_tables()
    assert recorded(registry) == ["reg0002"]
    assert schema_diffs(registry) == []
    registry.dispose()


@pytest.mark.parametrize("previous", [True, False], ids=["head~2", "before-previous"])
def test_tables_made_before_alembic_reach_head_with_their_rows(
        database: tuple[str, str], previous: bool) -> None:
    make_pre_alembic(*database, previous=previous)
    registry = Registry(*database)
    registry.create_tables()
    assert recorded(registry) == ["reg0002"]
    assert schema_diffs(registry) == []
    [decision] = registry.decisions("chat-7b")
    assert (decision["stage"], decision["previous"], decision["started_at"]) == (
        "canary-1", "v13" if previous else None, AT.timestamp())
    assert registry.rows("teams") == [{"team": "search", "name": "Search"}]
    assert [(o.kind, o.target) for o in registry.saved_overrides()] == [("canary", "chat-7b")]
    registry.dispose()


def test_a_second_start_changes_nothing(database: tuple[str, str]) -> None:
    make_pre_alembic(*database, previous=False)
    Registry(*database).create_tables()
    again = Registry(*database)
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if re.match(r"\s*(CREATE|ALTER|DROP|INSERT|UPDATE|DELETE)", statement, re.I):
            seen.append(statement)

    event.listen(again.engine, "before_cursor_execute", record)
    again.create_tables()
    assert seen == [] and recorded(again) == ["reg0002"]
    again.dispose()


def test_a_column_dropped_behind_alembic_is_added_again(database: tuple[str, str]) -> None:
    """The pre-Alembic revisions are checked against the tables' shape at each start."""
    registry = Registry(*database)
    registry.create_tables()
    with registry.engine.begin() as conn:
        conn.execute(text(f'ALTER TABLE "{database[1]}rollouts" DROP COLUMN "previous"'))
    registry.create_tables()
    assert recorded(registry) == ["reg0002"] and schema_diffs(registry) == []
    registry.dispose()


def test_tables_dropped_behind_alembic_are_created_again(database: tuple[str, str]) -> None:
    registry = Registry(*database)
    registry.create_tables()
    registry.t.metadata.drop_all(registry.engine)  # the version table stays
    registry.create_tables()
    assert recorded(registry) == ["reg0002"] and schema_diffs(registry) == []
    registry.dispose()


def test_a_database_migrated_by_newer_code_is_left_as_it_is(database: tuple[str, str]) -> None:
    registry = Registry(*database)
    registry.create_tables()
    table = db.version_table(database[1], "registry")
    with registry.engine.begin() as conn:
        conn.execute(text(f'UPDATE "{table}" SET version_num = \'reg9999\''))
    registry.create_tables()  # a rolled-back control plane still starts
    assert recorded(registry) == ["reg9999"] and schema_diffs(registry) == []
    registry.dispose()


def test_two_prefixes_share_one_database(database: tuple[str, str]) -> None:
    url, prefix = database
    first, second = Registry(url, prefix), Registry(url, prefix + "two_")
    try:
        make_pre_alembic(url, prefix, previous=False)
        first.create_tables()
        second.create_tables()
        assert recorded(first) == recorded(second) == ["reg0002"]
        assert len(first.decisions()) == 1 and second.decisions() == []
        second.drop_tables()
        assert not inspect(first.engine).has_table(db.version_table(prefix + "two_", "registry"))
        assert recorded(first) == ["reg0002"] and schema_diffs(first) == []
    finally:
        second.drop_tables()
        first.dispose()
        second.dispose()


def test_a_downgrade_drops_previous_and_an_upgrade_adds_it_back(
        database: tuple[str, str]) -> None:
    make_pre_alembic(*database, previous=True)
    registry = Registry(*database)
    registry.create_tables()
    assert db.run_migrations(registry.engine, HISTORY, database[1], "reg0001",
                             downgrade=True) == ["reg0001"]
    columns = {c["name"] for c in inspect(registry.engine).get_columns(f"{database[1]}rollouts")}
    assert "previous" not in columns
    registry.create_tables()
    assert schema_diffs(registry) == [] and registry.decisions()[0]["source"] == "controller"
    registry.dispose()


CHILD = """import sys
from envoy_control.registry.store import Registry
registry = Registry(sys.argv[1], sys.argv[2])
registry.create_tables()
registry.dispose()
"""


def test_two_control_planes_starting_together_on_an_empty_database(
        database: tuple[str, str]) -> None:
    url, prefix = database
    children = [subprocess.Popen([sys.executable, "-c", CHILD, url, prefix], cwd=REPO,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for _ in range(2)]
    outs = [c.communicate(timeout=120) for c in children]
    assert [c.returncode for c in children] == [0, 0], outs
    registry = Registry(url, prefix)
    assert recorded(registry) == ["reg0002"] and schema_diffs(registry) == []
    registry.dispose()

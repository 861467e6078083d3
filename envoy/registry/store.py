"""The model registry in a SQL database through SQLAlchemy 2: SQLite by default, Postgres in
production (tables: :mod:`envoy_control.registry.tables`, created and upgraded at start by their
Alembic history, :mod:`envoy_control.registry.migrations`).

A version never changes after registration: registering ``model@version`` again with any
identity field different (:data:`IDENTITY_FIELDS`) raises :class:`VersionConflict`; the same
record again changes nothing. ``sync`` mirrors the served desired state (models, versions,
pools, teams, team limits, overrides) after every accepted change, so the tables always say
what is being served. Calls are synchronous and short; SQLAlchemy's errors propagate.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC
from typing import Any

from envoy_control.registry.migrations import HISTORY
from envoy_control.registry.records import (
    VersionConflict,
    at_utc,
    identity,
    record_hash,
    served_rows,
)
from envoy_control.registry.tables import IDENTITY_FIELDS, make_tables
from envoy_control.state.overrides import Override, override_from_dict
from sqlalchemy import (
    Engine,
    create_engine,
    delete,
    insert,
    make_url,
    select,
    update,
)
from sqlalchemy.pool import StaticPool

from modelfleet import db
from modelfleet.config import PlatformConfig, Problem, Version
from modelfleet.config.problems import Origins

__all__ = ["DEFAULT_TABLE_PREFIX", "Registry", "VersionConflict", "identity", "make_engine", "record_hash"]

DEFAULT_TABLE_PREFIX = "mf_"



def make_engine(url: str, connect_timeout_s: float = 3.0) -> Engine:
    """An engine for ``url``; an in-memory SQLite (``sqlite://``) is one shared connection."""
    backend = make_url(url).get_backend_name()
    if backend == "sqlite":
        if make_url(url).database in (None, "", ":memory:"):
            return create_engine(url, poolclass=StaticPool,
                                 connect_args={"check_same_thread": False})
        return create_engine(url, connect_args={"timeout": connect_timeout_s})
    if backend == "postgresql":
        return create_engine(url, pool_pre_ping=True,
                             connect_args={"connect_timeout": max(1, round(connect_timeout_s))})
    raise ValueError(f"the registry supports postgresql and sqlite URLs, not {backend!r}")


class Registry:
    """The registry at ``url`` (``postgresql+psycopg://...`` or ``sqlite:///registry.db``)."""

    def __init__(self, url: str = "sqlite://", table_prefix: str = DEFAULT_TABLE_PREFIX,
                 connect_timeout_s: float = 3.0) -> None:
        self.url = url
        self.engine = make_engine(url, connect_timeout_s)
        self.table_prefix = table_prefix
        self.t = make_tables(table_prefix)

    def create_tables(self) -> None:
        """Bring every table to head with the registry's Alembic history: create them in an
        empty database, stamp tables made before Alembic, upgrade older ones (``rollouts`` gets
        ``previous``). Two control planes starting together migrate once (a lock)."""
        db.run_migrations(self.engine, HISTORY, self.table_prefix)

    def drop_tables(self) -> None:
        """Drop every table and the version table (tests)."""
        self.t.metadata.drop_all(self.engine)
        db.drop_version_table(self.engine, self.table_prefix, HISTORY.schema)

    def dispose(self) -> None:
        """Close every pooled connection."""
        self.engine.dispose()

    # -- versions ------------------------------------------------------------------------

    def version(self, model: str, version: str) -> dict[str, Any] | None:
        """The registered row of ``model@version`` as plain data, or None."""
        v = self.t.versions
        with self.engine.connect() as conn:
            row = conn.execute(select(v).where(v.c.model == model, v.c.version == version)).first()
        return dict(row._mapping) if row else None

    def versions(self, model: str | None = None) -> list[dict[str, Any]]:
        """Every registered version (of ``model``), sorted by model and version."""
        v = self.t.versions
        query = select(v).order_by(v.c.model, v.c.version)
        if model is not None:
            query = query.where(v.c.model == model)
        with self.engine.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(query)]

    def differences(self, version: Version) -> list[tuple[str, Any, Any]] | None:
        """How ``version`` differs from its registered record: None when it is not
        registered, ``[]`` when it is the same record."""
        row = self.version(version.model, version.version)
        if row is None:
            return None
        given = identity(version)
        return [(f, row[f], given[f]) for f in IDENTITY_FIELDS if row[f] != given[f]]

    def register_version(self, version: Version, by: str, now_s: float) -> bool:
        """Register ``version``: True if it is new, False if the same record was registered
        before. Raises :class:`VersionConflict` if it was registered differently."""
        with self.engine.begin() as conn:
            return self._register(conn, version, by, now_s)

    def _register(self, conn: Any, version: Version, by: str, now_s: float) -> bool:
        v = self.t.versions
        row = conn.execute(select(v).where(v.c.model == version.model,
                                           v.c.version == version.version)).first()
        given = identity(version)
        if row is not None:
            diff = [(f, row._mapping[f], given[f]) for f in IDENTITY_FIELDS
                    if row._mapping[f] != given[f]]
            if diff:
                raise VersionConflict(version.key, diff)
            return False
        cap = version.capacity
        conn.execute(insert(v).values(
            model=version.model, version=version.version, **given,
            record_hash=record_hash(given), load_test_tokens_per_s=cap.output_tokens_per_s,
            load_test_tokens_in_flight=cap.tokens_in_flight, load_test_streams=cap.streams,
            capacity_measured=cap.measured, status=version.status, registered_at=at_utc(now_s),
            registered_by=by))
        return True

    def conflicts(self, config: PlatformConfig, origins: Origins) -> list[Problem]:
        """A problem for every declared version registered with other identity fields (the
        config would change an immutable version)."""
        out = []
        for i, version in enumerate(config.versions):
            for field, registered, given in self.differences(version) or []:
                out.append(Problem(
                    origins.of("versions", i).at(field),
                    f"{version.key} is registered with {field} {registered!r}, not {given!r}: "
                    "a version never changes; declare a new version"))
        return out

    def save_gate(self, model: str, version: str, *, eval_report: dict[str, Any] | None,
                  eval_report_uri: str | None, tokens_per_s: float | None,
                  tokens_in_flight: int | None, streams: int | None) -> None:
        """Save a gate's results with ``model@version``: the eval report and, when the load
        test found one, the measured capacity (output tokens per second, tokens in flight,
        streams per replica). Raises KeyError if the version is not registered."""
        v = self.t.versions
        values: dict[str, Any] = {"eval_report": eval_report, "eval_report_uri": eval_report_uri}
        if tokens_per_s is not None and tokens_in_flight is not None and streams is not None:
            values.update(load_test_tokens_per_s=tokens_per_s, capacity_measured=True,
                          load_test_tokens_in_flight=tokens_in_flight, load_test_streams=streams)
        with self.engine.begin() as conn:
            done = conn.execute(update(v).where(v.c.model == model, v.c.version == version)
                                .values(**values))
            if done.rowcount == 0:
                raise KeyError(f"{model}@{version} is not registered")

    # -- the served desired state ---------------------------------------------------------

    def sync(self, served: PlatformConfig, overrides: Sequence[Override], by: str,
             now_s: float) -> None:
        """Mirror ``served`` and ``overrides`` into the tables in one transaction: new
        versions registered (raises :class:`VersionConflict`, nothing written), statuses
        updated, models, pools, teams and team limits replaced, overrides replaced."""
        t, at = self.t, at_utc(now_s)
        with self.engine.begin() as conn:
            for version in served.versions:
                if not self._register(conn, version, by, now_s):
                    conn.execute(update(t.versions).values(status=version.status).where(
                        t.versions.c.model == version.model,
                        t.versions.c.version == version.version))
            released = {(r.model, r.version, r.region): r.released_at
                        for r in conn.execute(select(t.pools))}
            for table in (t.models, t.pools, t.team_limits, t.teams, t.overrides):
                conn.execute(delete(table))
            for name, rows in served_rows(served, released, at):
                self._insert(conn, getattr(t, name), rows)
            self._insert(conn, t.overrides, [o.as_dict() for o in overrides])

    @staticmethod
    def _insert(conn: Any, table: Any, rows: list[dict[str, Any]]) -> None:
        if rows:
            conn.execute(insert(table), rows)

    def saved_overrides(self) -> list[Override]:
        """The overrides saved by the last ``sync`` (a restarted control plane resumes them)."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(self.t.overrides).order_by(self.t.overrides.c.at))
            return [override_from_dict(dict(r._mapping)) for r in rows]

    def rows(self, table: str) -> list[dict[str, Any]]:
        """Every row of ``table`` (``models``, ``pools``, ``teams``, ``team_limits``, ...)."""
        tab = getattr(self.t, table)
        with self.engine.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(select(tab))]

    def release_pools(self, model: str, version: str, now_s: float) -> None:
        """Mark every pool of ``model@version`` released at ``now_s`` (Unix seconds)."""
        p = self.t.pools
        with self.engine.begin() as conn:
            conn.execute(update(p).where(p.c.model == model, p.c.version == version)
                         .values(released_at=at_utc(now_s)))

    # -- rollouts --------------------------------------------------------------------------

    def record_decision(self, row: dict[str, Any]) -> int:
        """Add one rollout decision (``model, version, stage, percent, started_at,
        decided_at`` as Unix seconds, ``decision, reasons, guard_metrics, source``); its id."""
        values = {**row, "started_at": at_utc(row["started_at"]),
                  "decided_at": at_utc(row["decided_at"])}
        with self.engine.begin() as conn:
            result = conn.execute(insert(self.t.rollouts).values(**values))
            key = result.inserted_primary_key
            return int(key[0]) if key is not None else 0

    def decisions(self, model: str | None = None) -> list[dict[str, Any]]:
        """Rollout decisions (of ``model``) in the order they were made; times in Unix s."""
        r = self.t.rollouts
        query = select(r).order_by(r.c.id)
        if model is not None:
            query = query.where(r.c.model == model)
        with self.engine.connect() as conn:
            rows = [dict(x._mapping) for x in conn.execute(query)]
        for row in rows:
            for k in ("started_at", "decided_at"):
                value = row[k]
                row[k] = (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()
        return rows

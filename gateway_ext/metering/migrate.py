"""Start-up migration of the usage table (I/O edge): a ``<prefix>usage`` table created before
tiers has no ``tier`` column and its key is (team, model, version, region, minute).

:func:`add_tier_column` adds ``tier`` with the default ``standard`` (every older row reads as
``standard``) and makes it part of the key, so rows of one team, model and minute in different
tiers are kept apart:

* Postgres, in one transaction holding the table's lock (two gateways starting together migrate
  once): ``ALTER TABLE ADD COLUMN tier ... DEFAULT 'standard'``, then the primary key is dropped
  and added again with ``tier``;
* SQLite cannot change a primary key: the rows are copied into a new table (``tier`` =
  ``standard``) that replaces the old one.

A table that has ``tier`` already is left alone (a cheap column lookup at each start).
"""

from __future__ import annotations

import logging

from sqlalchemy import Connection, Engine, MetaData, Table, inspect

from gateway_ext.metering.meter import DEFAULT_TIER

log = logging.getLogger(__name__)


def _has_tier(conn: Connection, table: Table) -> bool:
    return any(c["name"] == "tier" for c in inspect(conn).get_columns(table.name))


def _quote(conn: Connection, name: str) -> str:
    return str(conn.dialect.identifier_preparer.quote(name))


def _postgres(conn: Connection, table: Table) -> None:
    name = _quote(conn, table.name)
    conn.exec_driver_sql(f"LOCK TABLE {name} IN ACCESS EXCLUSIVE MODE")
    if _has_tier(conn, table):
        return
    conn.exec_driver_sql(f"ALTER TABLE {name} ADD COLUMN tier VARCHAR(16) NOT NULL "
                         f"DEFAULT '{DEFAULT_TIER}'")
    pk = inspect(conn).get_pk_constraint(table.name).get("name")
    if pk:
        conn.exec_driver_sql(f"ALTER TABLE {name} DROP CONSTRAINT {_quote(conn, pk)}")
    keys = ", ".join(_quote(conn, c.name) for c in table.primary_key.columns)
    conn.exec_driver_sql(f"ALTER TABLE {name} ADD PRIMARY KEY ({keys})")


def _sqlite(conn: Connection, table: Table) -> None:
    if _has_tier(conn, table):
        return
    fresh = table.to_metadata(MetaData(), name=f"{table.name}__tiered")
    fresh.drop(conn, checkfirst=True)  # left by a migration that died half-way
    fresh.create(conn)
    old = [c.name for c in table.columns if c.name != "tier"]
    cols = ", ".join(_quote(conn, c) for c in old)
    conn.exec_driver_sql(
        f"INSERT INTO {_quote(conn, fresh.name)} ({cols}, tier) "
        f"SELECT {cols}, '{DEFAULT_TIER}' FROM {_quote(conn, table.name)}")
    conn.exec_driver_sql(f"DROP TABLE {_quote(conn, table.name)}")
    conn.exec_driver_sql(
        f"ALTER TABLE {_quote(conn, fresh.name)} RENAME TO {_quote(conn, table.name)}")


def add_tier_column(engine: Engine, table: Table) -> bool:
    """Migrate ``table`` (the usage table, as declared now, with ``tier`` in its key) in the
    database of ``engine`` if it lacks ``tier``; True if it did."""
    with engine.connect() as conn:
        if _has_tier(conn, table):
            return False
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            _postgres(conn, table)
        else:
            _sqlite(conn, table)
    log.warning("usage table %s migrated: tier column added (older rows: %s)", table.name,
                DEFAULT_TIER)
    return True

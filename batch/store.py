"""Batches and their lines in the metering database (SQLAlchemy 2; SQLite or Postgres), see
:mod:`batch.tables` for the tables. Times are seconds since the epoch.

Every change is one short transaction, and the ones that could race are conditional updates:

* a worker *claims* a batch with a lease (``lease_owner``, ``lease_until``) and renews it; another
  worker may take the batch only once the lease ran out (the same worker id may take it back at
  once, after a restart);
* a line's result is written only while the line is still ``pending`` (``WHERE state =
  'pending'``): a line answered twice (a worker killed after sending, before writing) keeps its
  first result, so the output never holds a line twice;
* status changes name the statuses they leave (``WHERE status IN (...)``), so a cancel and the
  worker's own transition never overwrite each other.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, MetaData, and_, bindparam, func, or_, select, update

from batch.lines import ParsedLine
from batch.migrations import HISTORY
from batch.models import (
    ACTIVE,
    STATUS_TIMESTAMP,
    BatchRecord,
    BatchStatus,
    LineCounts,
    LineState,
    Risk,
    error_line,
)
from batch.tables import batch_tables, files_table
from modelfleet import db
from modelfleet.db import DEFAULT_TABLE_PREFIX, DEFAULT_URL, make_engine

_JSON_FIELDS = ("errors", "metadata")


@dataclass(frozen=True, slots=True)
class PendingLine:
    """A line still to send: its number, custom id, request body and attempts so far."""

    line_no: int
    custom_id: str | None
    body: dict[str, Any]
    attempts: int


@dataclass(frozen=True, slots=True)
class LineResult:
    """A line's outcome: ``state`` (done or failed), its output line, attempts made."""

    line_no: int
    state: LineState
    output: dict[str, Any]
    attempts: int


class BatchStore:
    """The batch tables at ``url`` (a SQLAlchemy URL, as the usage store's)."""

    def __init__(self, url: str = DEFAULT_URL, table_prefix: str = DEFAULT_TABLE_PREFIX,
                 connect_timeout_s: float = 3.0) -> None:
        self.engine: Engine = make_engine(url, connect_timeout_s)
        self.table_prefix = table_prefix
        self.metadata = MetaData()
        self.batches, self.lines = batch_tables(self.metadata, table_prefix)
        self.files = files_table(self.metadata, table_prefix)

    def create_tables(self) -> None:
        """Bring the batch tables (batches, lines, uploaded files) to head (:mod:`batch.migrations`: created, stamped or upgraded;
        two processes starting together migrate once)."""
        db.run_migrations(self.engine, HISTORY, self.table_prefix)

    def drop_tables(self) -> None:
        """Drop the batch tables and the version table (tests)."""
        self.metadata.drop_all(self.engine)
        db.drop_version_table(self.engine, self.table_prefix, HISTORY.schema)

    def dispose(self) -> None:
        """Close every pooled connection."""
        self.engine.dispose()

    # -- batches ---------------------------------------------------------------------------

    def insert(self, record: BatchRecord) -> None:
        """Store a new batch."""
        values = {c.name: getattr(record, c.name) for c in self.batches.columns}
        for name in _JSON_FIELDS:
            values[name] = json.dumps(values[name])
        with self.engine.begin() as conn:
            conn.execute(self.batches.insert().values(values))

    def _record(self, row: Any) -> BatchRecord:
        data = dict(row._mapping)
        for name in _JSON_FIELDS:
            data[name] = json.loads(data[name] or ("[]" if name == "errors" else "{}"))
        data["status"] = BatchStatus(data["status"])
        data["deadline_risk"] = Risk(data["deadline_risk"]) if data["deadline_risk"] else None
        return BatchRecord(**data)

    def get(self, batch_id: str, team: str | None = None) -> BatchRecord | None:
        """The batch ``batch_id``; None if unknown or (with ``team``) another team's."""
        query = select(self.batches).where(self.batches.c.batch_id == batch_id)
        if team is not None:
            query = query.where(self.batches.c.team == team)
        with self.engine.connect() as conn:
            row = conn.execute(query).first()
        return None if row is None else self._record(row)

    def list_team(self, team: str, limit: int = 20, after: str | None = None) -> list[BatchRecord]:
        """``team``'s batches, newest first, at most ``limit``, after the batch ``after``."""
        query = select(self.batches).where(self.batches.c.team == team)
        if after is not None:
            cursor = self.get(after, team)
            if cursor is not None:
                query = query.where(self.batches.c.created_at < cursor.created_at)
        query = query.order_by(self.batches.c.created_at.desc()).limit(limit)
        with self.engine.connect() as conn:
            return [self._record(row) for row in conn.execute(query)]

    def counts(self, batch_id: str) -> LineCounts:
        """Lines of the batch by outcome."""
        query = (select(self.lines.c.state, func.count()).where(self.lines.c.batch_id == batch_id)
                 .group_by(self.lines.c.state))
        with self.engine.connect() as conn:
            return LineCounts.of({str(s): int(n) for s, n in conn.execute(query)})

    def transition(self, batch_id: str, src: Collection[BatchStatus], dst: BatchStatus,
                   now: float, worker_id: str | None = None, **values: Any) -> bool:
        """Move the batch from one of ``src`` to ``dst`` at ``now``, setting ``dst``'s timestamp
        and ``values``; with ``worker_id`` only while that worker holds the lease. True if moved."""
        where = [self.batches.c.batch_id == batch_id,
                 self.batches.c.status.in_([str(s) for s in src])]
        if worker_id is not None:
            where.append(self.batches.c.lease_owner == worker_id)
        stamp = STATUS_TIMESTAMP.get(dst)
        values = {**values, "status": str(dst), **({stamp: now} if stamp else {})}
        if "errors" in values:
            values["errors"] = json.dumps(values["errors"])
        with self.engine.begin() as conn:
            return conn.execute(update(self.batches).where(*where).values(values)).rowcount == 1

    def request_cancel(self, batch_id: str, team: str, now: float) -> BatchRecord | None:
        """Ask to cancel ``team``'s batch: ``cancelling`` if it is still running (the worker
        finishes the cancel); the batch as it is now, or None if unknown to ``team``."""
        record = self.get(batch_id, team)
        if record is not None and record.status in ACTIVE:
            self.transition(batch_id, (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS),
                            BatchStatus.CANCELLING, now)
            record = self.get(batch_id, team)
        return record

    # -- leases ----------------------------------------------------------------------------

    def _free(self, worker_id: str, now: float) -> Any:
        c = self.batches.c
        return or_(c.lease_owner.is_(None), c.lease_until < now, c.lease_owner == worker_id)

    def claim(self, worker_id: str, now: float, lease_s: float,
              skip: Collection[str] = ()) -> BatchRecord | None:
        """Lease the oldest active batch no other worker holds (not one of ``skip``) to
        ``worker_id`` for ``lease_s`` seconds; None if there is none."""
        c = self.batches.c
        query = (select(c.batch_id).where(c.status.in_([str(s) for s in ACTIVE]),
                                          self._free(worker_id, now))
                 .order_by(c.created_at).limit(len(skip) + 8))
        with self.engine.connect() as conn:
            candidates = [bid for (bid,) in conn.execute(query) if bid not in skip]
        for batch_id in candidates:
            with self.engine.begin() as conn:
                took = conn.execute(update(self.batches).where(
                    c.batch_id == batch_id, self._free(worker_id, now)).values(
                    lease_owner=worker_id, lease_until=now + lease_s)).rowcount == 1
            if took:
                return self.get(batch_id)
        return None

    def renew(self, batch_id: str, worker_id: str, now: float, lease_s: float,
              **progress: Any) -> bool:
        """Extend ``worker_id``'s lease by ``lease_s`` seconds from ``now`` and store
        ``progress`` fields; False if the lease was lost (another worker took the batch)."""
        c = self.batches.c
        values = {"lease_until": now + lease_s, **progress}
        with self.engine.begin() as conn:
            stmt = update(self.batches).where(c.batch_id == batch_id, c.lease_owner == worker_id)
            return conn.execute(stmt.values(values)).rowcount == 1

    def release(self, batch_id: str, worker_id: str) -> None:
        """Give the lease up (shutdown): another worker may take the batch at once."""
        c = self.batches.c
        with self.engine.begin() as conn:
            conn.execute(update(self.batches).where(c.batch_id == batch_id,
                                                    c.lease_owner == worker_id)
                         .values(lease_owner=None, lease_until=None))

    # -- lines -----------------------------------------------------------------------------

    def start(self, batch_id: str, worker_id: str, parsed: Sequence[ParsedLine],
              now: float) -> bool:
        """Store every parsed line and move the batch to ``in_progress``, in one transaction;
        malformed lines are stored ``failed`` with their error line. False if the batch is no
        longer ``validating`` under this worker's lease (nothing stored)."""
        rows = [{"batch_id": batch_id, "line_no": p.line_no, "custom_id": p.custom_id,
                 "state": str(LineState.PENDING if p.error is None else LineState.FAILED),
                 "request": None if p.body is None else json.dumps(p.body),
                 "result": None if p.error is None else json.dumps(error_line(
                     batch_id, p.line_no, p.custom_id, p.error.code, p.error.message)),
                 "attempts": 0, "updated_at": now} for p in parsed]
        c = self.batches.c
        with self.engine.begin() as conn:
            moved = conn.execute(update(self.batches).where(
                c.batch_id == batch_id, c.status == str(BatchStatus.VALIDATING),
                c.lease_owner == worker_id).values(
                status=str(BatchStatus.IN_PROGRESS), in_progress_at=now)).rowcount == 1
            if moved:
                for i in range(0, len(rows), 1000):
                    conn.execute(self.lines.insert(), rows[i:i + 1000])
        return moved

    def pending(self, batch_id: str, after_line_no: int = 0, limit: int = 500) -> list[PendingLine]:
        """Up to ``limit`` pending lines numbered above ``after_line_no``, in file order."""
        c = self.lines.c
        query = (select(c.line_no, c.custom_id, c.request, c.attempts)
                 .where(c.batch_id == batch_id, c.state == str(LineState.PENDING),
                        c.line_no > after_line_no).order_by(c.line_no).limit(limit))
        with self.engine.connect() as conn:
            return [PendingLine(n, cid, json.loads(req), att)
                    for n, cid, req, att in conn.execute(query)]

    def record(self, batch_id: str, results: Iterable[LineResult], now: float) -> int:
        """Write results of lines still pending (others are left as they are); returns how many
        were written."""
        rows = [{"b_id": batch_id, "b_no": r.line_no, "state": str(r.state),
                 "result": json.dumps(r.output), "attempts": r.attempts, "updated_at": now}
                for r in results]
        if not rows:
            return 0
        c = self.lines.c
        stmt = update(self.lines).where(and_(
            c.batch_id == bindparam("b_id"), c.line_no == bindparam("b_no"),
            c.state == str(LineState.PENDING)))
        with self.engine.begin() as conn:
            return sum(conn.execute(stmt, [row]).rowcount for row in rows)

    def close_pending(self, batch_id: str, state: LineState, code: str, message: str,
                      now: float) -> int:
        """End every pending line as ``state`` (expired, cancelled) with an error line."""
        c = self.lines.c
        query = select(c.line_no, c.custom_id).where(c.batch_id == batch_id,
                                                     c.state == str(LineState.PENDING))
        with self.engine.connect() as conn:
            left = list(conn.execute(query))
        return self.record(batch_id, [LineResult(n, state, error_line(batch_id, n, cid, code,
                                                                      message), 0)
                                      for n, cid in left], now)

    def output(self, batch_id: str) -> list[str]:
        """The output lines (JSON text) of every line with a result, in input order."""
        c = self.lines.c
        query = (select(c.result).where(c.batch_id == batch_id, c.result.is_not(None))
                 .order_by(c.line_no))
        with self.engine.connect() as conn:
            return [str(r) for (r,) in conn.execute(query)]

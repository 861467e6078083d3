"""Flushing metered usage to the database through a local spool: nothing lost, nothing counted twice.

Each flush drains the meter into a *batch* with a fresh id and appends it to a JSONL spool file
(flushed and fsynced) *before* touching the database; then every batch in the spool is written in
order (:meth:`~gateway_ext.metering.store.UsageStore.write_batch`, which records the batch id in the
same transaction as the rows) and removed from the spool once written. If the database is
unreachable, batches stay in the spool and go out on a later flush, after a restart too. A batch
written whose removal from the spool was lost (a crash in between) is recognised by its id and
skipped. A line cut short by a crash while it was being appended is dropped with a warning.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.exc import SQLAlchemyError

from gateway_ext.metering.meter import UsageMeter, UsageRow
from gateway_ext.metering.store import UsageStore

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Batch:
    """Rows drained together, under one id."""

    batch_id: str
    rows: tuple[UsageRow, ...]


class UsageSpool:
    """Batches not yet known to be in the database, one JSON line each, at ``path``."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def append(self, batch: Batch) -> None:
        """Add ``batch`` durably (fsync) at the end of the spool."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps({"batch_id": batch.batch_id,
                           "rows": [r.to_json() for r in batch.rows]}, separators=(",", ":"))
        with self.path.open("a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())

    def batches(self) -> list[Batch]:
        """The spooled batches, oldest first."""
        if not self.path.exists():
            return []
        out: list[Batch] = []
        for number, line in enumerate(self.path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
                out.append(Batch(data["batch_id"],
                                 tuple(UsageRow.from_json(r) for r in data["rows"])))
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("usage spool %s line %d unreadable, dropped: %s", self.path, number, exc)
        return out

    def replace(self, batches: list[Batch]) -> None:
        """Atomically make ``batches`` the spool's content (an empty list removes the file)."""
        if not batches:
            self.path.unlink(missing_ok=True)
            return
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        with tmp.open("w", encoding="utf-8") as f:
            for b in batches:
                f.write(json.dumps({"batch_id": b.batch_id, "rows": [r.to_json() for r in b.rows]},
                                   separators=(",", ":")) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)


@dataclass(frozen=True, slots=True)
class FlushResult:
    """Batches written now, skipped as already written, and left in the spool; rows drained now."""

    written: int
    skipped: int
    pending: int
    rows: int


class UsageFlusher:
    """Moves a meter's rows to a store through a spool; call :meth:`flush` every few seconds and at
    shutdown."""

    def __init__(self, meter: UsageMeter, store: UsageStore, spool: UsageSpool,
                 new_batch_id: Callable[[], str] = lambda: uuid.uuid4().hex) -> None:
        self.meter = meter
        self.store = store
        self.spool = spool
        self.new_batch_id = new_batch_id

    def flush(self, now: float, rows: list[UsageRow] | None = None) -> FlushResult:
        """Drain the meter into the spool, then write every spooled batch it can at ``now``
        (seconds since the epoch). Never raises for an unreachable database.

        ``rows`` already drained from the meter are spooled instead (a service drains on its
        event loop, then writes from a worker thread)."""
        rows = self.meter.drain() if rows is None else rows
        if rows:
            self.spool.append(Batch(self.new_batch_id(), tuple(rows)))
        pending = self.spool.batches()
        written = skipped = done = 0
        for batch in pending:
            try:
                fresh = self.store.write_batch(batch.batch_id, batch.rows, now)
            except (SQLAlchemyError, OSError) as exc:
                log.warning("usage store unreachable, %d batch(es) stay spooled: %s",
                            len(pending) - done, exc.__class__.__name__)
                break
            done += 1
            written, skipped = written + fresh, skipped + (not fresh)
        if done:
            self.spool.replace(pending[done:])
        return FlushResult(written, skipped, len(pending) - done, len(rows))

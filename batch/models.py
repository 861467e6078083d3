"""The plain data of the batch API (pure): statuses, a batch's record, line counts, and the
OpenAI batch output line shape. Times are seconds since the epoch (floats); the JSON views round
them to whole seconds as OpenAI does.

Statuses (OpenAI's names)::

    validating -> in_progress -> finalizing -> completed
         |             |  \\
         v             v   `-> (deadline passed) -> expired      partial results kept
       failed     cancelling -> cancelled                        partial results kept

``validating``: created, the worker has not read the input yet. ``failed``: the input file as a
whole could not be used (unreadable, empty, too many lines); single bad lines never fail a batch.
``finalizing`` and ``cancelling`` are short transient states while the output is being written.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class BatchStatus(StrEnum):
    """Where a batch is in its life."""

    VALIDATING = "validating"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    FAILED = "failed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"


ACTIVE = (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS, BatchStatus.FINALIZING,
          BatchStatus.CANCELLING)
"""Statuses a worker still has work for."""
TERMINAL = (BatchStatus.COMPLETED, BatchStatus.FAILED, BatchStatus.EXPIRED, BatchStatus.CANCELLED)


class LineState(StrEnum):
    """Where one input line is: ``pending`` until it has a result; ``done`` answered 2xx;
    ``failed`` answered non-2xx or rejected as malformed; ``expired``/``cancelled`` never ran
    (or were cut) because the batch ended first."""

    PENDING = "pending"
    DONE = "done"
    FAILED = "failed"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


class Risk(StrEnum):
    """The deadline forecast of a running batch."""

    ON_TRACK = "on_track"
    AT_RISK = "at_risk"


CHAT_ENDPOINT = "/v1/chat/completions"
"""The one endpoint batch lines may call."""
TIMESTAMP_FIELDS = ("created_at", "in_progress_at", "finalizing_at", "completed_at", "failed_at",
                    "expired_at", "cancelling_at", "cancelled_at")
STATUS_TIMESTAMP = {BatchStatus(name.removesuffix("_at")): name for name in TIMESTAMP_FIELDS
                    if name != "created_at"}
"""The timestamp field set when a batch enters a status."""


@dataclass(frozen=True, slots=True)
class LineCounts:
    """Lines of a batch by outcome: ``completed`` (2xx), ``failed`` (non-2xx or malformed),
    ``pending`` (not answered yet), ``incomplete`` (stopped by the deadline or a cancel)."""

    total: int = 0
    completed: int = 0
    failed: int = 0
    pending: int = 0
    incomplete: int = 0

    @staticmethod
    def of(by_state: dict[str, int]) -> LineCounts:
        """Counts from lines per :class:`LineState` value."""
        done, failed = by_state.get(LineState.DONE, 0), by_state.get(LineState.FAILED, 0)
        pending = by_state.get(LineState.PENDING, 0)
        incomplete = by_state.get(LineState.EXPIRED, 0) + by_state.get(LineState.CANCELLED, 0)
        return LineCounts(done + failed + pending + incomplete, done, failed, pending, incomplete)


@dataclass(slots=True)
class BatchRecord:
    """One batch as stored; ``deadline`` and the ``*_at`` fields in seconds since the epoch.

    ``tier`` is the tier its lines are sent at now (``batch``, or ``standard`` once urgency was
    raised); ``paused_until`` is when the worker may send again after a 429/503; ``throttled``
    counts the 429/503 answers it received. ``lease_owner``/``lease_until`` name the worker
    running it and until when (seconds).
    """

    batch_id: str
    team: str
    model: str
    input_uri: str
    output_uri: str
    deadline: float
    created_at: float
    status: BatchStatus = BatchStatus.VALIDATING
    endpoint: str = CHAT_ENDPOINT
    in_progress_at: float | None = None
    finalizing_at: float | None = None
    completed_at: float | None = None
    failed_at: float | None = None
    expired_at: float | None = None
    cancelling_at: float | None = None
    cancelled_at: float | None = None
    output_written_at: float | None = None
    errors: list[dict[str, Any]] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)
    deadline_risk: Risk | None = None
    tier: str = "batch"
    paused_until: float | None = None
    throttled: int = 0
    lease_owner: str | None = None
    lease_until: float | None = None


def _whole(value: float | None) -> int | None:
    return None if value is None else int(value)


def batch_view(record: BatchRecord, counts: LineCounts) -> dict[str, Any]:
    """The JSON answer for a batch: OpenAI's batch object (``id``, ``object``, ``endpoint``,
    ``status``, ``request_counts``, ``*_at`` in whole seconds, ``expires_at`` = the deadline,
    ``errors``, ``metadata``) plus this API's ``batch_id``, ``model``, URIs, ``deadline``,
    ``counts`` (with ``pending`` and ``incomplete``), ``deadline_risk``, ``tier``,
    ``paused_until`` and ``throttled``."""
    errors = {"object": "list", "data": record.errors} if record.errors else None
    return {
        "id": record.batch_id,
        "batch_id": record.batch_id,
        "object": "batch",
        "endpoint": record.endpoint,
        "model": record.model,
        "input_uri": record.input_uri,
        "output_uri": record.output_uri,
        "status": str(record.status),
        "deadline": _whole(record.deadline),
        "expires_at": _whole(record.deadline),
        **{name: _whole(getattr(record, name)) for name in TIMESTAMP_FIELDS},
        "output_written_at": _whole(record.output_written_at),
        "request_counts": {"total": counts.total, "completed": counts.completed,
                           "failed": counts.failed},
        "counts": {"total": counts.total, "completed": counts.completed, "failed": counts.failed,
                   "pending": counts.pending, "incomplete": counts.incomplete},
        "deadline_risk": None if record.deadline_risk is None else str(record.deadline_risk),
        "tier": record.tier,
        "paused_until": record.paused_until,
        "throttled": record.throttled,
        "errors": errors,
        "metadata": record.metadata,
    }


def line_id(batch_id: str, line_no: int) -> str:
    """The output line's ``id``: the same for the same line every time it is written."""
    digest = hashlib.blake2b(f"{batch_id}:{line_no}".encode(), digest_size=12).hexdigest()
    return f"batch_req_{digest}"


def response_line(batch_id: str, line_no: int, custom_id: str | None, status_code: int,
                  request_id: str | None, body: Any) -> dict[str, Any]:
    """An output line for a request that got an HTTP answer (2xx or not), OpenAI's shape
    ``{id, custom_id, response: {status_code, request_id, body}, error: null}``."""
    return {"id": line_id(batch_id, line_no), "custom_id": custom_id,
            "response": {"status_code": status_code, "request_id": request_id, "body": body},
            "error": None}


def error_line(batch_id: str, line_no: int, custom_id: str | None, code: str,
               message: str) -> dict[str, Any]:
    """An output line for a line that got no answer (malformed, expired, cancelled): ``response``
    null, ``error`` ``{code, message, line}`` (``line``: 1-based line of the input file)."""
    return {"id": line_id(batch_id, line_no), "custom_id": custom_id, "response": None,
            "error": {"code": code, "message": message, "line": line_no}}

"""Usage metering in memory: one row per team, model, version, region, tier and minute (pure; the
time of each event is passed in). :mod:`gateway_ext.metering.spool` flushes drained rows to the database.

Counters per row: ``prompt_tokens``, ``cached_tokens`` (prompt tokens served from the prefix
cache, a subset of ``prompt_tokens``), ``output_tokens`` (tokens); ``requests`` (requests that
ran and were settled), ``rejected_429`` and ``shed_503`` (requests refused; they ran nothing).
A refusal before a version was chosen is recorded under version :data:`UNRESOLVED_VERSION`.
``tier`` is the request's priority tier (``interactive``, ``standard`` or ``batch``), so batch
usage can be billed at its own price; rows written before tiers existed read as
:data:`DEFAULT_TIER`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

UNRESOLVED_VERSION = "-"
"""The version of a row for requests refused before a version was chosen."""
DEFAULT_TIER = "standard"
"""The tier of a request without ``x-priority``, and of rows (and spool lines) older than tiers."""
TIERS = ("interactive", "standard", "batch")
COUNTERS = ("prompt_tokens", "cached_tokens", "output_tokens", "requests", "rejected_429",
            "shed_503")


def minute_of(now: float) -> int:
    """The start of the minute holding ``now`` (seconds since the epoch), in seconds."""
    return math.floor(now / 60) * 60


@dataclass(frozen=True, slots=True, order=True)
class UsageKey:
    """One row's identity; ``minute`` is the minute's start in seconds since the epoch (UTC);
    ``tier`` the requests' priority tier (last, with a default, so older callers still build
    keys positionally)."""

    team: str
    model: str
    version: str
    region: str
    minute: int
    tier: str = DEFAULT_TIER


@dataclass(slots=True)
class UsageCounts:
    """A row's counters (tokens and requests)."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    requests: int = 0
    rejected_429: int = 0
    shed_503: int = 0

    def add(self, other: UsageCounts) -> None:
        """Add ``other``'s counters to these."""
        for name in COUNTERS:
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass(frozen=True, slots=True)
class UsageRow:
    """A metering row: key and counters."""

    key: UsageKey
    counts: UsageCounts

    def to_json(self) -> dict[str, Any]:
        """A flat JSON-able dict (the spool's format)."""
        return {**asdict(self.key), **asdict(self.counts)}

    @staticmethod
    def from_json(data: dict[str, Any]) -> UsageRow:
        """The row of :meth:`to_json`'s output."""
        key = UsageKey(**{f.name: data[f.name] for f in fields(UsageKey)
                          if f.name != "tier"}, tier=str(data.get("tier", DEFAULT_TIER)))
        return UsageRow(key, UsageCounts(**{name: int(data[name]) for name in COUNTERS}))


def merge_rows(rows: list[UsageRow]) -> list[UsageRow]:
    """``rows`` with equal keys added together, sorted by key."""
    merged: dict[UsageKey, UsageCounts] = {}
    for row in rows:
        merged.setdefault(row.key, UsageCounts()).add(row.counts)
    return [UsageRow(k, merged[k]) for k in sorted(merged)]


class UsageMeter:
    """Aggregates usage of one gateway process in ``region`` until :meth:`drain`."""

    def __init__(self, region: str) -> None:
        self.region = region
        self._rows: dict[UsageKey, UsageCounts] = {}

    def _row(self, team: str, model: str, version: str, now: float, tier: str) -> UsageCounts:
        key = UsageKey(team, model, version, self.region, minute_of(now), tier)
        counts = self._rows.get(key)
        if counts is None:
            counts = self._rows[key] = UsageCounts()
        return counts

    def record_usage(self, team: str, model: str, version: str, now: float, prompt_tokens: int,
                     cached_tokens: int, output_tokens: int, tier: str = DEFAULT_TIER) -> None:
        """A finished request's usage (tokens) at ``now`` (seconds) in ``tier``: one request."""
        row = self._row(team, model, version, now, tier)
        row.prompt_tokens += prompt_tokens
        row.cached_tokens += cached_tokens
        row.output_tokens += output_tokens
        row.requests += 1

    def record_rejected(self, team: str, model: str, now: float,
                        version: str = UNRESOLVED_VERSION, tier: str = DEFAULT_TIER) -> None:
        """A 429 to ``team`` at ``now`` (seconds) in ``tier``."""
        self._row(team, model, version, now, tier).rejected_429 += 1

    def record_shed(self, team: str, model: str, now: float,
                    version: str = UNRESOLVED_VERSION, tier: str = DEFAULT_TIER) -> None:
        """A 503 (shed) to ``team`` at ``now`` (seconds) in ``tier``."""
        self._row(team, model, version, now, tier).shed_503 += 1

    def pending(self) -> int:
        """Rows aggregated and not drained yet."""
        return len(self._rows)

    def drain(self) -> list[UsageRow]:
        """Every aggregated row, sorted by key; the meter starts empty again."""
        rows = [UsageRow(k, v) for k, v in sorted(self._rows.items())]
        self._rows = {}
        return rows

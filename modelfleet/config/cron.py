"""Cron expressions of the ``autoscaling.peaks`` config (pure): parsed and checked here, evaluated
by :mod:`autoscale.cron` the way KEDA's cron scaler does.

Supported field syntax: ``*``, numbers, ranges ``a-b``, steps ``*/n`` and ``a-b/n``, lists
``a,b``, and three-letter month and weekday names; day-of-week 0 and 7 are Sunday. As in Vixie
cron and robfig/cron, when both day fields are restricted a day matches if either does.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date

_MONTHS = {m: i + 1 for i, m in enumerate(
    ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"))}
_DAYS = {d: i for i, d in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))}


@dataclass(frozen=True)
class CronSchedule:
    """A parsed five-field cron expression: the sets of matching values per field."""

    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]
    days_restricted: bool
    weekdays_restricted: bool

    def day_matches(self, day: date) -> bool:
        """Whether ``day`` is one the schedule fires on (month and day fields)."""
        if day.month not in self.months:
            return False
        dom = day.day in self.days
        dow = (day.isoweekday() % 7) in self.weekdays
        if self.days_restricted and self.weekdays_restricted:
            return dom or dow
        return dom and dow


def _field(text: str, low: int, high: int, names: dict[str, int]) -> frozenset[int]:
    values: set[int] = set()
    for part in text.lower().split(","):
        body, _, step_text = part.partition("/")
        step = int(step_text) if step_text else 1
        if step < 1:
            raise ValueError(f"bad step in cron field {text!r}")
        if body == "*":
            first, last = low, high
        else:
            a, _, b = body.partition("-")
            first = names[a] if a in names else int(a)
            last = (names[b] if b in names else int(b)) if b else (high if step_text else first)
        if not low <= first <= last <= high:
            raise ValueError(f"cron field {text!r} is outside {low}-{high}")
        values.update(range(first, last + 1, step))
    return frozenset(values)


def parse_cron(expr: str) -> CronSchedule:
    """Parse a five-field cron expression; raise ``ValueError`` if it is not one."""
    fields = expr.split()
    if len(fields) != 5:
        raise ValueError(f"cron expression {expr!r} must have 5 fields, has {len(fields)}")
    minute, hour, dom, month, dow = fields
    weekdays = _field(dow, 0, 7, _DAYS)
    return CronSchedule(
        minutes=_field(minute, 0, 59, {}),
        hours=_field(hour, 0, 23, {}),
        days=_field(dom, 1, 31, {}),
        months=_field(month, 1, 12, _MONTHS),
        weekdays=frozenset(d % 7 for d in weekdays),
        days_restricted=not dom.startswith("*"),
        weekdays_restricted=not dow.startswith("*"),
    )

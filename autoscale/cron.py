"""Cron windows for known peaks, evaluated the way KEDA's cron scaler does (pure, no clock).

KEDA's cron trigger is active between a ``start`` and an ``end`` cron expression (five fields,
"Linux format": minute hour day-of-month month day-of-week) read in an IANA timezone: it
computes the next firing of each after *now* and is active when the next ``end`` comes no
later than the next ``start``. While active the trigger asks for ``desiredReplicas``; outside
it asks for 1 (its metric is ``desiredReplicas`` or 1 against an ``AverageValue`` target of 1).

Expressions are parsed by :mod:`modelfleet.config.cron` (the config checks them at load).
"""

from __future__ import annotations

from datetime import datetime, time, timedelta
from zoneinfo import ZoneInfo

from modelfleet.config.cron import CronSchedule, parse_cron

_SEARCH_DAYS = 366 * 8  # a 29 February schedule fires within 8 years (2096 -> 2104)


def next_fire(schedule: CronSchedule, after: datetime, timezone: str) -> datetime | None:
    """The first time strictly after ``after`` (aware) at which ``schedule`` fires, read in
    ``timezone``; ``None`` if it never fires within eight years."""
    zone = ZoneInfo(timezone)
    local = after.astimezone(zone)
    for offset in range(_SEARCH_DAYS):
        day = local.date() + timedelta(days=offset)
        if not schedule.day_matches(day):
            continue
        for hour in sorted(schedule.hours):
            for minute in sorted(schedule.minutes):
                candidate = datetime.combine(day, time(hour, minute), tzinfo=zone)
                if candidate > local:
                    return candidate
    return None


def window_active(start: str, end: str, timezone: str, at: datetime) -> bool:
    """Whether KEDA's cron trigger with this ``start``/``end`` is active at ``at`` (aware):
    the next ``end`` comes no later than the next ``start``."""
    next_start = next_fire(parse_cron(start), at, timezone)
    next_end = next_fire(parse_cron(end), at, timezone)
    if next_end is None:
        return False
    return next_start is None or next_end <= next_start

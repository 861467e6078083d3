"""Cron windows, evaluated as KEDA's cron scaler does (next end before next start = active)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from autoscale.cron import next_fire, window_active
from modelfleet.config.cron import parse_cron

DUBLIN = "Europe/Dublin"
MORNING = ("50 7 * * 1-5", "0 11 * * 1-5")  # weekdays 07:50-11:00 local


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, tzinfo=UTC)


def test_names_ranges_and_steps() -> None:
    assert parse_cron("0 9 * * mon-fri") == parse_cron("0 9 * * 1-5")
    assert parse_cron("*/15 * * * *").minutes == frozenset({0, 15, 30, 45})
    assert parse_cron("0 8-18/5 * * *").hours == frozenset({8, 13, 18})
    assert parse_cron("0 0 * * 7").weekdays == frozenset({0})  # 7 is Sunday too


@pytest.mark.parametrize("expr", ["0 9 * *", "60 * * * *", "0 24 * * *", "0 0 0 * *", "*/0 * * * *",
                                  "0 9 * * funday"])
def test_bad_expressions_are_refused(expr: str) -> None:
    with pytest.raises(ValueError):
        parse_cron(expr)


def test_both_day_fields_restricted_means_either() -> None:
    # 1st of the month OR a Monday (Vixie cron, robfig/cron): Wed 1 Jan 2025 and Mon 6 Jan 2025.
    schedule = parse_cron("0 0 1 * 1")
    assert next_fire(schedule, utc(2024, 12, 31, 12), "UTC") == utc(2025, 1, 1)
    assert next_fire(schedule, utc(2025, 1, 1, 12), "UTC") == utc(2025, 1, 6)


def test_next_fire_skips_the_weekend_in_local_time() -> None:
    # Friday 10 Jan 2025 12:00 UTC -> Monday 13 Jan 07:50 Dublin (UTC+0 in winter).
    assert next_fire(parse_cron(MORNING[0]), utc(2025, 1, 10, 12), DUBLIN) == utc(2025, 1, 13, 7, 50)


@pytest.mark.parametrize(("at", "active"), [
    (utc(2025, 1, 13, 7, 49), False),   # Monday, a minute early
    (utc(2025, 1, 13, 7, 50), True),    # at the start
    (utc(2025, 1, 13, 10, 59), True),
    (utc(2025, 1, 13, 11, 0), False),   # at the end
    (utc(2025, 1, 11, 9, 0), False),    # Saturday
    (utc(2025, 7, 14, 6, 55), True),    # summer: 07:55 Dublin (UTC+1)
    (utc(2025, 7, 14, 6, 45), False),   # 07:45 Dublin
])
def test_morning_window(at: datetime, active: bool) -> None:
    assert window_active(*MORNING, DUBLIN, at) is active


@pytest.mark.parametrize(("hour", "active"), [(23, True), (1, True), (3, False), (21, False)])
def test_window_across_midnight(hour: int, active: bool) -> None:
    assert window_active("0 22 * * *", "0 2 * * *", "UTC", utc(2025, 3, 5, hour)) is active

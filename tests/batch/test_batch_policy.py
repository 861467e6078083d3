"""The batch worker's pure pacing rules: verdicts, Retry-After, backoff, the AIMD pacer, the
deadline forecast and when urgency may be raised."""

from __future__ import annotations

import random

import pytest

from batch.models import Risk
from batch.policy import (
    Pacer,
    RateWindow,
    Verdict,
    backoff_s,
    choose_tier,
    classify,
    forecast,
    retry_after_s,
)
from modelfleet.config import Tier


@pytest.mark.parametrize(("status", "verdict"), [
    (200, Verdict.DONE), (201, Verdict.DONE), (400, Verdict.FINAL), (401, Verdict.FINAL),
    (403, Verdict.FINAL), (404, Verdict.FINAL), (413, Verdict.FINAL), (429, Verdict.THROTTLED),
    (503, Verdict.THROTTLED), (500, Verdict.TRANSIENT), (502, Verdict.TRANSIENT),
    (504, Verdict.TRANSIENT), (None, Verdict.TRANSIENT),
])
def test_every_answer_has_a_verdict(status: int | None, verdict: Verdict) -> None:
    assert classify(status) is verdict


def test_no_connection_at_all_is_the_platform_not_the_line() -> None:
    assert classify(None, connected=False) is Verdict.UNREACHABLE


@pytest.mark.parametrize(("headers", "wait"), [
    ({"retry-after-ms": "250", "retry-after": "3"}, 0.25),  # milliseconds win, as in the SDK
    ({"retry-after": "3"}, 3.0),
    ({"retry-after": "Thu, 01 Jan 1970 00:01:40 GMT"}, 40.0),  # an HTTP date, now = 60 s
    ({"retry-after": "soon"}, 1.0),
    ({"retry-after-ms": "x", "retry-after": "2"}, 2.0),
    ({}, 1.0),
])
def test_retry_after_is_read_like_the_openai_client(headers: dict[str, str], wait: float) -> None:
    assert retry_after_s(headers, now=60.0) == pytest.approx(wait)


def test_backoff_doubles_with_jitter_and_a_cap() -> None:
    rng = random.Random(3)
    for attempt, base in [(1, 0.5), (2, 1.0), (3, 2.0), (10, 30.0)]:
        wait = backoff_s(attempt, rng)
        assert base * 0.5 <= wait < base


def test_the_pacer_pauses_for_retry_after_and_halves_once_per_pause() -> None:
    pacer = Pacer(8)
    assert pacer.free_slots(in_flight=0, now=0.0) == 8
    assert pacer.free_slots(in_flight=5, now=0.0) == 3
    pacer.on_throttled(now=10.0, wait_s=5.0)
    pacer.on_throttled(now=10.1, wait_s=5.5)  # the rest of the burst: no further halving
    assert pacer.window == 4 and pacer.paused_until == pytest.approx(15.6)
    assert pacer.free_slots(in_flight=0, now=15.0) == 0  # nothing goes out while paused
    assert pacer.free_slots(in_flight=0, now=15.6) == 4
    pacer.on_throttled(now=16.0, wait_s=1.0)
    assert pacer.window == 2
    for _ in range(100):
        pacer.on_success()
    assert pacer.window == 8  # grows back to the bound, never past it
    with pytest.raises(ValueError):
        Pacer(0)


def test_the_rate_is_unknown_during_warm_up_then_lines_per_second() -> None:
    window = RateWindow(started=100.0, window_s=10.0, warmup_s=2.0)
    window.add(100.5, 3)
    assert window.rate(101.0) is None
    assert window.rate(103.0) == pytest.approx(1.0)  # 3 lines in 3 s
    window.add(112.0, 5)
    assert window.rate(112.0) == pytest.approx(0.5)  # the first 3 fell out of the 10 s window


@pytest.mark.parametrize(("remaining", "rate", "left", "risk"), [
    (0, None, 0.0, Risk.ON_TRACK),
    (10, None, 3600.0, Risk.ON_TRACK),  # no estimate yet
    (10, None, 30.0, Risk.AT_RISK),  # under the minimum lead with lines left
    (100, 0.0, 3600.0, Risk.AT_RISK),  # nothing finishing (paused all along)
    (100, 1.0, 3600.0, Risk.ON_TRACK),
    (3000, 1.0, 3600.0, Risk.AT_RISK),  # 3,000 s x 1.25 safety > 3,600 s
    (2800, 1.0, 3600.0, Risk.ON_TRACK),
])
def test_the_forecast(remaining: int, rate: float | None, left: float, risk: Risk) -> None:
    assert forecast(remaining, rate, left, min_lead_s=60.0) is risk


ALL: tuple[Tier, ...] = ("interactive", "standard", "batch")


@pytest.mark.parametrize(("current", "risk", "left", "window", "allowed", "tier"), [
    ("batch", Risk.AT_RISK, 600.0, 3600.0, ALL, "standard"),
    ("batch", Risk.ON_TRACK, 600.0, 3600.0, ALL, "batch"),  # on track: stays batch
    ("batch", Risk.AT_RISK, 7200.0, 3600.0, ALL, "batch"),  # outside the window
    ("batch", Risk.AT_RISK, 600.0, 0.0, ALL, "batch"),  # window 0: never
    ("batch", Risk.AT_RISK, 600.0, 3600.0, ("interactive", "batch"), "batch"),  # not allowed
    ("standard", Risk.ON_TRACK, 500.0, 3600.0, ALL, "standard"),  # once raised, stays
    ("standard", Risk.AT_RISK, 500.0, 3600.0, ("batch",), "batch"),  # config took it away
])
def test_urgency_is_raised_only_where_allowed(current: Tier, risk: Risk, left: float,
                                              window: float, allowed: tuple[Tier, ...],
                                              tier: Tier) -> None:
    assert choose_tier(current, risk, left, window, allowed) == tier

"""Retry-storm guard: jittered Retry-After, fingerprints, the per-team budget of early retries."""

from __future__ import annotations

import random

import pytest

from gateway_ext.limits.retry_budget import (
    RetryBudget,
    RetryBudgetConfig,
    RetryCheck,
    fingerprint,
    jittered,
    retry_after_headers,
)


def test_jitter_stretches_but_never_shortens_and_is_reproducible() -> None:
    rng = random.Random(42)
    delays = [jittered(10.0, rng, 0.5) for _ in range(1000)]
    assert all(10.0 <= d <= 15.0 for d in delays)
    assert max(delays) - min(delays) > 4.0  # clients told at once come back spread out
    again = random.Random(42)
    assert delays == [jittered(10.0, again, 0.5) for _ in range(1000)]
    assert jittered(3.0, random.Random(1), 0.0) == 3.0


@pytest.mark.parametrize(("delay", "seconds", "ms"), [
    (0.0, "1", "1"), (0.0004, "1", "1"), (0.25, "1", "250"), (1.0, "1", "1000"),
    (1.0001, "2", "1001"), (9.1, "10", "9100"),
])
def test_retry_after_headers(delay: float, seconds: str, ms: str) -> None:
    assert retry_after_headers(delay) == {"retry-after": seconds, "retry-after-ms": ms}


def test_fingerprint_is_the_conversation_else_the_body() -> None:
    assert fingerprint("conv-1", b"x") == fingerprint("conv-1", b"y") == "c:conv-1"
    assert fingerprint(None, b"body") == fingerprint("", b"body") != fingerprint(None, b"other")
    assert fingerprint(None, b"body").startswith("b:")


def budget(window_s: float = 60.0, early_retry_ratio: float = 0.0,
           max_tracked: int = 100_000) -> RetryBudget:
    """Two early retries per window, no jitter: exact delays."""
    return RetryBudget(random.Random(0), RetryBudgetConfig(
        window_s=window_s, min_early_retries=2, early_retry_ratio=early_retry_ratio, jitter=0.0,
        max_tracked=max_tracked))


def test_a_request_back_after_its_retry_after_is_not_early() -> None:
    b = budget()
    assert b.refused("a", "c:1", 10.0, 100.0) == 10.0
    check = b.check("a", "c:1", 110.0)
    assert (check.allowed, check.early) == (True, False)
    assert b.tracked() == 0


def test_early_retries_pass_up_to_the_budget_then_are_refused_cheaply() -> None:
    b = budget()
    for i in range(3):
        b.refused("a", f"c:{i}", 10.0, 100.0)
    assert b.check("a", "c:0", 101.0) == RetryCheck(True, True)
    assert b.check("a", "c:1", 101.0) == RetryCheck(True, True)
    first, second = b.check("a", "c:2", 102.0), b.check("a", "c:0", 103.0)
    assert (first.allowed, first.early) == (False, True)
    assert first.retry_after_s == pytest.approx(8.0)  # what is left of its own window
    assert (second.allowed, second.early, second.retry_after_s) == (False, True, 7.0)
    # other teams and fresh requests are untouched
    assert b.check("b", "c:0", 103.0).allowed
    assert b.check("a", "c:new", 103.0).allowed


def test_the_budget_window_slides() -> None:
    b = budget(window_s=60.0)
    for i in range(3):
        b.refused("a", f"c:{i}", 100.0, 0.0)
    assert b.check("a", "c:0", 1.0).allowed and b.check("a", "c:1", 1.0).allowed
    assert not b.check("a", "c:2", 2.0).allowed
    assert not b.check("a", "c:2", 60.9).allowed  # second 1 still inside the window
    assert b.check("a", "c:2", 61.0).allowed


def test_the_budget_grows_with_the_teams_other_requests() -> None:
    b = budget(early_retry_ratio=0.1)
    for i in range(50):
        assert b.check("a", f"fresh-{i}", 1.0).allowed
    for i in range(6):
        b.refused("a", f"c:{i}", 30.0, 2.0)
    allowed = [b.check("a", f"c:{i}", 3.0).allowed for i in range(6)]
    assert allowed == [True] * 5 + [False]  # max(2, 0.1 x 50)


def test_refusals_carry_jittered_delays_from_the_injected_source() -> None:
    b1 = RetryBudget(random.Random(7))
    b2 = RetryBudget(random.Random(7))
    d1 = [b1.refused("a", f"c:{i}", 2.0, 0.0) for i in range(20)]
    assert d1 == [b2.refused("a", f"c:{i}", 2.0, 0.0) for i in range(20)]
    assert all(2.0 <= d <= 3.0 for d in d1) and len(set(d1)) == 20


def test_remembered_fingerprints_are_bounded() -> None:
    b = budget(max_tracked=100)
    for i in range(1000):
        b.refused("a", f"c:{i}", 5.0, float(i) / 1000)
    assert b.tracked() == 100
    b.refused("a", "late", 5.0, 100.0)  # every earlier window is over by then
    assert b.tracked() == 1

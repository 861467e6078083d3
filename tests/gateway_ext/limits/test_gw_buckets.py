"""Token-bucket maths (pure): refill, reserve, retry_after exactness, settle, headers."""

from __future__ import annotations

import pytest

from gateway_ext.limits.buckets import (
    MAX_TOKENS_PER_MINUTE,
    UNITS_PER_TOKEN,
    BucketState,
    Verdict,
    check_limit,
    format_duration,
    refill,
    reserve,
    settle,
    to_ms,
)

TPM = 600  # 10 tokens per second: one token every 100 ms
U = UNITS_PER_TOKEN


def tokens_at(level_tokens: float, ms: int) -> BucketState:
    return BucketState(round(level_tokens * U), ms)


def test_a_new_bucket_is_full() -> None:
    assert refill(None, TPM, 5_000) == BucketState(TPM * U, 5_000)


@pytest.mark.parametrize(("start", "elapsed_ms", "expected_tokens"), [
    (0, 0, 0), (0, 100, 1), (0, 99, 0.99), (0, 1_000, 10), (0, 60_000, 600), (0, 90_000, 600),
    (-50, 1_000, -40), (-50, 65_000, 600), (599, 50, 599.5),
])
def test_refill_is_continuous_at_tpm_over_60_per_second(start: float, elapsed_ms: int,
                                                        expected_tokens: float) -> None:
    state = refill(tokens_at(start, 1_000), TPM, 1_000 + elapsed_ms)
    assert state.level == round(expected_tokens * U)


def test_refill_is_path_independent() -> None:
    start = tokens_at(-30, 0)
    direct = refill(start, TPM, 70_000)
    stepped = start
    for ms in range(0, 70_001, 7_000):
        stepped = refill(stepped, TPM, ms)
    assert direct == stepped


def test_a_clock_behind_the_bucket_refills_nothing() -> None:
    state = tokens_at(10, 5_000)
    assert refill(state, TPM, 4_000) == state


def test_a_lowered_limit_caps_the_level() -> None:
    assert refill(tokens_at(600, 0), 100, 0).level == 100 * U


def test_reserve_admits_while_tokens_last() -> None:
    state, res = reserve(None, TPM, 500, 0)
    assert res.verdict is Verdict.RESERVED
    assert (res.remaining_tokens, res.retry_after_ms, res.reset_ms) == (100, 0, 50_000)
    assert state == tokens_at(100, 0)


def test_retry_after_is_exactly_when_enough_tokens_are_back() -> None:
    state, _ = reserve(None, TPM, 500, 0)
    same, res = reserve(state, TPM, 200, 0)
    assert res.verdict is Verdict.DENIED and same is state  # a denial changes nothing
    assert res.retry_after_ms == 10_000 and res.retry_after_s == 10.0
    _, early = reserve(state, TPM, 200, res.retry_after_ms - 1)
    assert early.verdict is Verdict.DENIED and early.retry_after_ms == 1
    _, on_time = reserve(state, TPM, 200, res.retry_after_ms)
    assert on_time.verdict is Verdict.RESERVED and on_time.remaining_tokens == 0


@pytest.mark.parametrize(("level", "cost", "retry_ms"), [
    (0, 1, 100), (0, 600, 60_000), (99.99, 100, 1), (-90, 1, 9_100), (5, 7, 200), (5.5, 7, 150),
])
def test_retry_after_table(level: float, cost: int, retry_ms: int) -> None:
    _, res = reserve(tokens_at(level, 0), TPM, cost, 0)
    assert res.verdict is Verdict.DENIED and res.retry_after_ms == retry_ms


def test_a_cost_above_the_whole_bucket_can_never_pass() -> None:
    state, res = reserve(None, TPM, TPM + 1, 0)
    assert res.verdict is Verdict.TOO_LARGE and state is None
    _, exact = reserve(None, TPM, TPM, 0)
    assert exact.verdict is Verdict.RESERVED and exact.remaining_tokens == 0


def test_settle_refunds_the_unused_part() -> None:
    state, _ = reserve(None, TPM, 500, 0)
    assert settle(state, TPM, 500, 120, 0) == tokens_at(480, 0)


def test_settle_refund_is_capped_at_capacity() -> None:
    state, _ = reserve(None, TPM, 500, 0)
    assert settle(state, TPM, 500, 0, 30_000) == tokens_at(600, 30_000)


def test_settle_charges_an_underestimate_and_may_go_negative() -> None:
    state, _ = reserve(None, TPM, 500, 0)
    debt = settle(state, TPM, 500, 700, 0)
    assert debt == tokens_at(-100, 0) and debt.tokens == 0
    _, res = reserve(debt, TPM, 1, 0)
    assert res.verdict is Verdict.DENIED and res.retry_after_ms == 10_100
    _, after = reserve(debt, TPM, 1, 10_100)
    assert after.verdict is Verdict.RESERVED


@pytest.mark.parametrize(("ms", "text"), [
    (0, "0s"), (-5, "0s"), (1, "1ms"), (20, "20ms"), (999, "999ms"), (1_000, "1s"),
    (1_500, "1.5s"), (1_234, "1.234s"), (59_999, "59.999s"), (60_000, "1m0s"),
    (360_000, "6m0s"), (61_500, "1m1.5s"), (3_723_500, "1h2m3.5s"), (3_600_000, "1h0m0s"),
])
def test_format_duration_like_openai(ms: int, text: str) -> None:
    assert format_duration(ms) == text


def test_ratelimit_headers() -> None:
    _, res = reserve(None, TPM, 450, 0)
    assert res.headers() == {"x-ratelimit-limit-tokens": "600",
                             "x-ratelimit-remaining-tokens": "150",
                             "x-ratelimit-reset-tokens": "45s"}


def test_time_is_whole_milliseconds() -> None:
    assert (to_ms(0.0), to_ms(1.0005), to_ms(0.7), to_ms(1_700_000_000.123)) == (
        0, 1000, 700, 1_700_000_000_123)


@pytest.mark.parametrize("tpm", [0, -1, MAX_TOKENS_PER_MINUTE + 1])
def test_limits_out_of_range_are_refused(tpm: int) -> None:
    with pytest.raises(ValueError):
        check_limit(tpm)

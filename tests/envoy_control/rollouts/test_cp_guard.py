"""The canary guard rule: one table of live vs candidate metrics and the verdict each gets."""

from __future__ import annotations

import math

import pytest
from envoy_control.rollouts.guard import GuardThresholds, Outcome, VersionMetrics, judge

LIVE = VersionMetrics(requests=1000, error_rate=0.010, ttft_p95_s=0.50, output_tokens_mean=300.0,
                      refusal_rate=0.02)


def cand(**changes: float | None) -> VersionMetrics:
    base = {"requests": 1000.0, "error_rate": 0.010, "ttft_p95_s": 0.50,
            "output_tokens_mean": 300.0, "refusal_rate": 0.02}
    return VersionMetrics(**{**base, **changes})  # type: ignore[arg-type]


@pytest.mark.parametrize(("candidate", "outcome", "reason"), [
    (cand(), Outcome.PASS, "within"),
    # error rate: +0.5 points is the limit (1.0% -> 1.5% passes, 1.6% fails)
    (cand(error_rate=0.015), Outcome.PASS, "within"),
    (cand(error_rate=0.016), Outcome.FAIL, "error rate rose 0.60 points"),
    (cand(error_rate=0.0), Outcome.PASS, "within"),  # fewer errors never fail
    # p95 TTFT: +20% (0.5 s -> 0.6 s passes, 0.61 s fails); faster never fails
    (cand(ttft_p95_s=0.60), Outcome.PASS, "within"),
    (cand(ttft_p95_s=0.61), Outcome.FAIL, "p95 TTFT +22.0%"),
    (cand(ttft_p95_s=0.10), Outcome.PASS, "within"),
    # output length: ±15% either way (a template that stops short is as wrong as one that runs on)
    (cand(output_tokens_mean=345.0), Outcome.PASS, "within"),
    (cand(output_tokens_mean=346.0), Outcome.FAIL, "output length +15.3%"),
    (cand(output_tokens_mean=254.0), Outcome.FAIL, "output length -15.3%"),
    # refusal rate: +1 point
    (cand(refusal_rate=0.031), Outcome.FAIL, "refusal rate rose 1.10 points"),
    # too few samples on either side: not judged, even when it looks bad
    (cand(requests=199, ttft_p95_s=5.0), Outcome.INSUFFICIENT, "candidate finished 199 requests"),
    # missing data: that metric is not judged, the rest is
    (cand(error_rate=None, refusal_rate=None), Outcome.PASS, "within"),
    (cand(error_rate=None, ttft_p95_s=0.9), Outcome.FAIL, "p95 TTFT +80.0%"),
    (cand(ttft_p95_s=math.nan), Outcome.PASS, "within"),
])
def test_guard_table(candidate: VersionMetrics, outcome: Outcome, reason: str) -> None:
    verdict = judge(LIVE, candidate)
    assert verdict.outcome == outcome
    assert any(reason in r for r in verdict.reasons), verdict.reasons


def test_several_failures_are_all_reported_with_both_values() -> None:
    verdict = judge(LIVE, cand(error_rate=0.05, ttft_p95_s=1.0, output_tokens_mean=600.0))
    assert verdict.outcome == Outcome.FAIL and len(verdict.reasons) == 3
    ttft = next(f for f in verdict.findings if f.metric == "p95 TTFT")
    assert (ttft.live, ttft.candidate, ttft.change, ttft.failed) == (0.5, 1.0, 1.0, True)
    assert "0.5 s -> 1 s" in ttft.message
    data = verdict.as_dict()
    assert data["outcome"] == "fail" and len(data["findings"]) == 4


def test_live_side_below_minimum_and_custom_thresholds() -> None:
    few = VersionMetrics(requests=3, ttft_p95_s=0.5)
    verdict = judge(few, cand(), GuardThresholds())
    assert verdict.outcome == Outcome.INSUFFICIENT and "live finished 3" in verdict.reasons[0]
    lenient = GuardThresholds(max_ttft_p95_rise=1.0, min_requests=1)
    assert judge(few, cand(ttft_p95_s=0.9), lenient).outcome == Outcome.PASS
    assert judge(VersionMetrics(1, ttft_p95_s=0.0), cand(), lenient).outcome == Outcome.FAIL
    with pytest.raises(ValueError):
        GuardThresholds(max_error_rate_rise=-0.1)

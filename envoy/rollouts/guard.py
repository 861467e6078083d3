"""The canary guard rule (pure): is a candidate version worse than the live version?

Shared by the rollout controller (:mod:`envoy_control.rollouts.controller`, fed from Prometheus) and the
simulator's canary drill (fed from simulated requests): if a drill needs a different rule than
production, one of them has a bug.

The seed's canary rules, starting values to tune: roll back when, against the live version,

- the error rate rises by more than 0.5 points (0.005 as a share of requests);
- p95 time to first token rises by more than 20%;
- the average output length shifts by more than 15%, either way (a wrong chat template makes
  answers run on or stop short without raising any error).

The seed names a fourth guard metric, the refusal rate, without a threshold; the starting
value here is a rise of 1 point. A metric either side has no data for (``None``: not exported,
or nothing finished in the window) is reported and not judged. Below ``min_requests`` finished
requests on either side the verdict is ``insufficient``: too few samples to tell.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any


@dataclass(frozen=True)
class GuardThresholds:
    """Rollback thresholds. Rates are shares of requests (0.005 = 0.5 points); ``*_rise`` and
    ``*_shift`` of TTFT and output length are relative to the live version (0.2 = 20%)."""

    max_error_rate_rise: float = 0.005
    """Error rate may rise by at most this share of requests (absolute, 0.005 = 0.5 points)."""
    max_ttft_p95_rise: float = 0.20
    """p95 time to first token may rise by at most this share of the live version's."""
    max_output_length_shift: float = 0.15
    """Average output tokens per request may move by at most this share, up or down."""
    max_refusal_rate_rise: float = 0.01
    """Refusal rate may rise by at most this share of requests (absolute, 0.01 = 1 point)."""
    min_requests: int = 200
    """Finished requests each side needs in the window before the guard judges at all."""

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")


@dataclass(frozen=True)
class VersionMetrics:
    """Guard metrics of one version over one window. ``requests``: finished requests in the
    window; rates are shares (0..1); ``ttft_p95_s`` in seconds; ``output_tokens_mean`` in
    tokens per request. ``None``: no data."""

    requests: float
    error_rate: float | None = None
    ttft_p95_s: float | None = None
    output_tokens_mean: float | None = None
    refusal_rate: float | None = None

    def as_dict(self) -> dict[str, Any]:
        """Plain data (for the ``rollouts`` table and the API)."""
        return asdict(self)


class Outcome(StrEnum):
    """What the guard concluded."""

    PASS = "pass"
    FAIL = "fail"
    INSUFFICIENT = "insufficient"


@dataclass(frozen=True)
class Finding:
    """One metric compared: both values, the change (absolute for rates, relative otherwise),
    the limit it was held to, and whether it failed. ``change`` is None when not judged."""

    metric: str
    live: float | None
    candidate: float | None
    change: float | None
    limit: float
    failed: bool
    message: str


@dataclass(frozen=True)
class GuardVerdict:
    """The guard's verdict with every finding; ``reasons`` are the messages that decided it."""

    outcome: Outcome
    findings: tuple[Finding, ...]
    reasons: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        """Plain data (for the ``rollouts`` table and the API)."""
        return {
            "outcome": self.outcome.value,
            "reasons": list(self.reasons),
            "findings": [asdict(f) for f in self.findings],
        }


def _known(x: float | None) -> float | None:
    return None if x is None or math.isnan(x) else x


def _absolute(metric: str, live: float | None, cand: float | None, limit: float) -> Finding:
    if live is None or cand is None:
        return Finding(metric, live, cand, None, limit, False, f"{metric}: no data, not judged")
    change = cand - live
    failed = change > limit + 1e-12
    verb = "rose" if change >= 0 else "fell"
    message = (f"{metric} {verb} {abs(change) * 100:.2f} points ({live:.2%} -> {cand:.2%}); "
               f"limit +{limit * 100:.2f} points")
    return Finding(metric, live, cand, change, limit, failed, message)


def _relative(metric: str, live: float | None, cand: float | None, limit: float,
              both_ways: bool, unit: str) -> Finding:
    if live is None or cand is None:
        return Finding(metric, live, cand, None, limit, False, f"{metric}: no data, not judged")
    zero_base = 0.0 if cand <= 0 else math.inf  # no live value to be relative to
    change = zero_base if live <= 0 else (cand - live) / live
    failed = (abs(change) if both_ways else change) > limit + 1e-12
    bound = f"±{limit:.0%}" if both_ways else f"+{limit:.0%}"
    message = (f"{metric} {change:+.1%} ({live:.4g} {unit} -> {cand:.4g} {unit}); limit {bound}")
    return Finding(metric, live, cand, change, limit, failed, message)


def judge(live: VersionMetrics, candidate: VersionMetrics,
          thresholds: GuardThresholds = GuardThresholds()) -> GuardVerdict:
    """Compare ``candidate`` with ``live`` over the same window.

    ``insufficient`` when either side finished fewer than ``thresholds.min_requests``
    requests (nothing is judged; the findings are still listed); else ``fail`` when any
    metric with data on both sides passes its threshold; else ``pass``.
    """
    t = thresholds
    findings = (
        _absolute("error rate", _known(live.error_rate), _known(candidate.error_rate),
                  t.max_error_rate_rise),
        _relative("p95 TTFT", _known(live.ttft_p95_s), _known(candidate.ttft_p95_s),
                  t.max_ttft_p95_rise, False, "s"),
        _relative("output length", _known(live.output_tokens_mean),
                  _known(candidate.output_tokens_mean), t.max_output_length_shift, True,
                  "tokens"),
        _absolute("refusal rate", _known(live.refusal_rate), _known(candidate.refusal_rate),
                  t.max_refusal_rate_rise),
    )
    short = [f"{side} finished {n:g} requests in the window, fewer than {t.min_requests}"
             for side, n in (("live", live.requests), ("candidate", candidate.requests))
             if not n >= t.min_requests]
    if short:
        return GuardVerdict(Outcome.INSUFFICIENT, findings, tuple(short))
    failed = tuple(f.message for f in findings if f.failed)
    if failed:
        return GuardVerdict(Outcome.FAIL, findings, failed)
    return GuardVerdict(Outcome.PASS, findings, ("every guard metric within its threshold",))

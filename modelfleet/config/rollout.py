"""The ``rollout:`` config section: the guard's rollback thresholds and the stages with their holds.

The defaults are the seed's canary rules and stages; the control plane's rollout controller
(``envoy_control.rollouts.controller.policy_from_config``) reads this section at every rollout start (its
flags ``--rollout-hold``, ``--guard-window``, ``--guard-min-requests`` still override it)::

    rollout:
      error_rate_points: 0.5       # roll back when the error rate rises > 0.5 points
      p95_ttft_ratio: 0.20         # ... p95 TTFT rises > 20%
      output_length_shift: 0.15    # ... average output length moves > 15% either way
      refusal_points: 1.0          # ... the refusal rate rises > 1 point
      min_requests: 200            # finished requests per side before judging at all
      window_s: 300                # seconds of metrics behind each verdict
      keep_old_s: 86400            # old version kept loaded after promotion
      stages:
        - {name: shadow, kind: shadow, percent: 1, hold_s: 1800}
        - {name: canary-1, kind: canary, percent: 1, hold_s: 1800}
        - {name: canary-10, kind: canary, percent: 10, hold_s: 1800}
        - {name: canary-50, kind: canary, percent: 50, hold_s: 1800}

Checked at load (``modelfleet validate``): at least one stage, unique names, shadow stages
before canary stages, canary percents never falling.
"""

from __future__ import annotations

from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

DEFAULT_HOLD_S = 1800.0
"""Each default stage's hold, seconds (30 minutes)."""


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RolloutStage(_Record):
    """One stage: ``percent`` (0..100] of conversations (canary) or of requests copied
    (shadow), held at least ``hold_s`` seconds before the guard may advance it."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,31}$")
    kind: Literal["shadow", "canary"]
    percent: float = Field(gt=0, le=100)
    hold_s: float = Field(default=DEFAULT_HOLD_S, ge=0)


def default_stages() -> tuple[RolloutStage, ...]:
    """The seed's stages: shadow 1%, then canary 1%, 10%, 50%, each held 30 minutes."""
    return (RolloutStage(name="shadow", kind="shadow", percent=1),
            RolloutStage(name="canary-1", kind="canary", percent=1),
            RolloutStage(name="canary-10", kind="canary", percent=10),
            RolloutStage(name="canary-50", kind="canary", percent=50))


class RolloutSettings(_Record):
    """Guard thresholds (points are percentage points of requests, ratios are shares of the live
    version's value) and the stages a rollout goes through."""

    error_rate_points: float = Field(default=0.5, ge=0, le=100)
    """Rollback when the error rate rises by more than this many points (0.5 = 0.5%)."""
    p95_ttft_ratio: float = Field(default=0.20, ge=0)
    """Rollback when p95 TTFT rises by more than this share of the live version's (0.2 = 20%)."""
    output_length_shift: float = Field(default=0.15, ge=0)
    """Rollback when the average output length moves by more than this share, either way."""
    refusal_points: float = Field(default=1.0, ge=0, le=100)
    """Rollback when the refusal rate rises by more than this many points."""
    min_requests: int = Field(default=200, ge=1)
    """Finished requests each side needs in the window before the guard judges."""
    window_s: float = Field(default=300.0, gt=0)
    """Seconds of metrics behind each verdict."""
    keep_old_s: float = Field(default=24 * 3600.0, ge=0)
    """Seconds the old version stays loaded after promotion (then its pool is released)."""
    stages: tuple[RolloutStage, ...] = Field(default_factory=default_stages)

    @model_validator(mode="after")
    def _stages_in_order(self) -> Self:
        if not self.stages:
            raise ValueError("stages: a rollout needs at least one stage")
        names = [s.name for s in self.stages]
        if len(set(names)) != len(names):
            raise ValueError(f"stages: names must be unique, got {names}")
        first_canary = next((i for i, s in enumerate(self.stages) if s.kind == "canary"),
                            len(self.stages))
        if any(s.kind == "shadow" for s in self.stages[first_canary:]):
            raise ValueError("stages: every shadow stage comes before the canary stages")
        canary = [s.percent for s in self.stages if s.kind == "canary"]
        if canary != sorted(canary):
            raise ValueError(f"stages: canary percents must not fall, got {canary}")
        return self

"""The rollout controller as a pure state machine: stages, holds, guard verdicts, rollback.

A rollout takes one registered version of a model through the seed's stages, each held for a
configured time (seconds, on an injected clock):

    shadow (1% of requests copied, answers discarded) -> canary 1% -> canary 10% -> canary 50%
    -> alias (the model name points at the version) -> old version released after 24 h

:func:`advance` is called on every tick with the guard's verdict for the window just ended.
A ``fail`` verdict at any time rolls back at once with one weight change (the version leaves
its stage; the alias never moved). A stage is left only when its hold has passed *and* the
guard passes; with too few samples it is held longer. After the alias moves, the old version
stays loaded ``keep_old_s`` (24 h), so a manual rollback is one alias change; then its pool is
released. Every transition returns the actions to apply and a :class:`RolloutDecision` to record.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, Literal

from envoy_control.rollouts.guard import GuardThresholds, GuardVerdict, Outcome

from modelfleet.config.rollout import RolloutSettings

StageKind = Literal["shadow", "canary"]


@dataclass(frozen=True)
class Stage:
    """One stage: ``kind`` and ``percent`` (0..100) of conversations (canary) or requests
    copied (shadow), held at least ``hold_s`` seconds."""

    name: str
    kind: StageKind
    percent: float
    hold_s: float


def default_stages(hold_s: float = 1800.0, shadow_percent: float = 1.0) -> tuple[Stage, ...]:
    """The seed's stages, each held ``hold_s`` seconds: shadow, then canary 1%, 10%, 50%."""
    return (Stage("shadow", "shadow", shadow_percent, hold_s),
            Stage("canary-1", "canary", 1.0, hold_s),
            Stage("canary-10", "canary", 10.0, hold_s),
            Stage("canary-50", "canary", 50.0, hold_s))


@dataclass(frozen=True)
class RolloutPolicy:
    """Stages, guard window (seconds of metrics each verdict reads), thresholds, and how long
    the old version stays loaded after promotion (seconds)."""

    stages: tuple[Stage, ...] = field(default_factory=default_stages)
    window_s: float = 300.0
    thresholds: GuardThresholds = field(default_factory=GuardThresholds)
    keep_old_s: float = 24 * 3600.0

    def __post_init__(self) -> None:
        if not self.stages:
            raise ValueError("a rollout needs at least one stage")
        if self.window_s <= 0 or self.keep_old_s < 0:
            raise ValueError("window_s must be > 0 and keep_old_s >= 0")


def policy_from_config(settings: RolloutSettings) -> RolloutPolicy:
    """The policy of the config's ``rollout:`` section (points become shares: 0.5 -> 0.005)."""
    return RolloutPolicy(
        stages=tuple(Stage(s.name, s.kind, s.percent, s.hold_s) for s in settings.stages),
        window_s=settings.window_s,
        thresholds=GuardThresholds(
            max_error_rate_rise=settings.error_rate_points / 100.0,
            max_ttft_p95_rise=settings.p95_ttft_ratio,
            max_output_length_shift=settings.output_length_shift,
            max_refusal_rate_rise=settings.refusal_points / 100.0,
            min_requests=settings.min_requests),
        keep_old_s=settings.keep_old_s)


class Phase(StrEnum):
    """Where a rollout is."""

    RUNNING = "running"
    PROMOTED = "promoted"
    """The alias points at the version; the old version is still loaded."""
    RELEASED = "released"
    ROLLED_BACK = "rolled_back"
    ABORTED = "aborted"


@dataclass(frozen=True)
class SetStage:
    """Put ``model@version`` at ``kind`` for ``percent`` (0: take it out)."""

    model: str
    version: str
    kind: StageKind
    percent: float


@dataclass(frozen=True)
class SetAlias:
    """Point ``model`` at ``version``."""

    model: str
    version: str


@dataclass(frozen=True)
class ReleasePool:
    """Unload ``model@version``: its pools are released, its status becomes ``retired``."""

    model: str
    version: str


Action = SetStage | SetAlias | ReleasePool


@dataclass(frozen=True)
class RolloutDecision:
    """One recorded decision (a row of ``rollouts``): the stage it was taken in, what was
    decided and why, and the guard's metrics behind it. Times in seconds."""

    model: str
    version: str
    stage: str
    percent: float
    started_s: float
    decided_s: float
    decision: Literal["start", "advance", "promote", "release", "rollback", "abort"]
    reasons: tuple[str, ...]
    guard: dict[str, Any] | None = None
    previous: str | None = None
    """The version being replaced (a restarted controller resumes with it)."""


@dataclass(frozen=True)
class Rollout:
    """A rollout of ``model@version`` replacing ``previous`` (the alias when it began)."""

    model: str
    version: str
    previous: str
    policy: RolloutPolicy
    phase: Phase = Phase.RUNNING
    stage_index: int = 0
    stage_started_s: float = 0.0
    promoted_s: float | None = None
    waiting: str = ""
    """Why the current stage is held past its hold time (too few samples), if it is."""

    @property
    def stage(self) -> Stage:
        """The current stage (the last one once promoted)."""
        return self.policy.stages[min(self.stage_index, len(self.policy.stages) - 1)]


@dataclass(frozen=True)
class Step:
    """What a transition did: the new rollout, the actions to apply, the decision to record."""

    rollout: Rollout
    actions: tuple[Action, ...] = ()
    decision: RolloutDecision | None = None


def _decide(r: Rollout, now_s: float, decision: Any, reasons: tuple[str, ...],
            guard: dict[str, Any] | None = None, stage: str | None = None) -> RolloutDecision:
    s = r.stage
    percent = 100.0 if stage == "alias" else s.percent
    return RolloutDecision(r.model, r.version, stage or s.name, percent, r.stage_started_s, now_s,
                    decision, reasons, guard, r.previous)


def begin(model: str, version: str, previous: str, policy: RolloutPolicy, now_s: float) -> Step:
    """Start a rollout at its first stage."""
    r = Rollout(model, version, previous, policy, stage_started_s=now_s)
    first = policy.stages[0]
    return Step(r, (SetStage(model, version, first.kind, first.percent),),
                _decide(r, now_s, "start", (f"{model}@{version} replaces {model}@{previous}",)))


def _next_stage(r: Rollout, now_s: float, guard: dict[str, Any]) -> Step:
    current = r.stage
    if r.stage_index + 1 < len(r.policy.stages):
        nxt = r.policy.stages[r.stage_index + 1]
        actions: list[Action] = [SetStage(r.model, r.version, nxt.kind, nxt.percent)]
        if nxt.kind != current.kind:
            actions.insert(0, SetStage(r.model, r.version, current.kind, 0.0))
        why = f"{current.name} held {now_s - r.stage_started_s:.0f} s, guard passed: {nxt.name}"
        decision = _decide(r, now_s, "advance", (why,), guard)
        return Step(replace(r, stage_index=r.stage_index + 1, stage_started_s=now_s, waiting=""),
                    tuple(actions), decision)
    why = f"{current.name} held {now_s - r.stage_started_s:.0f} s, guard passed: alias -> {r.version}"
    decision = _decide(r, now_s, "promote", (why,), guard, stage="alias")
    promoted = replace(r, phase=Phase.PROMOTED, promoted_s=now_s, waiting="")
    return Step(promoted, (SetAlias(r.model, r.version),), decision)


def advance(r: Rollout, now_s: float, verdict: GuardVerdict | None,
            metrics: dict[str, Any] | None = None) -> Step:
    """One tick at ``now_s`` (seconds). ``verdict``: the guard over the last window (None when
    the metrics could not be read: nothing moves); ``metrics``: what it read, to record."""
    if r.phase == Phase.PROMOTED:
        assert r.promoted_s is not None
        if now_s - r.promoted_s < r.policy.keep_old_s:
            return Step(r)
        why = f"{r.model}@{r.previous} kept loaded {r.policy.keep_old_s:.0f} s after promotion"
        return Step(replace(r, phase=Phase.RELEASED), (ReleasePool(r.model, r.previous),),
                    _decide(r, now_s, "release", (why,), stage="alias"))
    if r.phase != Phase.RUNNING or verdict is None:
        return Step(r)
    guard = {**(metrics or {}), "verdict": verdict.as_dict()}
    if verdict.outcome == Outcome.FAIL:
        s = r.stage
        decision = _decide(r, now_s, "rollback", verdict.reasons, guard)
        return Step(replace(r, phase=Phase.ROLLED_BACK, waiting=""),
                    (SetStage(r.model, r.version, s.kind, 0.0),), decision)
    if now_s - r.stage_started_s < r.stage.hold_s:
        return Step(r)
    if verdict.outcome == Outcome.INSUFFICIENT:
        return Step(replace(r, waiting="; ".join(verdict.reasons)))
    return _next_stage(r, now_s, guard)


def abort(r: Rollout, now_s: float, reason: str) -> Step:
    """Stop a running rollout where it is (a manual change to the model took over)."""
    if r.phase != Phase.RUNNING:
        return Step(r)
    return Step(replace(r, phase=Phase.ABORTED), (), _decide(r, now_s, "abort", (reason,)))

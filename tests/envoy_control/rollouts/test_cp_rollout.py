"""The rollout controller's state machine on a fake clock: stages, holds, rollback, release."""

from __future__ import annotations

from envoy_control.rollouts.controller import (
    Phase,
    ReleasePool,
    RolloutPolicy,
    SetAlias,
    SetStage,
    abort,
    advance,
    begin,
    default_stages,
)
from envoy_control.rollouts.guard import GuardVerdict, Outcome, VersionMetrics, judge

POLICY = RolloutPolicy(stages=default_stages(hold_s=600), keep_old_s=86_400)
GOOD = VersionMetrics(requests=1000, error_rate=0.01, ttft_p95_s=0.5, output_tokens_mean=300)
PASS = judge(GOOD, GOOD)
FAIL = judge(GOOD, VersionMetrics(1000, 0.01, 0.9, 300))
FEW = judge(GOOD, VersionMetrics(10, 0.01, 0.5, 300))


def test_a_healthy_version_goes_through_every_stage_to_the_alias_then_releases_the_old() -> None:
    step = begin("chat-7b", "v15", "v13", POLICY, now_s=0)
    assert step.actions == (SetStage("chat-7b", "v15", "shadow", 1.0),)
    assert step.decision is not None and step.decision.decision == "start"
    r, now, seen = step.rollout, 0.0, []
    while r.phase == Phase.RUNNING:
        now += 60
        step = advance(r, now, PASS, {"m": 1})
        r = step.rollout
        if step.actions:
            seen.append((now, step.actions))
    assert [t for t, _ in seen] == [600, 1200, 1800, 2400]  # each stage held exactly 600 s
    assert seen[0][1] == (SetStage("chat-7b", "v15", "shadow", 0.0),
                          SetStage("chat-7b", "v15", "canary", 1.0))
    assert seen[1][1] == (SetStage("chat-7b", "v15", "canary", 10.0),)
    assert seen[2][1] == (SetStage("chat-7b", "v15", "canary", 50.0),)
    assert seen[3][1] == (SetAlias("chat-7b", "v15"),)
    assert step.decision is not None and step.decision.decision == "promote"
    assert step.decision.guard is not None and step.decision.guard["verdict"]["outcome"] == "pass"
    assert r.phase == Phase.PROMOTED and r.promoted_s == 2400

    assert advance(r, 2400 + 86_399, None).actions == ()  # the old version stays loaded 24 h
    step = advance(r, 2400 + 86_400, None)
    assert step.actions == (ReleasePool("chat-7b", "v13"),)
    assert step.rollout.phase == Phase.RELEASED and step.decision is not None
    assert advance(step.rollout, 10**6, PASS).actions == ()  # done


def test_a_failing_guard_rolls_back_at_once_with_one_weight_change() -> None:
    r = begin("chat-7b", "v15", "v13", POLICY, now_s=0).rollout
    r = advance(r, 600, PASS).rollout  # into canary 1%
    r = advance(r, 1200, PASS).rollout  # into canary 10%
    step = advance(r, 1210, FAIL, {"live": {}, "candidate": {}})  # 10 s in: no wait for the hold
    assert step.actions == (SetStage("chat-7b", "v15", "canary", 0.0),)
    assert step.rollout.phase == Phase.ROLLED_BACK
    d = step.decision
    assert d is not None and d.decision == "rollback" and d.stage == "canary-10"
    assert d.percent == 10.0 and d.started_s == 1200 and d.decided_s == 1210
    assert "p95 TTFT" in d.reasons[0] and d.guard is not None and "candidate" in d.guard
    assert advance(step.rollout, 5000, PASS).actions == ()


def test_too_few_samples_hold_the_stage_past_its_time() -> None:
    r = begin("chat-7b", "v15", "v13", POLICY, now_s=0).rollout
    step = advance(r, 700, FEW)
    assert step.actions == () and step.decision is None
    assert "candidate finished 10 requests" in step.rollout.waiting
    assert advance(step.rollout, 700, None).actions == ()  # unreadable metrics: nothing moves
    step = advance(step.rollout, 800, PASS)
    assert step.actions[-1] == SetStage("chat-7b", "v15", "canary", 1.0)
    assert step.rollout.stage_started_s == 800 and step.rollout.waiting == ""


def test_a_manual_change_aborts_a_running_rollout() -> None:
    r = begin("chat-7b", "v15", "v13", POLICY, now_s=0).rollout
    step = abort(r, 30, "manual change by admin:admin")
    assert step.rollout.phase == Phase.ABORTED and step.actions == ()
    assert step.decision is not None and step.decision.reasons == ("manual change by admin:admin",)
    assert abort(step.rollout, 40, "again").decision is None


def test_custom_verdict_objects_and_policy_checks() -> None:
    single = RolloutPolicy(stages=default_stages(hold_s=1)[1:2], keep_old_s=0)
    r = begin("m", "v2", "v1", single, 0).rollout
    step = advance(r, 1, GuardVerdict(Outcome.PASS, (), ("ok",)))
    assert step.actions == (SetAlias("m", "v2"),)
    assert advance(step.rollout, 1, None).actions == (ReleasePool("m", "v1"),)

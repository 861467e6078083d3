"""A rollout in progress rebuilt from its recorded decisions (pure): a restarted control plane
resumes it instead of forgetting it.

The ``rollouts`` table holds every decision (:func:`envoy_control.rollouts.driver.decision_row`).
A model's *last* decision says where its rollout is:

| last decision | resumed as |
|---|---|
| ``start`` | running, at the recorded ``stage``, since ``decided_at`` |
| ``advance`` | running, at the stage *after* the recorded one (the decision names the stage it left), since ``decided_at`` |
| ``promote`` | promoted at ``decided_at``: the old version is released ``keep_old_s`` after it |
| ``rollback``, ``abort``, ``release`` | nothing: the rollout is over |

A stage's hold is counted from its recorded start, so time spent while the control plane was
down counts. The replaced version is the row's ``previous`` (rows written before that column:
the model's live alias, which a running rollout never moves). When the recorded stage is not
in the current policy (the ``rollout:`` stages changed meanwhile) the rollout cannot be placed:
:class:`Unresumable` says why, and the controller records an abort.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from envoy_control.rollouts.controller import Phase, Rollout, RolloutPolicy

OVER = ("rollback", "abort", "release")


@dataclass(frozen=True)
class Unresumable:
    """A recorded rollout that cannot be placed in the current policy, and why."""

    model: str
    version: str
    previous: str | None
    stage: str
    reason: str


def resume(last: Mapping[str, Any], policy: RolloutPolicy, live: str | None
           ) -> Rollout | Unresumable | None:
    """The rollout of ``last`` (a model's last decision row, times in Unix seconds) under
    ``policy``; None when it is over. ``live``: the model's alias now (stands in for a row
    without ``previous``)."""
    decision = str(last["decision"])
    if decision in OVER:
        return None
    model, version = str(last["model"]), str(last["version"])
    previous = last.get("previous") or (live if decision != "promote" else None)
    names = [s.name for s in policy.stages]
    stage = str(last["stage"])
    decided = float(last["decided_at"])
    if previous is None or previous == version:
        return Unresumable(model, version, None, stage, "the replaced version is not recorded")
    if decision == "promote":
        return Rollout(model, version, str(previous), policy, Phase.PROMOTED,
                       stage_index=len(names) - 1, stage_started_s=float(last["started_at"]),
                       promoted_s=decided)
    if stage not in names:
        return Unresumable(model, version, str(previous), stage,
                           f"stage {stage!r} is not in the configured stages {names}")
    index = names.index(stage) + (1 if decision == "advance" else 0)
    if index >= len(names):
        return Unresumable(model, version, str(previous), stage,
                           f"no stage after {stage!r} in the configured stages {names}")
    return Rollout(model, version, str(previous), policy, stage_index=index,
                   stage_started_s=decided)

"""The rollout controller in the simulator: guard metrics per version from the simulated
requests, the same guard rule and state machine as production, applied to the region.

Every ``tick_s`` the controller reads, per version, the attempts answered in the last
``window_s`` seconds (:attr:`sim.fleet.measures.Measured.completions`): requests, error rate (5xx
answers over answers), p95 TTFT (from the attempt's arrival at the gateway), mean output
tokens; refusals are not modelled (not judged). It calls :func:`envoy_control.rollouts.guard.judge` and
:func:`envoy_control.rollouts.controller.advance`, and applies the actions: a canary stage sets the split
percent and sizes the canary pool (``ceil(percent x live replicas)``, at least 1, warm: it
serves at once); a rollback takes the percent to 0 and drains the pool; a promotion points the
alias at the canary.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import random
from dataclasses import dataclass, field
from typing import Any

from envoy_control.rollouts.controller import (
    Phase,
    Rollout,
    RolloutDecision,
    RolloutPolicy,
    SetAlias,
    SetStage,
    Step,
    advance,
    begin,
)
from envoy_control.rollouts.guard import GuardVerdict, VersionMetrics, judge

from gateway_ext.request import ChatRequest
from gateway_ext.routing.versions import choose, pin_targets, settle_pin
from modelfleet.contract.router_state_types import ModelAlias
from sim.fleet.measures import quantile
from sim.fleet.region import Fleet


def window_metrics(completions: list[tuple[float, str, float, int, bool]], pool: str,
                   start_s: float, end_s: float) -> VersionMetrics:
    """Guard metrics of ``pool`` over answers in ``[start_s, end_s)`` seconds; ``completions``
    in time order. Error rate: errors over answers; TTFT p95 and mean output over the ok ones."""
    lo = bisect.bisect_left(completions, start_s, key=lambda c: c[0])
    hi = bisect.bisect_left(completions, end_s, key=lambda c: c[0])
    ttfts, outputs, errors = [], 0, 0
    for _t, key, ttft, out, ok in completions[lo:hi]:
        if key != pool:
            continue
        if ok:
            ttfts.append(ttft)
            outputs += out
        else:
            errors += 1
    n = len(ttfts) + errors
    return VersionMetrics(
        requests=float(n), error_rate=errors / n if n else None,
        ttft_p95_s=quantile(ttfts, 0.95) if ttfts else None,
        output_tokens_mean=outputs / len(ttfts) if ttfts else None)


@dataclass(frozen=True)
class Check:
    """One controller tick: time (seconds), stage, percent, both sides' metrics, the verdict."""

    t_s: float
    stage: str
    percent: float
    live: VersionMetrics
    canary: VersionMetrics
    outcome: str


@dataclass
class Controller:
    """The rollout of ``canary`` (a pool key's version) against the alias's ``live`` version in
    ``fleet``, begun at ``start_s`` (seconds); a hook of the fleet (:attr:`Fleet.hooks`)."""

    fleet: Fleet
    canary_pool: str
    policy: RolloutPolicy
    start_s: float
    tick_s: float = 30.0
    linger_s: float = 60.0
    """Seconds simulated after a rollback or promotion before the run stops."""
    seed: int = 0
    rollout: Rollout | None = None
    decisions: list[RolloutDecision] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    conversations: set[str] = field(default_factory=set)
    """Conversations the split sent to the canary."""
    pins: dict[str, str] = field(default_factory=dict)
    """Conversation id -> the version it is pinned to."""
    alias: ModelAlias = field(init=False)
    _next_s: float = field(init=False)
    _rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        spec = self.fleet.spec
        self.alias = ModelAlias(spec.model, spec.version, self.fleet.versions[self.canary_pool].version)
        self._next_s, self._rng = self.start_s, random.Random(self.seed)

    def choose_version(self, req: ChatRequest) -> str:
        """The gateway's version choice on the current alias: a conversation keeps the version
        it is pinned to while that version is in the alias, else the split of its id decides
        and is pinned (:mod:`gateway_ext.routing.versions`, as the gateway's pin store)."""
        cid = req.conversation_id
        draw = self._rng.random() if cid is None else 0.0
        candidate = choose(self.alias, None, cid, draw).version
        if cid is None:
            return candidate
        version, write = settle_pin(self.pins.get(cid), candidate, pin_targets(self.alias))
        if write:
            self.pins[cid] = version
        if version == self.alias.canary:
            self.conversations.add(cid)
        return version

    def __call__(self, fleet: Fleet, t: float) -> None:
        if t < self._next_s:
            return
        self._next_s += self.tick_s
        if self.rollout is None:
            v = fleet.versions[self.canary_pool]
            self._apply(begin(fleet.spec.model, v.version, fleet.spec.version, self.policy, t), t)
            return
        if self.rollout.phase is not Phase.RUNNING:
            return
        done = fleet.m.completions
        live = window_metrics(done, fleet.main, t - self.policy.window_s, t)
        cand = window_metrics(done, self.canary_pool, t - self.policy.window_s, t)
        verdict: GuardVerdict = judge(live, cand, self.policy.thresholds)
        self.checks.append(Check(t, self.rollout.stage.name, self.alias.canary_percent, live, cand,
                                 verdict.outcome.value))
        metrics: dict[str, Any] = {"live": live.as_dict(), "candidate": cand.as_dict()}
        self._apply(advance(self.rollout, t, verdict, metrics), t)

    def _apply(self, step: Step, t: float) -> None:
        self.rollout = step.rollout
        if step.decision is not None:
            self.decisions.append(step.decision)
        fleet = self.fleet
        live_replicas = len(fleet.serving_ids(fleet.main))
        for action in step.actions:
            if isinstance(action, SetStage) and action.kind == "canary":
                self.alias = dataclasses.replace(self.alias, canary_percent=action.percent)
                n = max(1, math.ceil(action.percent / 100 * live_replicas)) if action.percent else 0
                fleet.resize(self.canary_pool, n, t)
            elif isinstance(action, SetAlias):
                self.alias = ModelAlias(self.alias.model, action.version)
                fleet.resize(self.canary_pool, live_replicas, t)
        if step.rollout.phase is not Phase.RUNNING:
            fleet.loop.stop(t + self.linger_s)

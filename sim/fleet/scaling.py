"""The desired-replica rule in the simulator, with cold starts.

Every ``sync_period_s`` the simulator reads the pool's two Prometheus triggers as the
ScaledObject defines them (:mod:`autoscale.triggers`): ``tokens-in-flight``, the sum of the
replicas' tokens in flight, and ``queue-depth``, the sum of requests waiting in the engines, with
the targets :mod:`autoscale.policy` derives from the version's load-tested capacity. It then
calls :func:`autoscale.rule.desired_replicas`, the same step the local stack runs.

A new replica serves after a cold start: ``node_start_s`` (a new GPU node) plus ``load_s``
(weights pulled, loaded and warmed up); the seed's sum is 240 + 28 + 14 + 30 = 312 s, planned as
6 minutes. While ``warm_nodes`` idle nodes with the weights on disk remain, a new replica takes
only ``load_s``. Removed replicas stop taking requests and finish their streams (drain).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autoscale.policy import queue_threshold, scaler_spec, tokens_threshold
from autoscale.rule import Reading, ScalerSpec, ScalerState, desired_replicas
from autoscale.triggers import QUEUE_TRIGGER, TOKENS_TRIGGER
from modelfleet.config.autoscaling import AutoscalePolicy
from modelfleet.config.schema import Pool, Version


@dataclass(frozen=True)
class ColdStart:
    """Seconds until a requested replica serves: on a new node, or on a warm one."""

    node_start_s: float = 240.0
    load_s: float = 72.0
    """Weights pulled (14 GB at 0.5 GB/s = 28 s), loaded (14 s) and warmed up (30 s)."""
    warm_nodes: int = 0

    def delay_s(self, warm_left: int) -> float:
        """Seconds until a replica requested now serves, with ``warm_left`` warm nodes free."""
        return self.load_s + (0.0 if warm_left > 0 else self.node_start_s)


@dataclass(frozen=True)
class ScalerSetup:
    """The rule's inputs for one pool: spec, per-replica targets (tokens, requests), cold start."""

    spec: ScalerSpec
    tokens_target: float
    queue_target: float
    cold_start: ColdStart = field(default_factory=ColdStart)
    sync_period_s: float = 15.0


def scaler_setup(pool: Pool, version: Version, policy: AutoscalePolicy | None = None,
                 cold_start: ColdStart | None = None) -> ScalerSetup:
    """The setup the pool's ScaledObject implies (policy defaults: the seed's)."""
    policy = policy or AutoscalePolicy()
    return ScalerSetup(scaler_spec(pool, policy), float(tokens_threshold(version, policy)),
                       float(queue_threshold(version, policy)), cold_start or ColdStart(),
                       float(policy.polling_interval_s))


def scale_step(setup: ScalerSetup, state: ScalerState, current: int, tokens_in_flight: int,
               waiting: int, now_s: float) -> tuple[int, ScalerState]:
    """One sync at ``now_s`` (seconds): the replica count to set and the rule's next state.
    ``current``: replicas requested so far (serving plus starting); ``tokens_in_flight``
    (tokens) and ``waiting`` (requests) summed over the pool."""
    readings = [Reading(TOKENS_TRIGGER, setup.tokens_target, float(tokens_in_flight)),
                Reading(QUEUE_TRIGGER, setup.queue_target, float(waiting))]
    decision = desired_replicas(setup.spec, state, readings, current, now_s)
    return decision.replicas, decision.state


def scale_down_order(replicas: list[tuple[str, bool, float]]) -> list[str]:
    """Which replicas go first when the rule asks for fewer: ``(id, starting, ready_s)`` of the
    pool's non-draining replicas, returned in removal order: starting ones first (cancelling a
    cold start costs nothing), newest first, then serving ones, newest first."""
    return [rid for rid, _, _ in sorted(replicas, key=lambda r: (not r[1], -r[2]))]

"""The autoscaling policy: the seed's defaults, built from plain data, thresholds derived."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from autoscale.policy import (
    behavior,
    fallback_replicas,
    peaks_for,
    policy_from_data,
    queue_threshold,
    scaler_spec,
    tokens_threshold,
)
from modelfleet.config.autoscaling import AutoscalePolicy
from modelfleet.config.schema import PlatformConfig, Pool, Version

PEAK = {"name": "eu-morning", "timezone": "Europe/Dublin", "start": "50 7 * * 1-5",
        "end": "0 11 * * 1-5", "desired_replicas": 12, "model": "chat-7b"}


def test_defaults_are_the_seeds(policy: AutoscalePolicy) -> None:
    assert policy.target_utilization == 0.70
    assert (policy.scale_down.pods, policy.scale_down.period_s) == (1, 600)
    assert policy.scale_down.stabilization_s == 600
    assert policy.tolerance == 0.1
    assert policy.fallback.failure_threshold == 3
    assert policy.peaks == ()


def test_thresholds_come_from_the_version_record(example_config: PlatformConfig,
                                                 policy: AutoscalePolicy) -> None:
    chat, reason = example_config.version("chat-7b", "v13"), example_config.version("reason-70b", "v1")
    assert chat is not None and reason is not None
    assert tokens_threshold(chat, policy) == 78_400   # 0.7 x 112,000
    assert tokens_threshold(reason, policy) == 28_000  # 0.7 x 40,000
    assert queue_threshold(chat, policy) == 8          # floor(0.1 x 83)
    assert queue_threshold(reason, policy) == 2        # floor(0.1 x 20)


def test_a_measured_capacity_moves_the_threshold(chat_version: Version, policy: AutoscalePolicy) -> None:
    measured = chat_version.model_copy(update={"capacity": chat_version.capacity.model_copy(
        update={"tokens_in_flight": 90_000, "measured": True})})
    assert tokens_threshold(measured, policy) == 63_000


def test_partial_data_keeps_the_other_defaults() -> None:
    policy = policy_from_data({"scale_down": {"pods": 2}, "peaks": [PEAK]})
    assert (policy.scale_down.pods, policy.scale_down.stabilization_s) == (2, 600)
    assert policy.peaks[0].desired_replicas == 12


@pytest.mark.parametrize("data", [
    {"target_utilisation": 0.7},                                # unknown key
    {"target_utilization": 1.5},
    {"scale_down": {"period_s": 4000}},                         # HPA allows at most 1800
    {"peaks": [{**PEAK, "timezone": "Europe/Atlantis"}]},
    {"peaks": [{**PEAK, "start": "50 7 * *"}]},
    {"peaks": [{**PEAK, "end": PEAK["start"]}]},
    {"peaks": [PEAK, PEAK]},                                    # duplicate names
])
def test_bad_data_is_refused(data: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        policy_from_data(data)


def test_policy_is_frozen(policy: AutoscalePolicy) -> None:
    with pytest.raises(ValidationError):
        policy.target_utilization = 0.5  # type: ignore[misc]


@pytest.mark.parametrize(("share", "expected"), [(1.0, 16), (0.5, 8), (0.0, 6)])
def test_fallback_holds_a_share_of_max_never_below_the_warm_minimum(
        chat_pool: Pool, share: float, expected: int) -> None:
    policy = policy_from_data({"fallback": {"share_of_max": share}})
    assert fallback_replicas(chat_pool, policy) == expected


def test_peaks_filter_pools_and_respect_their_maximum(example_config: PlatformConfig) -> None:
    policy = policy_from_data({"peaks": [PEAK, {**PEAK, "name": "us", "region": "us-east-1",
                                                "version": "v13", "desired_replicas": 10}]})
    by_pool = {(p.key, p.region): [(k.name, k.desired_replicas) for k in peaks_for(p, policy)]
               for p in example_config.pools}
    assert by_pool[("chat-7b@v13", "us-east-1")] == [("eu-morning", 12), ("us", 10)]
    assert by_pool[("chat-7b@v14", "eu-west-1")] == [("eu-morning", 4)]  # the canary's max
    assert by_pool[("reason-70b@v1", "us-east-1")] == []


def test_scaler_spec(chat_pool: Pool, policy: AutoscalePolicy) -> None:
    spec = scaler_spec(chat_pool, policy)
    assert (spec.min_replicas, spec.max_replicas, spec.fallback_replicas) == (6, 16, 16)
    assert spec.behavior == behavior(policy)
    assert (spec.failure_threshold, spec.tolerance) == (3, 0.1)

"""Drain timings: a replica leaving its pool finishes its streams before it is killed."""

from __future__ import annotations

from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest

from autoscale.drain import DrainValues, drain_values, prestop_s
from autoscale.naming import deployment_name, pod_labels
from modelfleet.config.autoscaling import DrainPolicy
from modelfleet.config.schema import Model, PlatformConfig, Version


def _model(config: PlatformConfig, name: str) -> Model:
    model = config.model(name)
    assert model is not None
    return model


def test_chat_7b_values(example_config: PlatformConfig, chat_version: Version) -> None:
    v = drain_values(_model(example_config, "chat-7b"), chat_version)
    # 2,500 tok/s / 83 streams = 30.12 tok/s per stream; 4,096 / 30.12 = 136.0 s, + 1 s TTFT
    # -> 137 s. preStop (2 + 1 + 1 + 1 + 1) x 2 = 12 s; grace 12 + 137 + 10 = 159 s.
    assert v.slowest_stream_tokens_per_s == pytest.approx(30.12, abs=0.01)
    assert (v.stream_bound_s, v.shutdown_timeout_s, v.prestop_s, v.grace_s) == (137, 137, 12, 159)


def test_reason_70b_values(example_config: PlatformConfig) -> None:
    version = example_config.version("reason-70b", "v1")
    assert version is not None
    v = drain_values(_model(example_config, "reason-70b"), version)
    # 400 / 20 = 20 tok/s; 8,192 / 20 = 409.6 s + 1 -> 411 s; grace 12 + 411 + 10 = 433 s.
    assert (v.stream_bound_s, v.prestop_s, v.grace_s) == (411, 12, 433)


def test_grace_covers_prestop_and_shutdown_for_every_version(example_config: PlatformConfig) -> None:
    for model in example_config.models:
        for version in example_config.versions_of(model.name):
            v = drain_values(model, version)
            assert v.grace_s > v.prestop_s + v.shutdown_timeout_s
            assert v.shutdown_timeout_s >= v.stream_bound_s


def test_the_stream_bound_is_capped(example_config: PlatformConfig, chat_version: Version) -> None:
    slow = chat_version.model_copy(update={"capacity": chat_version.capacity.model_copy(
        update={"output_tokens_per_s": 500})})  # 6 tok/s per stream: 4,096 tokens would take 680 s
    assert drain_values(_model(example_config, "chat-7b"), slow).stream_bound_s == 600


def test_max_model_len_caps_the_longest_answer(example_config: PlatformConfig,
                                               chat_version: Version) -> None:
    model = _model(example_config, "chat-7b").model_copy(update={"max_output_tokens": 100_000})
    assert drain_values(model, chat_version).max_output_tokens == 8192


def test_prestop_follows_the_propagation_steps() -> None:
    assert prestop_s(DrainPolicy(endpoint_update_s=5, safety_factor=1.5)) == 14  # 9 x 1.5 = 13.5


def test_model_and_version_must_match(example_config: PlatformConfig, chat_version: Version) -> None:
    with pytest.raises(ValueError):
        drain_values(_model(example_config, "reason-70b"), chat_version)


def _deployment(values: DrainValues) -> dict[str, Any]:
    labels = pod_labels("chat-7b", "v13")
    container = {"name": "vllm", "image": "vllm/vllm-openai:latest",
                 "args": ["--model", "/weights", *values.engine_args()], **values.container_fields()}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": deployment_name("chat-7b", "v13"), "namespace": "modelfleet"},
        "spec": {"selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels},
            "spec": {"containers": [container], **values.pod_spec_fields()}}},
    }


def test_the_iac_fields_are_valid_kubernetes(example_config: PlatformConfig,
                                             chat_version: Version) -> None:
    values = drain_values(_model(example_config, "chat-7b"), chat_version)
    deployment = _deployment(values)
    kubernetes_validate.validate(deployment, "1.31.0", strict=True)
    pod = deployment["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 159
    assert pod["containers"][0]["lifecycle"]["preStop"] == {"sleep": {"seconds": 12}}
    assert pod["containers"][0]["args"][-2:] == ["--shutdown-timeout", "137"]

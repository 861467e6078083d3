"""ScaledObjects for every pool: valid KEDA, thresholds derived from the version record."""

from __future__ import annotations

import re
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
from cloudcoil.models.keda.v1alpha1 import ScaledObject

from autoscale.naming import deployment_name, pod_labels, pod_monitor, pool_name
from autoscale.policy import policy_from_data
from autoscale.scaledobject import scaled_object, scaled_objects
from modelfleet.config.autoscaling import AutoscalePolicy
from modelfleet.config.schema import PlatformConfig, Pool, Version
from modelfleet.contract.metrics import (
    GATEWAY_POOL_QUEUE_DEPTH,
    POOL_LABEL,
    TOKENS_IN_FLIGHT,
    VLLM_WAITING,
)

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
PEAK = {"name": "eu-morning", "timezone": "Europe/Dublin", "start": "50 7 * * 1-5",
        "end": "0 11 * * 1-5", "desired_replicas": 12, "model": "chat-7b", "region": "eu-west-1"}


def _triggers(so: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["name"]: t for t in so["spec"]["triggers"]}


def test_every_pool_gets_a_valid_scaled_object(example_config: PlatformConfig) -> None:
    objects = scaled_objects(example_config, policy_from_data({"peaks": [PEAK]}))
    assert len(objects) == len(example_config.pools) == 6
    for so in objects:
        model = ScaledObject.model_validate(so, extra="forbid")  # unknown fields are errors
        assert model.model_dump(by_alias=True, exclude_none=True, mode="json") == so


@pytest.mark.parametrize(("key", "tokens", "queue"), [
    ("chat-7b@v13", "78400", "8"),    # 0.7 x 112,000; floor(0.1 x 83)
    ("chat-7b@v14", "78400", "8"),
    ("reason-70b@v1", "28000", "2"),  # 0.7 x 40,000; floor(0.1 x 20)
])
def test_thresholds_and_bounds(example_config: PlatformConfig, policy: AutoscalePolicy,
                               key: str, tokens: str, queue: str) -> None:
    for pool, so in zip(example_config.pools, scaled_objects(example_config, policy), strict=True):
        if pool.key != key:
            continue
        spec, triggers = so["spec"], _triggers(so)
        assert triggers["tokens-in-flight"]["metadata"]["threshold"] == tokens
        assert triggers["queue-depth"]["metadata"]["threshold"] == queue
        assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (pool.min_replicas, pool.max_replicas)
        assert spec["fallback"] == {"failureThreshold": 3, "replicas": pool.max_replicas}
        assert spec["scaleTargetRef"]["name"] == deployment_name(pool.model, pool.version)


def test_chat_pool_in_detail(chat_pool: Pool, chat_version: Version, policy: AutoscalePolicy) -> None:
    so = scaled_object(chat_pool, chat_version, policy, namespace="modelfleet",
                       prometheus_url="http://prometheus:9090")
    assert so["metadata"]["name"] == "vllm-chat-7b-v13"
    assert so["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                            "name": "vllm-chat-7b-v13"}
    tokens = _triggers(so)["tokens-in-flight"]
    assert tokens["type"] == "prometheus" and tokens["metricType"] == "AverageValue"
    assert tokens["metadata"] == {
        "serverAddress": "http://prometheus:9090",
        "query": f'sum({TOKENS_IN_FLIGHT}{{namespace="modelfleet",pool="chat-7b@v13"}})',
        "threshold": "78400", "activationThreshold": "0", "ignoreNullValues": "false"}
    # one spelling of the pool label for the engines' series and the gateways' alike
    assert _triggers(so)["queue-depth"]["metadata"]["query"] == (
        f'sum({VLLM_WAITING}{{namespace="modelfleet",pool="chat-7b@v13"}})'
        f' + (sum({GATEWAY_POOL_QUEUE_DEPTH}{{namespace="modelfleet",pool="chat-7b@v13"}})'
        ' or vector(0))')
    behavior = so["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleDown"] == {"stabilizationWindowSeconds": 600, "selectPolicy": "Min",
                                     "policies": [{"type": "Pods", "value": 1, "periodSeconds": 600}]}
    assert behavior["scaleUp"]["stabilizationWindowSeconds"] == 0


def test_every_prometheus_trigger_refuses_null_and_every_trigger_is_average_value(
        example_config: PlatformConfig) -> None:
    for so in scaled_objects(example_config, policy_from_data({"peaks": [PEAK]})):
        for t in so["spec"]["triggers"]:
            assert t["metricType"] == "AverageValue"  # KEDA's fallback needs it on every trigger
            if t["type"] == "prometheus":
                assert t["metadata"]["ignoreNullValues"] == "false"


def test_cron_peaks(example_config: PlatformConfig) -> None:
    objects = scaled_objects(example_config, policy_from_data({"peaks": [PEAK]}), region="eu-west-1")
    crons = {so["metadata"]["name"]: _triggers(so).get("peak-eu-morning", {}) for so in objects}
    assert crons["vllm-chat-7b-v13"] == {
        "type": "cron", "name": "peak-eu-morning", "metricType": "AverageValue",
        "metadata": {"timezone": "Europe/Dublin", "start": "50 7 * * 1-5", "end": "0 11 * * 1-5",
                     "desiredReplicas": "12"}}
    assert crons["vllm-chat-7b-v14"]["metadata"]["desiredReplicas"] == "4"  # the canary's max
    assert crons["vllm-reason-70b-v1"] == {}


def test_the_hpa_keda_creates_is_valid_kubernetes(chat_pool: Pool, chat_version: Version,
                                                  policy: AutoscalePolicy) -> None:
    so = scaled_object(chat_pool, chat_version, policy)
    spec = so["spec"]
    hpa = {
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": f"keda-hpa-{so['metadata']['name']}", "namespace": "modelfleet"},
        "spec": {
            "scaleTargetRef": spec["scaleTargetRef"],
            "minReplicas": spec["minReplicaCount"], "maxReplicas": spec["maxReplicaCount"],
            "behavior": spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"],
            "metrics": [{"type": "External", "external": {
                "metric": {"name": f"s{i}-{t['type']}"},
                "target": {"type": "AverageValue", "averageValue": t["metadata"].get("threshold", "1")}}}
                for i, t in enumerate(spec["triggers"])],
        },
    }
    kubernetes_validate.validate(hpa, "1.31.0", strict=True)


def test_a_pool_without_its_version_is_an_error(chat_pool: Pool) -> None:
    with pytest.raises(ValueError, match="undeclared version"):
        scaled_objects(PlatformConfig(pools=(chat_pool,)), policy_from_data())


def test_names_are_dns_labels() -> None:
    assert pool_name("chat-7b", "v13") == "chat-7b-v13"
    dotted, dashed = pool_name("chat-7b", "v1.2"), pool_name("chat-7b", "v1-2")
    assert dotted != dashed and "." not in dotted
    long = deployment_name("m" * 63, "v1" + "x" * 30)
    for name in (dotted, long, deployment_name("chat-7b", "v13")):
        assert DNS_LABEL.match(name) and len(name) <= 63


def test_pod_monitor_joins_model_and_version_into_the_pool_label() -> None:
    endpoint = pod_monitor("modelfleet")["spec"]["podMetricsEndpoints"][0]
    assert {"sourceLabels": ["__meta_kubernetes_pod_label_modelfleet_io_model",
                             "__meta_kubernetes_pod_label_modelfleet_io_version"],
            "separator": "@", "targetLabel": POOL_LABEL} in endpoint["relabelings"]
    # the pod label holds the DNS-safe pool name, which never becomes the Prometheus label
    assert pod_labels("chat-7b", "v13")["modelfleet.io/pool"] == "chat-7b-v13"
    assert all(r["targetLabel"] != POOL_LABEL or r["sourceLabels"] != [
        "__meta_kubernetes_pod_label_modelfleet_io_pool"] for r in endpoint["relabelings"])

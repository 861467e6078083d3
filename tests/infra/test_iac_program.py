"""The whole program per stack: every object valid, one Deployment and ScaledObject per pool,
checks before any resource, and infra/__main__.py itself."""

from __future__ import annotations

import runpy
from pathlib import Path

import pulumi
import pytest

from components.capacity import CapacityError
from components.mocking import RecordingMocks, plain, run_program
from components.testing import REPO, render_stack
from components.validation import invalid_objects
from modelfleet.config import ConfigError


def _kinds(mocks: RecordingMocks, kind: str) -> list[str]:
    return sorted(o["metadata"]["name"] for o in mocks.kubernetes_objects() if o["kind"] == kind)


@pytest.mark.parametrize("stack", ["us-east-1", "eu-west-1"])
def test_every_kubernetes_object_is_valid(stack: str, us_east: RecordingMocks, eu_west: RecordingMocks) -> None:
    mocks = us_east if stack == "us-east-1" else eu_west
    objects = mocks.kubernetes_objects()
    assert len(objects) > 30
    assert invalid_objects(objects) == {}


def test_one_deployment_and_one_scaled_object_per_pool(us_east: RecordingMocks) -> None:
    pools = ["vllm-chat-7b-v13", "vllm-chat-7b-v14", "vllm-reason-70b-v1"]
    assert _kinds(us_east, "ScaledObject") == pools
    assert [d for d in _kinds(us_east, "Deployment") if d.startswith("vllm-")] == pools
    assert _kinds(us_east, "PodMonitor") == sorted([*pools, "gateway-ext"])  # + the gateway's queue


def test_region_wiring(us_east: RecordingMocks) -> None:
    types = {r.type for r in us_east.resources if not r.custom}
    assert {"modelfleet:aws:Cluster", "modelfleet:aws:GpuNodePool", "modelfleet:k8s:Addons",
            "modelfleet:k8s:ModelPool", "modelfleet:k8s:ControlPlane", "modelfleet:k8s:Gateway"} <= types
    (read,) = [plain(r.inputs) for r in us_east.of_type("aws:iam/rolePolicy:RolePolicy") if "weights-read" in r.name]
    assert "arn:aws:s3:::modelfleet-weights/*" in read["policy"]  # us-east-1 is the primary


def test_the_secondary_region_reads_its_replica_bucket(eu_west: RecordingMocks) -> None:
    dep = next(o for o in eu_west.kubernetes_objects() if o["metadata"]["name"] == "vllm-chat-7b-v13"
               and o["kind"] == "Deployment")
    script = dep["spec"]["template"]["spec"]["initContainers"][0]["command"][-1]
    assert "s3://modelfleet-weights-eu-west-1/chat-7b/v13/" in script


def test_global_stack(global_layer: RecordingMocks) -> None:
    assert len(global_layer.of_type("aws:route53/healthCheck:HealthCheck")) == 2
    assert len(global_layer.of_type("aws:s3/bucketReplicationConfig:BucketReplicationConfig")) == 1
    assert global_layer.kubernetes_objects() == []


def test_a_pool_naming_an_unknown_version_fails_before_any_resource(config_copy: Path) -> None:
    pools = config_copy / "pools.yaml"
    pools.write_text(pools.read_text().replace("{model: reason-70b, version: v1, region: eu-west-1",
                                               "{model: reason-70b, version: v9, region: eu-west-1"))
    mocks = RecordingMocks()
    with pytest.raises(ConfigError, match=r"pools.yaml:\d+: pools\[5\].version: error: pool names reason-70b@v9"):
        run_program(lambda: render_stack("eu-west-1", config_copy), mocks=mocks)
    assert mocks.resources == []


def test_a_pool_below_the_capacity_plan_fails_before_any_resource(config_copy: Path) -> None:
    pools = config_copy / "pools.yaml"
    pools.write_text(pools.read_text().replace(
        "{model: chat-7b, version: v13, region: us-east-1, min_replicas: 6, max_replicas: 16}",
        "{model: chat-7b, version: v13, region: us-east-1, min_replicas: 6, max_replicas: 11}"))
    with pytest.raises(CapacityError, match="max_replicas 11, below the capacity plan's 12"):
        render_stack("us-east-1", config_copy)


def test_infra_main_runs_the_same_program() -> None:
    pulumi.runtime.set_all_config(
        {"modelfleet:kind": "region", "modelfleet:region": "eu-west-1", "modelfleet:configDir": "../config",
         "modelfleet:domain": "modelfleet.example.com", "modelfleet:dbPassword": "pw",
         "modelfleet:certificateArn": "arn:aws:acm:eu-west-1:000000000000:certificate/x"},
        ["modelfleet:dbPassword"])
    try:
        mocks = run_program(lambda: runpy.run_path(str(REPO / "infra" / "__main__.py")), stack="eu-west-1")
    finally:
        pulumi.runtime.set_all_config({})
    assert len([o for o in mocks.kubernetes_objects() if o["kind"] == "ScaledObject"]) == 3

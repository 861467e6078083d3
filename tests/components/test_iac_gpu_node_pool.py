"""GpuNodePool: NVIDIA AMI, taint, labels, instance type, RAID0 user data, autoscaler bounds and
tags, warm placeholders with their PriorityClass, weights prefetch."""

from __future__ import annotations

import base64

import pytest

from components.aws.gpu_node_pool import GpuNodePool, GpuNodePoolArgs
from components.aws.gpu_types import GPU_INSTANCES
from components.capacity import GpuDemand
from components.testing import Build, inputs, objects
from components.validation import invalid_objects

# us-east-1 of the example config: pools 6..16 x 1 + 1..4 x 1 + 2..4 x 2 GPUs; warm 5 x 1 + 2 x 2
DEMAND = GpuDemand("a100-80gb", min_gpus=11, max_gpus=28, warm_gpus=9)


def _args(**changes: object) -> GpuNodePoolArgs:
    args = GpuNodePoolArgs(cluster_name="modelfleet-us-east-1", node_role_arn="arn:aws:iam::0:role/node",
                           subnet_ids=["subnet-a", "subnet-b"], demand=DEMAND, namespace="modelfleet",
                           pause_image="registry.k8s.io/pause:3.10", warm={1: 5, 2: 2})
    for k, v in changes.items():
        setattr(args, k, v)
    return args


def test_node_group_is_tainted_labelled_nvidia(build: Build) -> None:
    mocks = build(lambda: GpuNodePool("gpu-a100", _args()))
    (ng,) = inputs(mocks, "aws:eks/nodeGroup:NodeGroup")
    assert ng["amiType"] == "AL2023_x86_64_NVIDIA"
    assert ng["instanceTypes"] == ["p4de.24xlarge"]
    assert ng["taints"] == [{"key": "nvidia.com/gpu", "value": "present", "effect": "NO_SCHEDULE"}]
    assert ng["labels"] == {"nvidia.com/gpu.present": "true", "modelfleet.io/gpu-type": "a100-80gb"}
    # (11 + 9) / 8 -> 3 nodes at the warm minima; (28 + 9) / 8 -> 5 at the maxima
    assert ng["scalingConfig"] == {"minSize": 3, "maxSize": 5, "desiredSize": 3}


def test_instance_store_is_raid0_for_the_weights_cache(build: Build) -> None:
    mocks = build(lambda: GpuNodePool("gpu-a100", _args()))
    (lt,) = inputs(mocks, "aws:ec2/launchTemplate:LaunchTemplate")
    text = base64.b64decode(lt["userData"]).decode()
    assert "Content-Type: text/x-shellscript" in text and "multipart/mixed" in text
    assert "nvme-Amazon_EC2_NVMe_Instance_Storage_" in text
    assert "mdadm --create /dev/md/modelfleet --level=0" in text
    assert "mkdir -p /mnt/nvme/modelfleet/weights" in text
    assert lt["metadataOptions"]["httpPutResponseHopLimit"] == 2  # pods reach IMDS for the bucket


def test_cluster_autoscaler_can_scale_from_zero(build: Build) -> None:
    mocks = build(lambda: GpuNodePool("gpu-a100", _args()))
    tags = {t["tag"]["key"]: t["tag"]["value"] for t in inputs(mocks, "aws:autoscaling/tag:Tag")}
    prefix = "k8s.io/cluster-autoscaler/node-template"
    assert tags == {f"{prefix}/label/nvidia.com/gpu.present": "true",
                    f"{prefix}/label/modelfleet.io/gpu-type": "a100-80gb",
                    f"{prefix}/taint/nvidia.com/gpu": "present:NoSchedule",
                    f"{prefix}/resources/nvidia.com/gpu": "8"}


def test_warm_placeholders_hold_gpus_at_negative_priority(build: Build) -> None:
    mocks = build(lambda: GpuNodePool("gpu-a100", _args()))
    (pc,) = objects(mocks, "PriorityClass")
    assert -10 < pc["value"] < 0 and pc["preemptionPolicy"] == "Never"
    warm = {d["metadata"]["name"]: d for d in objects(mocks, "Deployment")}
    assert {n: d["spec"]["replicas"] for n, d in warm.items()} == \
        {"warm-a100-80gb-1gpu": 5, "warm-a100-80gb-2gpu": 2}
    pod = warm["warm-a100-80gb-2gpu"]["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == pc["metadata"]["name"]
    assert pod["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] == "2"
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert invalid_objects(mocks.kubernetes_objects()) == {}


def test_every_gpu_type_has_an_eight_gpu_shape() -> None:
    from modelfleet.config.hardware import GPU_TYPES

    assert set(GPU_INSTANCES) == set(GPU_TYPES)
    assert all(g.gpus == 8 and g.nvme_disks >= 1 for g in GPU_INSTANCES.values())


def test_inconsistent_warm_slots_are_refused_before_anything_is_declared(build: Build) -> None:
    with pytest.raises(ValueError, match="warm slots"):
        build(lambda: GpuNodePool("gpu-a100", _args(warm={1: 1})))
    with pytest.raises(ValueError, match="does not fit"):
        build(lambda: GpuNodePool("gpu-a100", _args(warm={16: 1})))

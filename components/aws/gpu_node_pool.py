"""``GpuNodePool``: one EKS managed node group per GPU type, and its warm capacity
(``modelfleet:aws:GpuNodePool``).

Nodes: the NVIDIA AL2023 AMI, tainted ``nvidia.com/gpu=present:NoSchedule`` so only GPU pods
land there, labelled ``nvidia.com/gpu.present: "true"`` and ``modelfleet.io/gpu-type``, the NVMe
instance store striped as RAID0 for the weights cache (:mod:`components.aws.node_userdata`).

Node autoscaling is the cluster autoscaler (installed by :mod:`components.k8s.addons`): it scales
this managed group between ``min_nodes`` and ``max_nodes``. The group's maximum is the pools'
``max_replicas x gpus_per_replica`` plus the warm headroom, so the node bound follows the
config; the ASG tags below describe a node (labels, taint, GPUs) so the autoscaler can scale the
group up from zero. ``desiredSize`` belongs to the autoscaler after creation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import pulumi
import pulumi_aws as aws

from components.aws.gpu_types import (
    GPU_PRESENT_LABEL,
    GPU_RESOURCE,
    GPU_TAINT_KEY,
    GPU_TYPE_LABEL,
    GpuInstance,
    gpu_instance,
)
from components.aws.node_userdata import user_data_base64
from components.capacity import GpuDemand
from components.k8s import warm_manifests as wm
from components.k8s.objects import declare
from components.k8s.pool_manifests import PoolSpec

TAINT_VALUE = "present"
CA_TEMPLATE = "k8s.io/cluster-autoscaler/node-template"


@dataclass
class GpuNodePoolArgs:
    """One GPU type's nodes. ``warm`` maps GPUs per placeholder to placeholder count (one per
    replica shape of the warm headroom); ``prefetch`` are the pools whose weights every node
    caches."""

    cluster_name: pulumi.Input[str]
    node_role_arn: pulumi.Input[str]
    subnet_ids: pulumi.Input[Sequence[pulumi.Input[str]]]
    demand: GpuDemand
    namespace: str
    pause_image: str
    warm: dict[int, int] = field(default_factory=dict)
    prefetch: list[PoolSpec] = field(default_factory=list)
    root_volume_gb: int = 200

    def node_bounds(self, shape: GpuInstance) -> tuple[int, int]:
        """(min, max) nodes: the pools' warm minima and maxima plus the warm headroom, in whole
        nodes; one more at the top when a replica shape does not divide a node's GPUs."""
        d = self.demand
        lo = math.ceil((d.min_gpus + d.warm_gpus) / shape.gpus)
        hi = math.ceil((d.max_gpus + d.warm_gpus) / shape.gpus)
        shapes = set(self.warm) | {s.version.gpus_per_replica for s in self.prefetch}
        return lo, hi + (1 if any(shape.gpus % g for g in shapes) else 0)

    def validate(self) -> GpuInstance:
        """The node shape; ``ValueError`` on inconsistent args."""
        shape = gpu_instance(self.demand.gpu_type)
        if self.demand.max_gpus < 1:
            raise ValueError(f"{self.demand.gpu_type}: no pool asks for GPUs")
        for gpus, count in self.warm.items():
            if not 1 <= gpus <= shape.gpus or count < 0:
                raise ValueError(f"warm slot of {gpus} GPUs x {count} does not fit {shape.instance_type}")
        if sum(g * n for g, n in self.warm.items()) != self.demand.warm_gpus:
            raise ValueError("warm slots do not add up to the demand's warm GPUs")
        return shape


class GpuNodePool(pulumi.ComponentResource):
    """A managed GPU node group, its autoscaler tags, placeholders and weights prefetch."""

    node_group_name: pulumi.Output[str]
    instance_type: pulumi.Output[str]
    min_nodes: pulumi.Output[int]
    max_nodes: pulumi.Output[int]
    warm_gpus: pulumi.Output[int]

    def __init__(self, name: str, args: GpuNodePoolArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        shape = args.validate()
        lo, hi = args.node_bounds(shape)
        gpu_type = args.demand.gpu_type
        super().__init__("modelfleet:aws:GpuNodePool", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        template = aws.ec2.LaunchTemplate(
            f"{name}-lt", name_prefix=f"modelfleet-{gpu_type}-", user_data=user_data_base64(),
            block_device_mappings=[{"device_name": "/dev/xvda", "ebs": {
                "volume_size": args.root_volume_gb, "volume_type": "gp3", "encrypted": "true",
                "delete_on_termination": "true"}}],
            metadata_options={"http_tokens": "required", "http_put_response_hop_limit": 2},
            tag_specifications=[{"resource_type": "instance",
                                 "tags": {"Name": f"modelfleet-{gpu_type}"}}],
            opts=child)
        labels = {GPU_PRESENT_LABEL: "true", GPU_TYPE_LABEL: gpu_type}
        group = aws.eks.NodeGroup(
            f"{name}-ng", cluster_name=args.cluster_name, node_group_name=f"gpu-{gpu_type}",
            node_role_arn=args.node_role_arn, subnet_ids=args.subnet_ids,
            ami_type="AL2023_x86_64_NVIDIA", instance_types=[shape.instance_type],
            capacity_type="ON_DEMAND",
            scaling_config={"min_size": lo, "max_size": hi, "desired_size": lo},
            labels=labels,
            taints=[{"key": GPU_TAINT_KEY, "value": TAINT_VALUE, "effect": "NO_SCHEDULE"}],
            launch_template={"id": template.id, "version": template.latest_version.apply(str)},
            update_config={"max_unavailable": 1},
            opts=pulumi.ResourceOptions(parent=self, ignore_changes=["scalingConfig.desiredSize"]))
        asg = group.resources.apply(_asg_name)
        template_tags = {**{f"{CA_TEMPLATE}/label/{k}": v for k, v in labels.items()},
                         f"{CA_TEMPLATE}/taint/{GPU_TAINT_KEY}": f"{TAINT_VALUE}:NoSchedule",
                         f"{CA_TEMPLATE}/resources/{GPU_RESOURCE}": str(shape.gpus)}
        for i, (key, value) in enumerate(sorted(template_tags.items())):
            aws.autoscaling.Tag(f"{name}-ca-tag-{i}", autoscaling_group_name=asg,
                                tag={"key": key, "value": value, "propagate_at_launch": False},
                                opts=child)
        k8s_opts = pulumi.ResourceOptions(parent=self, depends_on=[group])
        pc = declare(wm.priority_class(gpu_type), k8s_opts)
        for gpus, count in sorted(args.warm.items()):
            declare(wm.placeholders(gpu_type, gpus, count, args.namespace, args.pause_image),
                    pulumi.ResourceOptions(parent=self, depends_on=[group, pc]))
        if args.prefetch:
            declare(wm.prefetch(gpu_type, args.prefetch, args.namespace, args.pause_image), k8s_opts)

        self.node_group_name = group.node_group_name
        self.instance_type = pulumi.Output.from_input(shape.instance_type)
        self.min_nodes = pulumi.Output.from_input(lo)
        self.max_nodes = pulumi.Output.from_input(hi)
        self.warm_gpus = pulumi.Output.from_input(args.demand.warm_gpus)
        self.register_outputs({"node_group_name": self.node_group_name,
                               "instance_type": self.instance_type, "min_nodes": self.min_nodes,
                               "max_nodes": self.max_nodes, "warm_gpus": self.warm_gpus})


def _asg_name(resources: Sequence[aws.eks.outputs.NodeGroupResource]) -> str:
    """The Auto Scaling group EKS created for a managed node group (empty until it exists)."""
    groups = resources[0].autoscaling_groups if resources else None
    return (groups[0].name or "") if groups else ""

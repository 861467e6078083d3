"""``Cluster``: the region's VPC, EKS control plane, system node group and the Kubernetes
provider built from the cluster's kubeconfig (``modelfleet:aws:Cluster``).

GPU node groups are separate components (:mod:`components.aws.gpu_node_pool`); the system node group
here runs everything without a GPU: Envoy, gateway_ext, the control plane, Prometheus, KEDA and
the cluster autoscaler. Every Kubernetes resource of the stack goes through :attr:`provider`,
which waits for the system nodes, so nothing is applied to a cluster that cannot run it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from components.aws.iam import MANAGED, trust
from components.aws.network import build_network, subnet_plan
from components.k8s.objects import kubeconfig

NODE_POLICIES = ("AmazonEKSWorkerNodePolicy", "AmazonEKS_CNI_Policy",
                 "AmazonEC2ContainerRegistryReadOnly", "AmazonSSMManagedInstanceCore")


@dataclass
class ClusterArgs:
    """One region's cluster. ``zones`` default to the region's a, b and c; ``system_nodes`` is
    (min, max) of the CPU node group."""

    name: str
    region: str
    version: str = "1.32"
    vpc_cidr: str = "10.0.0.0/16"
    zones: list[str] = field(default_factory=list)
    system_instance_type: str = "m6i.2xlarge"
    system_nodes: tuple[int, int] = (3, 12)

    def zone_list(self) -> list[str]:
        """The availability zones, validated."""
        zones = self.zones or [f"{self.region}{z}" for z in "abc"]
        if any(not z.startswith(self.region) for z in zones):
            raise ValueError(f"zones {zones} are not all in region {self.region}")
        subnet_plan(self.vpc_cidr, len(zones))  # raises on a bad CIDR or zone count
        lo, hi = self.system_nodes
        if not 2 <= lo <= hi:
            raise ValueError(f"system_nodes {self.system_nodes}: need 2 <= min <= max")
        return zones


class Cluster(pulumi.ComponentResource):
    """VPC + EKS + system nodes; :attr:`provider` deploys into the cluster."""

    cluster_name: pulumi.Output[str]
    endpoint: pulumi.Output[str]
    kubeconfig: pulumi.Output[str]
    vpc_id: pulumi.Output[str]
    private_subnet_ids: pulumi.Output[list[str]]
    node_role_arn: pulumi.Output[str]
    node_role_name: pulumi.Output[str]
    node_security_group_id: pulumi.Output[str]
    """The EKS cluster security group, which managed node groups' nodes carry: Redis and
    Postgres admit it."""
    provider: k8s.Provider

    def __init__(self, name: str, args: ClusterArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        zones = args.zone_list()
        super().__init__("modelfleet:aws:Cluster", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        net = build_network(args.name, args.vpc_cidr, zones, self)

        cluster_role = aws.iam.Role(f"{args.name}-cluster", assume_role_policy=trust("eks.amazonaws.com"), opts=child)
        attach = aws.iam.RolePolicyAttachment(f"{args.name}-cluster-policy", role=cluster_role.name,
                                              policy_arn=MANAGED + "AmazonEKSClusterPolicy", opts=child)
        node_role = aws.iam.Role(f"{args.name}-node", assume_role_policy=trust("ec2.amazonaws.com"), opts=child)
        node_attach = [aws.iam.RolePolicyAttachment(f"{args.name}-node-{p}", role=node_role.name,
                                                    policy_arn=MANAGED + p, opts=child)
                       for p in NODE_POLICIES]
        eks = aws.eks.Cluster(
            args.name, name=args.name, role_arn=cluster_role.arn, version=args.version,
            vpc_config={"subnet_ids": [*net.private_subnet_ids, *net.public_subnet_ids],
                        "endpoint_private_access": True, "endpoint_public_access": True},
            access_config={"authentication_mode": "API",
                           "bootstrap_cluster_creator_admin_permissions": True},
            enabled_cluster_log_types=["api", "audit", "authenticator"],
            opts=pulumi.ResourceOptions(parent=self, depends_on=[attach]))
        aws.eks.Addon(f"{args.name}-pod-identity", cluster_name=eks.name,
                      addon_name="eks-pod-identity-agent", opts=child)
        lo, hi = args.system_nodes
        system = aws.eks.NodeGroup(
            f"{args.name}-system", cluster_name=eks.name, node_group_name="system",
            node_role_arn=node_role.arn, subnet_ids=net.private_subnet_ids,
            ami_type="AL2023_x86_64_STANDARD", instance_types=[args.system_instance_type],
            scaling_config={"min_size": lo, "max_size": hi, "desired_size": lo},
            labels={"modelfleet.io/node-role": "system"}, update_config={"max_unavailable": 1},
            opts=pulumi.ResourceOptions(parent=self, depends_on=node_attach,
                                        ignore_changes=["scalingConfig.desiredSize"]))

        self.cluster_name = eks.name
        self.endpoint = eks.endpoint
        self.kubeconfig = kubeconfig(eks.name, eks.endpoint,
                                     eks.certificate_authority.apply(lambda ca: ca.data or ""), args.region)
        self.vpc_id = net.vpc.id
        self.private_subnet_ids = pulumi.Output.all(*net.private_subnet_ids)
        self.node_role_arn = node_role.arn
        self.node_role_name = node_role.name
        self.node_security_group_id = eks.vpc_config.apply(lambda v: v.cluster_security_group_id or "")
        self.provider = k8s.Provider(f"{args.name}-k8s", kubeconfig=self.kubeconfig,
                                     opts=pulumi.ResourceOptions(parent=self, depends_on=[system]))
        self.register_outputs({"cluster_name": self.cluster_name, "endpoint": self.endpoint,
                               "kubeconfig": self.kubeconfig, "vpc_id": self.vpc_id,
                               "private_subnet_ids": self.private_subnet_ids,
                               "node_role_arn": self.node_role_arn,
                               "node_security_group_id": self.node_security_group_id})

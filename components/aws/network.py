"""The region's VPC: private subnets for nodes, pods, Redis and Postgres; public subnets for the
NLB and one NAT gateway per availability zone (no zone depends on another's NAT)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws


@dataclass(frozen=True)
class SubnetPlan:
    """CIDRs per availability zone: a /19 private subnet (VPC CNI gives pods VPC addresses) and
    a /22 public one."""

    private: list[str]
    public: list[str]


def subnet_plan(vpc_cidr: str, zones: int) -> SubnetPlan:
    """Carve ``vpc_cidr`` (at least a /16) into ``zones`` private /19s and public /22s."""
    net = ipaddress.IPv4Network(vpc_cidr)
    if net.prefixlen > 16:
        raise ValueError(f"VPC CIDR {vpc_cidr} is smaller than a /16")
    if not 2 <= zones <= 6:
        raise ValueError(f"{zones} availability zones: use 2 to 6")
    nineteens = list(net.subnets(new_prefix=19))
    public = list(nineteens[zones].subnets(new_prefix=22))
    return SubnetPlan([str(s) for s in nineteens[:zones]], [str(s) for s in public[:zones]])


@dataclass
class Network:
    """What the VPC exposes to the rest of the cluster."""

    vpc: aws.ec2.Vpc
    private_subnet_ids: list[pulumi.Output[str]]
    public_subnet_ids: list[pulumi.Output[str]]


def build_network(cluster_name: str, vpc_cidr: str, zones: list[str],
                  parent: pulumi.Resource) -> Network:
    """Declare the VPC, subnets, internet and NAT gateways and routes as children of ``parent``."""
    opts = pulumi.ResourceOptions(parent=parent)
    plan = subnet_plan(vpc_cidr, len(zones))
    shared = {f"kubernetes.io/cluster/{cluster_name}": "shared"}
    vpc = aws.ec2.Vpc(f"{cluster_name}-vpc", cidr_block=vpc_cidr, enable_dns_hostnames=True,
                      enable_dns_support=True, tags={"Name": cluster_name}, opts=opts)
    igw = aws.ec2.InternetGateway(f"{cluster_name}-igw", vpc_id=vpc.id, opts=opts)
    public_rt = aws.ec2.RouteTable(f"{cluster_name}-public", vpc_id=vpc.id,
                                   routes=[{"cidr_block": "0.0.0.0/0", "gateway_id": igw.id}], opts=opts)
    private_ids, public_ids = [], []
    for zone, private_cidr, public_cidr in zip(zones, plan.private, plan.public, strict=True):
        public = aws.ec2.Subnet(f"{cluster_name}-public-{zone}", vpc_id=vpc.id, cidr_block=public_cidr,
                                availability_zone=zone, map_public_ip_on_launch=False,
                                tags={**shared, "kubernetes.io/role/elb": "1",
                                      "Name": f"{cluster_name}-public-{zone}"}, opts=opts)
        aws.ec2.RouteTableAssociation(f"{cluster_name}-public-{zone}", subnet_id=public.id,
                                      route_table_id=public_rt.id, opts=opts)
        eip = aws.ec2.Eip(f"{cluster_name}-nat-{zone}", domain="vpc", opts=opts)
        nat = aws.ec2.NatGateway(f"{cluster_name}-nat-{zone}", allocation_id=eip.id,
                                 subnet_id=public.id, opts=opts)
        private = aws.ec2.Subnet(f"{cluster_name}-private-{zone}", vpc_id=vpc.id,
                                 cidr_block=private_cidr, availability_zone=zone,
                                 tags={**shared, "kubernetes.io/role/internal-elb": "1",
                                       "Name": f"{cluster_name}-private-{zone}"}, opts=opts)
        rt = aws.ec2.RouteTable(f"{cluster_name}-private-{zone}", vpc_id=vpc.id,
                                routes=[{"cidr_block": "0.0.0.0/0", "nat_gateway_id": nat.id}], opts=opts)
        aws.ec2.RouteTableAssociation(f"{cluster_name}-private-{zone}", subnet_id=private.id,
                                      route_table_id=rt.id, opts=opts)
        private_ids.append(private.id)
        public_ids.append(public.id)
    return Network(vpc, private_ids, public_ids)

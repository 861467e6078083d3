"""Cluster (VPC, EKS, system nodes, Kubernetes provider) and Addons (Helm releases)."""

from __future__ import annotations

import json

import pytest

from components.aws.cluster import Cluster, ClusterArgs
from components.aws.network import subnet_plan
from components.k8s.addons import Addons, AddonsArgs
from components.testing import Build, inputs, objects


def test_vpc_eks_and_the_provider_from_its_kubeconfig(build: Build) -> None:
    mocks = build(lambda: Cluster("us-east-1", ClusterArgs("modelfleet-us-east-1", "us-east-1",
                                                           vpc_cidr="10.10.0.0/16")))
    (eks,) = inputs(mocks, "aws:eks/cluster:Cluster")
    assert eks["version"] == "1.32" and eks["accessConfig"]["authenticationMode"] == "API"
    assert len(eks["vpcConfig"]["subnetIds"]) == 6
    subnets = inputs(mocks, "aws:ec2/subnet:Subnet")
    private = [s for s in subnets if "kubernetes.io/role/internal-elb" in s["tags"]]
    assert sorted(s["availabilityZone"] for s in private) == ["us-east-1a", "us-east-1b", "us-east-1c"]
    assert len(inputs(mocks, "aws:ec2/natGateway:NatGateway")) == 3  # one per zone
    (system,) = inputs(mocks, "aws:eks/nodeGroup:NodeGroup")
    assert system["amiType"] == "AL2023_x86_64_STANDARD" and "taints" not in system
    (provider,) = inputs(mocks, "pulumi:providers:kubernetes")
    assert provider["kubeconfig"] == "<secret>"  # a secret: never rendered in clear
    raw = mocks.of_type("pulumi:providers:kubernetes")[0].inputs["kubeconfig"]["value"]
    assert json.loads(raw)["users"][0]["user"]["exec"]["args"][:4] == \
        ["eks", "get-token", "--cluster-name", "modelfleet-us-east-1"]


def test_subnet_plan() -> None:
    plan = subnet_plan("10.10.0.0/16", 3)
    assert plan.private == ["10.10.0.0/19", "10.10.32.0/19", "10.10.64.0/19"]
    assert plan.public == ["10.10.96.0/22", "10.10.100.0/22", "10.10.104.0/22"]
    with pytest.raises(ValueError, match="smaller than a /16"):
        subnet_plan("10.10.0.0/20", 3)


def test_bad_zones_are_refused(build: Build) -> None:
    with pytest.raises(ValueError, match="not all in region"):
        build(lambda: Cluster("x", ClusterArgs("c", "us-east-1", zones=["eu-west-1a", "eu-west-1b"])))


def test_addons_releases_and_prometheus_selectors(build: Build) -> None:
    mocks = build(lambda: Addons("addons", AddonsArgs("modelfleet-us-east-1", "us-east-1", "1.32")))
    releases = {r["name"]: r for r in inputs(mocks, "kubernetes:helm.sh/v3:Release")}
    assert set(releases) == {"keda", "nvidia-device-plugin", "kube-prometheus-stack", "cluster-autoscaler"}
    assert all(r["version"] and r["repositoryOpts"]["repo"].startswith("https://") for r in releases.values())
    spec = releases["kube-prometheus-stack"]["values"]["prometheus"]["prometheusSpec"]
    for kind in ("podMonitor", "serviceMonitor", "rule"):
        assert spec[f"{kind}SelectorNilUsesHelmValues"] is False
        assert spec[f"{kind}Selector"] == {} and spec[f"{kind}NamespaceSelector"] == {}
    ca = releases["cluster-autoscaler"]["values"]
    assert ca["autoDiscovery"]["clusterName"] == "modelfleet-us-east-1"
    assert ca["extraArgs"]["expendable-pods-priority-cutoff"] == -10
    assert ca["image"]["tag"].startswith("v1.32.")
    plugin = releases["nvidia-device-plugin"]["values"]
    assert plugin["tolerations"][0]["key"] == "nvidia.com/gpu"
    (assoc,) = inputs(mocks, "aws:eks/podIdentityAssociation:PodIdentityAssociation")
    assert (assoc["namespace"], assoc["serviceAccount"]) == ("kube-system", "cluster-autoscaler")
    assert [n["metadata"]["name"] for n in objects(mocks, "Namespace")] == ["modelfleet"]

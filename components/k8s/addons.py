"""``Addons``: the cluster's shared machinery as Helm releases (``modelfleet:k8s:Addons``).

- KEDA: runs the pools' ScaledObjects;
- NVIDIA device plugin: advertises ``nvidia.com/gpu`` on GPU nodes (the AL2023 NVIDIA AMI ships
  the driver, not the plugin);
- kube-prometheus-stack: Prometheus with selectors that pick up every PodMonitor,
  ServiceMonitor and PrometheusRule in every namespace (the chart's default only sees its own
  release's), so the pools' PodMonitors feed the ScaledObjects' queries;
- cluster-autoscaler: scales the GPU managed node groups (auto-discovered by their ASG tags)
  through an EKS Pod Identity role.

Also the platform namespace. Chart versions are pinned here; a bump is a reviewed diff.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from components.aws.gpu_types import GPU_PRESENT_LABEL, gpu_tolerations
from components.aws.iam import allow, policy, trust
from components.k8s.objects import declare


@dataclass(frozen=True)
class Chart:
    """A pinned Helm chart: name, version, repository URL, namespace it is installed in."""

    chart: str
    version: str
    repo: str
    namespace: str


CHARTS: dict[str, Chart] = {
    "keda": Chart("keda", "2.16.1", "https://kedacore.github.io/charts", "keda"),
    "nvidia-device-plugin": Chart("nvidia-device-plugin", "0.17.1",
                                  "https://nvidia.github.io/k8s-device-plugin", "kube-system"),
    "kube-prometheus-stack": Chart("kube-prometheus-stack", "72.6.2",
                                   "https://prometheus-community.github.io/helm-charts", "monitoring"),
    "cluster-autoscaler": Chart("cluster-autoscaler", "9.46.6",
                                "https://kubernetes.github.io/autoscaler", "kube-system"),
}
AUTOSCALER_IMAGE_TAG = {"1.31": "v1.31.2", "1.32": "v1.32.1", "1.33": "v1.33.0"}
"""The cluster autoscaler's minor must match Kubernetes'."""


def prometheus_values() -> dict[str, Any]:
    """Select every PodMonitor, ServiceMonitor and rule in every namespace."""
    everything: dict[str, Any] = {}
    spec: dict[str, Any] = {"retention": "15d", "scrapeInterval": "15s"}
    for kind in ("podMonitor", "serviceMonitor", "rule"):
        spec[f"{kind}SelectorNilUsesHelmValues"] = False
        spec[f"{kind}Selector"] = everything
        spec[f"{kind}NamespaceSelector"] = everything
    return {"prometheus": {"prometheusSpec": spec}, "grafana": {"enabled": False}}


def autoscaler_values(cluster_name: str, region: str, k8s_version: str) -> dict[str, Any]:
    """cluster-autoscaler: auto-discovery, slow scale-down (10 min, like the pools), GPU nodes
    with emptyDir/hostPath pods are removable, placeholders (priority -5) are not expendable."""
    tag = AUTOSCALER_IMAGE_TAG.get(k8s_version)
    if tag is None:
        raise ValueError(f"no cluster-autoscaler pinned for Kubernetes {k8s_version}")
    return {
        "autoDiscovery": {"clusterName": cluster_name}, "awsRegion": region,
        "image": {"tag": tag},
        "rbac": {"serviceAccount": {"create": True, "name": "cluster-autoscaler"}},
        "extraArgs": {"expander": "least-waste", "balance-similar-node-groups": True,
                      "skip-nodes-with-local-storage": False, "scale-down-unneeded-time": "10m",
                      "scale-down-delay-after-add": "10m", "expendable-pods-priority-cutoff": -10,
                      "max-node-provision-time": "15m"},
    }


AUTOSCALER_ACTIONS = ["autoscaling:DescribeAutoScalingGroups", "autoscaling:DescribeAutoScalingInstances",
                      "autoscaling:DescribeLaunchConfigurations", "autoscaling:DescribeScalingActivities",
                      "autoscaling:DescribeTags", "ec2:DescribeImages", "ec2:DescribeInstanceTypes",
                      "ec2:DescribeLaunchTemplateVersions", "ec2:GetInstanceTypesFromInstanceRequirements",
                      "eks:DescribeNodegroup"]


@dataclass
class AddonsArgs:
    """The cluster's add-ons. ``namespace`` is the platform's (pools, gateway, control plane)."""

    cluster_name: pulumi.Input[str]
    region: str
    k8s_version: str
    namespace: str = "modelfleet"
    charts: dict[str, Chart] = field(default_factory=lambda: dict(CHARTS))


class Addons(pulumi.ComponentResource):
    """Helm releases and the platform namespace; :attr:`ready` is what CRs must depend on."""

    prometheus_url: pulumi.Output[str]
    namespace: pulumi.Output[str]
    chart_versions: pulumi.Output[dict[str, str]]
    ready: list[pulumi.Resource]

    def __init__(self, name: str, args: AddonsArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        missing = set(CHARTS) - set(args.charts)
        if missing:
            raise ValueError(f"charts missing: {sorted(missing)}")
        super().__init__("modelfleet:k8s:Addons", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        ns = declare({"apiVersion": "v1", "kind": "Namespace",
                      "metadata": {"name": args.namespace,
                                   "labels": {"app.kubernetes.io/part-of": "modelfleet"}}}, child)
        role = aws.iam.Role(f"{name}-cluster-autoscaler",
                            assume_role_policy=trust("pods.eks.amazonaws.com", tag_session=True), opts=child)
        aws.iam.RolePolicy(f"{name}-cluster-autoscaler", role=role.id, policy=policy(
            allow(AUTOSCALER_ACTIONS),
            allow(["autoscaling:SetDesiredCapacity", "autoscaling:TerminateInstanceInAutoScalingGroup"],
                  Condition={"StringEquals": {"aws:ResourceTag/k8s.io/cluster-autoscaler/enabled": "true"}})),
            opts=child)
        identity = aws.eks.PodIdentityAssociation(
            f"{name}-cluster-autoscaler", cluster_name=args.cluster_name, namespace="kube-system",
            service_account="cluster-autoscaler", role_arn=role.arn, opts=child)
        values: dict[str, pulumi.Input[Any]] = {
            "keda": {},
            "nvidia-device-plugin": {"tolerations": gpu_tolerations(),
                                     "nodeSelector": {GPU_PRESENT_LABEL: "true"}},
            "kube-prometheus-stack": prometheus_values(),
            "cluster-autoscaler": pulumi.Output.from_input(args.cluster_name).apply(
                lambda n: autoscaler_values(n, args.region, args.k8s_version)),
        }
        self.ready = []
        for key, chart in sorted(args.charts.items()):
            deps: list[pulumi.Resource] = [ns, identity] if key == "cluster-autoscaler" else [ns]
            self.ready.append(k8s.helm.v3.Release(
                f"{name}-{key}", name=key, chart=chart.chart, version=chart.version,
                repository_opts={"repo": chart.repo}, namespace=chart.namespace,
                create_namespace=True, atomic=True, timeout=900, values=values[key],
                opts=pulumi.ResourceOptions(parent=self, depends_on=deps)))
        self.ready.append(ns)
        self.prometheus_url = pulumi.Output.from_input(
            f"http://prometheus-operated.{CHARTS['kube-prometheus-stack'].namespace}.svc:9090")
        self.namespace = pulumi.Output.from_input(args.namespace)
        self.chart_versions = pulumi.Output.from_input({k: c.version for k, c in args.charts.items()})
        self.register_outputs({"prometheus_url": self.prometheus_url, "namespace": self.namespace,
                               "chart_versions": self.chart_versions})

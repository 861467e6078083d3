"""``ModelPool``: one model version's replicas in one region (``modelfleet:k8s:ModelPool``).

Declares the engine Deployment, its headless Service, a PodDisruptionBudget, the PodMonitor and
the KEDA ScaledObject (``autoscale.scaledobject``); the objects themselves are built by
:mod:`components.k8s.pool_manifests`. The ScaledObject owns the replica count after creation, so
Pulumi ignores ``spec.replicas`` drift on the Deployment.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pulumi

from autoscale.drain import drain_values
from autoscale.policy import policy_from_data
from autoscale.scaledobject import DEFAULT_PROMETHEUS_URL, scaled_object
from components.aws.buckets import weights_prefix
from components.aws.gpu_types import gpu_instance
from components.k8s import pool_manifests as pm
from components.k8s.objects import declare
from components.outputs import known_after
from components.settings import Images
from modelfleet.config.autoscaling import AutoscalePolicy
from modelfleet.config.schema import Model, Pool, Version


@dataclass
class ModelPoolArgs:
    """One pool: ``pool`` served by ``version`` of ``model``; ``bucket`` is the region's weights
    bucket, ``control_plane_url`` the control plane's HTTP API (heartbeats)."""

    pool: Pool
    version: Version
    model: Model
    namespace: str
    images: Images
    bucket: str
    control_plane_url: str
    policy: AutoscalePolicy = field(default_factory=policy_from_data)
    prometheus_url: str = DEFAULT_PROMETHEUS_URL

    def spec(self) -> pm.PoolSpec:
        """The validated :class:`~components.k8s.pool_manifests.PoolSpec`; ``ValueError`` on bad args."""
        if (self.pool.model, self.pool.version) != (self.version.model, self.version.version):
            raise ValueError(f"pool {self.pool.key} is not served by version {self.version.key}")
        if self.model.name != self.version.model:
            raise ValueError(f"version {self.version.key} is not a version of model {self.model.name}")
        if self.version.gpus_per_replica > gpu_instance(self.version.gpu_type).gpus:
            raise ValueError(f"{self.version.key}: {self.version.gpus_per_replica} GPUs per replica do not "
                             f"fit one {self.version.gpu_type} node")
        weights_prefix(self.version)  # the weights must be in S3
        image = self.images.vllm if self.version.engine == "vllm" else self.images.sglang
        return pm.PoolSpec(pool=self.pool, version=self.version,
                           drain=drain_values(self.model, self.version), namespace=self.namespace,
                           image=image, aws_cli_image=self.images.aws_cli, bucket=self.bucket,
                           control_plane_url=self.control_plane_url)


class ModelPool(pulumi.ComponentResource):
    """The replicas of one version in one region, and what scales, scrapes and protects them."""

    deployment_name: pulumi.Output[str]
    """``vllm-<model>-<version>``, also the Service, PDB, PodMonitor and ScaledObject name."""
    service_name: pulumi.Output[str]
    scaled_object_name: pulumi.Output[str]
    max_replicas: pulumi.Output[int]

    def __init__(self, name: str, args: ModelPoolArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        spec = args.spec()  # raises before anything is registered
        super().__init__("modelfleet:k8s:ModelPool", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        deployment = declare(pm.deployment(spec),
                             pulumi.ResourceOptions(parent=self, ignore_changes=["spec.replicas"]))
        svc = declare(pm.service(spec), child)
        declare(pm.disruption_budget(spec), child)
        declare(pm.monitor(spec), child)
        so = declare(scaled_object(args.pool, args.version, args.policy, namespace=args.namespace,
                                   prometheus_url=args.prometheus_url),
                     pulumi.ResourceOptions(parent=self, depends_on=[deployment]))
        self.deployment_name = known_after(deployment, spec.name)
        self.service_name = known_after(svc, spec.name)
        self.scaled_object_name = known_after(so, spec.name)
        self.max_replicas = pulumi.Output.from_input(args.pool.max_replicas)
        self.register_outputs({"deployment_name": self.deployment_name,
                               "service_name": self.service_name,
                               "scaled_object_name": self.scaled_object_name,
                               "max_replicas": self.max_replicas})

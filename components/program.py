"""The Pulumi program as functions: ``infra/__main__.py`` and ``modelfleet render`` call these.

Everything that can be wrong with the inputs is checked in :func:`prepare` before the first
resource is declared: the platform config (``modelfleet.config.load_config``), the region, the
capacity plan against the pools' maxima, the weights bucket, every pool's arguments.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pulumi
import pulumi_aws as aws
import yaml

from components.aws.buckets import primary_bucket, region_bucket
from components.aws.cluster import Cluster, ClusterArgs
from components.aws.global_routing import GlobalRouting, GlobalRoutingArgs
from components.aws.gpu_node_pool import GpuNodePool, GpuNodePoolArgs
from components.aws.iam import allow, policy
from components.aws.weights_bucket import ReplicaTarget, WeightsBucket, WeightsBucketArgs
from components.capacity import ModelNeed, check_pool_maxima, gpu_demand, region_pools
from components.k8s.addons import Addons, AddonsArgs
from components.k8s.control_plane import ControlPlane, ControlPlaneArgs
from components.k8s.gateway import Gateway, GatewayArgs
from components.k8s.model_pool import ModelPool, ModelPoolArgs
from components.k8s.service_manifests import CONTROL_HTTP_PORT, CONTROL_PLANE
from components.settings import StackSettings
from modelfleet.config import PlatformConfig, load_config

PLACEHOLDER_PASSWORD = "render-placeholder"
"""The Postgres password of renders and tests (rendered as ``<secret>`` anyway)."""


def config_files(config_dir: Path) -> dict[str, str]:
    """The deployed config files (name -> text). Files that hold only the ``local`` section
    (dev keys of ``modelfleet up``) stay behind; any other file holding it is an error."""
    out = {}
    for path in sorted([*config_dir.glob("*.yaml"), *config_dir.glob("*.yml")]):
        text = path.read_text(encoding="utf-8")
        sections = set(yaml.safe_load(text) or {})
        if sections <= {"local"}:
            continue
        if "local" in sections:
            raise ValueError(f"{path}: the local section (dev keys) must be in a file of its own")
        out[path.name] = text
    return out


@dataclass(frozen=True)
class Prepared:
    """A checked config and what the region program derives from it."""

    config: PlatformConfig
    files: dict[str, str]
    primary_region: str
    primary_bucket: str
    needs: dict[str, ModelNeed]


def prepare(settings: StackSettings) -> Prepared:
    """Load and check everything; raises ``ConfigError`` (every problem, with file and line),
    ``CapacityError`` or ``ValueError`` before any resource exists."""
    config = load_config(settings.config_dir).config
    if len(config.regions) < 2:
        raise ValueError(f"config declares regions {list(config.regions)}: need two to survive one's loss")
    primary_region = settings.primary_region or config.regions[0]
    if primary_region not in config.regions:
        raise ValueError(f"primary region {primary_region} is not in regions {list(config.regions)}")
    needs: dict[str, ModelNeed] = {}
    if settings.kind == "region":
        region = settings.region or ""
        if region not in config.regions:
            raise ValueError(f"stack {settings.stack}: region {region!r} is not in regions {list(config.regions)}")
        if not region_pools(config, region):
            raise ValueError(f"stack {settings.stack}: no pools declared in {region}")
        needs = check_pool_maxima(config, region)
    return Prepared(config, config_files(settings.config_dir), primary_region, primary_bucket(config), needs)


@dataclass
class RegionStack:
    """The components of one region stack."""

    cluster: Cluster
    addons: Addons
    control_plane: ControlPlane
    gpu_pools: dict[str, GpuNodePool]
    pools: dict[str, ModelPool]
    gateway: Gateway


def region_stack(settings: StackSettings, db_password: pulumi.Input[str]) -> RegionStack:
    """Declare one region: cluster, add-ons, control plane, GPU node pools, model pools, gateway."""
    prep = prepare(settings)
    config, region = prep.config, settings.region or ""
    bucket = region_bucket(prep.primary_bucket, region, prep.primary_region)
    ns = settings.namespace
    cp_url = f"http://{CONTROL_PLANE}.{ns}.svc.cluster.local:{CONTROL_HTTP_PORT}"
    policy_ = config.autoscaling
    pool_args = {}
    for pool, version in region_pools(config, region):
        model = config.model(pool.model)
        if model is None:
            raise ValueError(f"pool {pool.key} names undeclared model {pool.model}")
        pool_args[pool.key] = ModelPoolArgs(pool, version, model, ns, settings.images, bucket, cp_url, policy_)
    specs = {key: a.spec() for key, a in pool_args.items()}  # validates every pool up front
    demand = gpu_demand(config, region, prep.needs)

    cluster = Cluster(region, ClusterArgs(name=f"modelfleet-{region}", region=region,
                                          version=settings.cluster_version, vpc_cidr=settings.vpc_cidr))
    aws.iam.RolePolicy(f"{region}-weights-read", role=cluster.node_role_name, policy=policy(
        allow(["s3:ListBucket"], [f"arn:aws:s3:::{bucket}"]),
        allow(["s3:GetObject", "s3:GetObjectVersion"], [f"arn:aws:s3:::{bucket}/*"])))
    k8s = pulumi.ResourceOptions(providers=[cluster.provider])
    addons = Addons("addons", AddonsArgs(cluster.cluster_name, region, settings.cluster_version, ns), opts=k8s)
    after = pulumi.ResourceOptions(providers=[cluster.provider], depends_on=addons.ready)
    cp = ControlPlane("control-plane", ControlPlaneArgs(
        ns, region, settings.images.platform, prep.files, cluster.vpc_id, cluster.private_subnet_ids,
        cluster.node_security_group_id, db_password), opts=after)
    gpu_pools = {}
    for gpu_type, d in sorted(demand.items()):
        warm: dict[int, int] = defaultdict(int)
        for need in prep.needs.values():
            if need.live.gpu_type == gpu_type and need.warm_replicas:
                warm[need.live.gpus_per_replica] += need.warm_replicas
        prefetch = list({s.version.key: s for s in specs.values() if s.version.gpu_type == gpu_type}.values())
        gpu_pools[gpu_type] = GpuNodePool(f"gpu-{gpu_type}", GpuNodePoolArgs(
            cluster.cluster_name, cluster.node_role_arn, cluster.private_subnet_ids, d, ns,
            settings.images.pause, dict(warm), prefetch), opts=after)
    pools = {key: ModelPool(key, a, opts=pulumi.ResourceOptions(
        providers=[cluster.provider], depends_on=[*addons.ready, cp])) for key, a in pool_args.items()}
    zone_id = pulumi.StackReference(settings.global_stack).require_output("zoneId")
    drain_s = max(s.drain.prestop_s + s.drain.stream_bound_s for s in specs.values())
    gateway = Gateway("gateway", GatewayArgs(
        ns, region, settings.images, f"{CONTROL_PLANE}.{ns}.svc.cluster.local",
        settings.region_host(region), zone_id, settings.certificate_arn or "", cluster.vpc_id,
        cluster.private_subnet_ids, cluster.node_security_group_id, math.ceil(drain_s)), opts=after)

    pulumi.export("region", region)
    pulumi.export("clusterName", cluster.cluster_name)
    pulumi.export("kubeconfig", cluster.kubeconfig)
    pulumi.export("regionHostname", gateway.hostname)
    pulumi.export("weightsBucket", bucket)
    pulumi.export("pools", {k: {"min": a.pool.min_replicas, "max": a.pool.max_replicas}
                            for k, a in pool_args.items()})
    pulumi.export("gpuNodeGroups", {t: {"min": p.min_nodes, "max": p.max_nodes, "instanceType": p.instance_type}
                                    for t, p in gpu_pools.items()})
    return RegionStack(cluster, addons, cp, gpu_pools, pools, gateway)


@dataclass
class GlobalStack:
    """The components of the global stack."""

    buckets: dict[str, WeightsBucket]
    routing: GlobalRouting


def stack_program(settings: StackSettings,
                  db_password: Callable[[], pulumi.Input[str]] | None = None) -> Callable[[], object]:
    """The program of ``settings``' stack as one call. ``db_password`` yields the region's
    Postgres password (a secret); without it a fixed placeholder stands in (renders, tests)."""
    if settings.kind == "global":
        return lambda: global_stack(settings)
    password = db_password or (lambda: pulumi.Output.secret(PLACEHOLDER_PASSWORD))
    return lambda: region_stack(settings, password())


def global_stack(settings: StackSettings) -> GlobalStack:
    """Declare the weights buckets (primary replicating to every other region) and global DNS."""
    prep = prepare(settings)
    regions = list(prep.config.regions)
    providers = {r: aws.Provider(f"aws-{r}", region=r) for r in regions}
    buckets = {}
    for r in regions:
        if r != prep.primary_region:
            name = region_bucket(prep.primary_bucket, r, prep.primary_region)
            buckets[r] = WeightsBucket(f"weights-{r}", WeightsBucketArgs(name, r),
                                       opts=pulumi.ResourceOptions(providers=[providers[r]]))
    targets = [ReplicaTarget(r, b.bucket_arn, b.versioning) for r, b in buckets.items()]
    buckets[prep.primary_region] = WeightsBucket(
        f"weights-{prep.primary_region}",
        WeightsBucketArgs(prep.primary_bucket, prep.primary_region, targets),
        opts=pulumi.ResourceOptions(providers=[providers[prep.primary_region]]))
    routing = GlobalRouting("routing", GlobalRoutingArgs(settings.domain, regions, settings.zone_id))
    pulumi.export("zoneId", routing.zone_id)
    pulumi.export("apiHostname", routing.api_hostname)
    pulumi.export("regionHostnames", routing.region_hostnames)
    pulumi.export("nameServers", routing.name_servers)
    pulumi.export("weightsBuckets", {r: b.bucket_name for r, b in buckets.items()})
    return GlobalStack(buckets, routing)

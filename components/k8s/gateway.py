"""``Gateway``: the region's front door (``modelfleet:k8s:Gateway``), with the batch service.

An NLB (TLS with the region's ACM certificate) in front of Envoy pods whose bootstrap
(``envoy_control.resources.bootstrap.render_bootstrap``) points at the control plane Service; everything
else Envoy gets over ADS. gateway_ext (ext_authz: keys, token buckets, admission, replica
picking) keeps its buckets in ElastiCache Redis. Both scale on CPU with an HPA. The region's DNS
name (``<region>.api.<domain>``) points at the NLB; the global stack's latency records point at
that name.

Envoy drains like a replica: its preStop outlasts the longest stream any pool allows, so a
scale-down or rollout of Envoy never cuts a stream that the replica behind it would have finished.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s
from envoy_control.resources.bootstrap import render_bootstrap

from autoscale.naming import gateway_pod_monitor
from components.k8s import service_manifests as sm
from components.k8s.batch_service import BATCH_PORT, batch_host, batch_objects
from components.k8s.objects import declare
from components.outputs import known_after
from components.settings import Images

NLB_ANNOTATIONS = {
    "service.beta.kubernetes.io/aws-load-balancer-type": "nlb",
    "service.beta.kubernetes.io/aws-load-balancer-ssl-ports": "https",
    "service.beta.kubernetes.io/aws-load-balancer-cross-zone-load-balancing-enabled": "true",
}


def envoy_objects(namespace: str, image: str, xds_host: str, drain_s: int,
                  certificate_arn: str) -> list[dict[str, Any]]:
    """Bootstrap ConfigMap, Deployment and NLB Service of Envoy (``drain_s``: seconds). The
    bootstrap names gateway_ext (ext_authz) and the batch service by their Services' DNS names."""
    bootstrap = render_bootstrap(
        node_id="envoy", cluster="modelfleet-gateway", admin_port=sm.ENVOY_ADMIN_PORT,
        admin_host="0.0.0.0", xds_host=xds_host, xds_port=sm.XDS_PORT,
        gateway=(f"{sm.GATEWAY_EXT}.{namespace}.svc.cluster.local", sm.GATEWAY_EXT_PORT),
        batch=(batch_host(namespace), BATCH_PORT))
    envoy = sm.container(
        "envoy", image, command=["envoy"],
        args=["-c", "/etc/envoy/bootstrap.json", "--service-node", "$(POD_NAME)",
              "--service-cluster", "modelfleet-gateway", "--drain-time-s", str(drain_s),
              "--log-level", "info"],
        ports={"http": sm.LISTENER_PORT, "admin": sm.ENVOY_ADMIN_PORT}, health=("/ready", "admin"),
        cpu="2", memory="1Gi",
        env=[{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        mounts=[{"name": "bootstrap", "mountPath": "/etc/envoy", "readOnly": True}],
        extra={"lifecycle": {"preStop": {"sleep": {"seconds": drain_s}}}})
    deployment = sm.deployment("envoy", namespace, replicas=3, containers=[envoy], grace_s=drain_s + 10,
                               volumes=[{"name": "bootstrap", "configMap": {"name": "envoy-bootstrap"}}])
    nlb = sm.service("envoy", namespace, {"https": 443}, targets={"https": "http"}, type="LoadBalancer",
                     externalTrafficPolicy="Local",
                     annotations={**NLB_ANNOTATIONS,
                                  "service.beta.kubernetes.io/aws-load-balancer-ssl-cert": certificate_arn})
    return [sm.envoy_bootstrap(namespace, bootstrap), deployment, nlb]


def gateway_ext_objects(namespace: str, region: str, image: str, redis_url: Any,
                        control_plane_host: str) -> list[dict[str, Any]]:
    """Deployment and Service of gateway_ext (``python -m gateway_ext``; the usage database URL
    comes from the DB Secret as ``MODELFLEET_GATEWAY_USAGE_DB_URL``). It follows the control
    plane's router state and keeps its own copy on disk, so a gateway restarted while the control
    plane is down starts from the last state it saw."""
    c = sm.container(
        sm.GATEWAY_EXT, image, command=["python", "-m", "gateway_ext"],
        args=["--config", sm.CONFIG_MOUNT, "--host", "0.0.0.0", "--port", str(sm.GATEWAY_EXT_PORT),
              "--region", region, "--spool", "/var/lib/gateway-ext/usage-spool.jsonl",
              "--control-plane-url", f"http://{control_plane_host}:{sm.CONTROL_HTTP_PORT}"],
        ports={"http": sm.GATEWAY_EXT_PORT}, health=("/health", "http"), cpu="1", memory="1Gi",
        env=[{"name": "MODELFLEET_GATEWAY_REDIS_URL", "value": redis_url},
             {"name": "MODELFLEET_GATEWAY_ROUTER_STATE_FILE",
              "value": "/var/lib/gateway-ext/router-state.json"},
             {"name": "MODELFLEET_GATEWAY_ROUTER_STATE_WRITE", "value": "1"}],
        mounts=[{"name": "config", "mountPath": sm.CONFIG_MOUNT, "readOnly": True},
                {"name": "spool", "mountPath": "/var/lib/gateway-ext"}],
        extra={"envFrom": [{"secretRef": {"name": sm.DB_SECRET}}]})
    return [sm.deployment(sm.GATEWAY_EXT, namespace, replicas=3, containers=[c],
                          volumes=[{"name": "config", "configMap": {"name": sm.CONFIG_MAP}},
                                   {"name": "spool", "emptyDir": {}}]),
            sm.service(sm.GATEWAY_EXT, namespace, {"http": sm.GATEWAY_EXT_PORT})]


@dataclass
class GatewayArgs:
    """One region's gateway. ``drain_s`` is the longest stream any pool allows plus the replicas'
    preStop, seconds; replicas are (min, max) per HPA."""

    namespace: str
    region: str
    images: Images
    control_plane_host: str
    hostname: str
    zone_id: pulumi.Input[str]
    certificate_arn: str
    vpc_id: pulumi.Input[str]
    subnet_ids: pulumi.Input[Sequence[pulumi.Input[str]]]
    client_security_group_id: pulumi.Input[str]
    drain_s: int
    envoy_replicas: tuple[int, int] = (3, 30)
    gateway_ext_replicas: tuple[int, int] = (3, 30)
    redis_node_type: str = "cache.r7g.large"
    batch_buckets: tuple[str, ...] = ()
    """S3 locations batch inputs/outputs must lie under (``bucket/prefix/{team}/``)."""


class Gateway(pulumi.ComponentResource):
    """Envoy + NLB + gateway_ext + Redis + the region's DNS name."""

    hostname: pulumi.Output[str]
    load_balancer: pulumi.Output[str]
    redis_endpoint: pulumi.Output[str]

    def __init__(self, name: str, args: GatewayArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        if not args.certificate_arn.startswith("arn:aws:acm:"):
            raise ValueError(f"certificate {args.certificate_arn!r} is not an ACM certificate ARN")
        if not 0 < args.drain_s <= 3600:
            raise ValueError(f"drain_s {args.drain_s} outside 1..3600 s")
        envoy = envoy_objects(args.namespace, args.images.envoy, args.control_plane_host, args.drain_s,
                              args.certificate_arn)
        hpas = [sm.hpa("envoy", args.namespace, *args.envoy_replicas),
                sm.hpa(sm.GATEWAY_EXT, args.namespace, *args.gateway_ext_replicas)]
        super().__init__("modelfleet:k8s:Gateway", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        subnets = aws.elasticache.SubnetGroup(f"{name}-redis", subnet_ids=args.subnet_ids, opts=child)
        sg = aws.ec2.SecurityGroup(f"{name}-redis", vpc_id=args.vpc_id, description="modelfleet Redis",
                                   ingress=[{"protocol": "tcp", "from_port": 6379, "to_port": 6379,
                                             "security_groups": [args.client_security_group_id]}], opts=child)
        redis = aws.elasticache.ReplicationGroup(
            f"{name}-redis", description="modelfleet token buckets", engine="redis", engine_version="7.1",
            node_type=args.redis_node_type, num_cache_clusters=2, automatic_failover_enabled=True,
            multi_az_enabled=True, transit_encryption_enabled=True, at_rest_encryption_enabled=True,
            port=6379, subnet_group_name=subnets.name, security_group_ids=[sg.id], opts=child)
        redis_url = redis.primary_endpoint_address.apply(lambda a: f"rediss://{a}:6379/0")
        objects = [*envoy, *gateway_ext_objects(args.namespace, args.region, args.images.platform, redis_url,
                                                       args.control_plane_host),
                   *batch_objects(args.namespace, args.images.platform, args.batch_buckets),
                   gateway_pod_monitor(args.namespace),
                   *hpas, sm.pdb("envoy", args.namespace), sm.pdb(sm.GATEWAY_EXT, args.namespace)]
        declared = [declare(obj, child) for obj in objects]
        nlb = next(r for r, o in zip(declared, objects, strict=True)
                   if o["kind"] == "Service" and o["metadata"]["name"] == "envoy")
        assert isinstance(nlb, k8s.core.v1.Service)
        lb_host = nlb.status.apply(_ingress_host)
        record = aws.route53.Record(f"{name}-dns", zone_id=args.zone_id, name=args.hostname, type="CNAME",
                                    ttl=60, records=[lb_host], opts=child)
        self.hostname = known_after(record, args.hostname)
        self.load_balancer = lb_host
        self.redis_endpoint = redis.primary_endpoint_address
        self.register_outputs({"hostname": self.hostname, "load_balancer": self.load_balancer,
                               "redis_endpoint": self.redis_endpoint})


def _ingress_host(status: Any) -> str:
    """The NLB's DNS name from a Service's status (empty until AWS has assigned it)."""
    ingress = getattr(getattr(status, "load_balancer", None), "ingress", None) or []
    return str(getattr(ingress[0], "hostname", "") or "") if ingress else ""

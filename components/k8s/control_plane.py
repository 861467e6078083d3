"""``ControlPlane``: the region's xDS control plane, its database and the platform config
(``modelfleet:k8s:ControlPlane``).

One active replica, restarted fast rather than elected: a Deployment of one pod with the
``Recreate`` strategy (never two at once, even during an update), a high PriorityClass (never
preempted), a 30 s toleration of an unreachable node (rescheduled within about a minute of a
node loss instead of five), and ``--state-file`` on an emptyDir so a crashed container restarts
in seconds with its replicas restored. Envoy and gateway_ext keep serving the last configuration
they received while it is away (the design's rule); only rollouts and limit changes wait. Two
active planes would each hold their own heartbeats and router state; leader election would need
a Lease loop inside ``envoy_control`` and buys little over a restart measured in seconds.

RBAC lets it watch EndpointSlices (the pools' headless Services), Pods and Services in the
platform namespace. Postgres (RDS, Multi-AZ) holds the registry and usage.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from components.k8s import service_manifests as sm
from components.k8s.objects import declare
from components.outputs import known_after

PRIORITY_CLASS = "modelfleet-control"


def rbac(namespace: str) -> list[dict[str, object]]:
    """ServiceAccount, Role (read EndpointSlices, Pods, Services) and RoleBinding."""
    name = sm.CONTROL_PLANE
    rules = [{"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]},
             {"apiGroups": [""], "resources": ["pods", "services"], "verbs": ["get", "list", "watch"]}]
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": sm.meta(name, namespace)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": sm.meta(name, namespace),
         "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": sm.meta(name, namespace),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]},
        {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
         "metadata": {"name": PRIORITY_CLASS, "labels": sm.labels(name)}, "value": 1_000_000,
         "globalDefault": False, "description": "modelfleet control plane: never preempted"},
    ]


def control_plane_deployment(namespace: str, region: str, image: str) -> dict[str, object]:
    """One replica, ``Recreate``, state file on an emptyDir (see the module docstring)."""
    args = ["--config", sm.CONFIG_MOUNT, "--xds-port", str(sm.XDS_PORT),
            "--http-port", str(sm.CONTROL_HTTP_PORT), "--listener-port", str(sm.LISTENER_PORT),
            "--host", "0.0.0.0", "--listener-host", "0.0.0.0", "--region", region,
            "--state-file", "/var/lib/modelfleet/router-state.json", "--no-access-log"]
    c = sm.container(sm.CONTROL_PLANE, image, command=["python", "-m", "envoy_control"], args=args,
                     ports={"xds": sm.XDS_PORT, "http": sm.CONTROL_HTTP_PORT}, health=("/health", "http"),
                     cpu="1", memory="2Gi",
                     mounts=[{"name": "config", "mountPath": sm.CONFIG_MOUNT, "readOnly": True},
                             {"name": "state", "mountPath": "/var/lib/modelfleet"}],
                     extra={"envFrom": [{"secretRef": {"name": sm.DB_SECRET}}]})
    unreachable = [{"key": f"node.kubernetes.io/{k}", "operator": "Exists", "effect": "NoExecute",
                    "tolerationSeconds": 30} for k in ("not-ready", "unreachable")]
    return sm.deployment(sm.CONTROL_PLANE, namespace, replicas=1, containers=[c], strategy="Recreate",
                         grace_s=15, volumes=[{"name": "config", "configMap": {"name": sm.CONFIG_MAP}},
                                              {"name": "state", "emptyDir": {}}],
                         pod_extra={"serviceAccountName": sm.CONTROL_PLANE, "priorityClassName": PRIORITY_CLASS,
                                    "tolerations": unreachable})


@dataclass
class ControlPlaneArgs:
    """The control plane of one region. ``config_files`` is ``config/*.yaml`` (name -> text);
    ``client_security_group_id`` is the nodes' group, which Postgres admits."""

    namespace: str
    region: str
    image: str
    config_files: dict[str, str]
    vpc_id: pulumi.Input[str]
    subnet_ids: pulumi.Input[Sequence[pulumi.Input[str]]]
    client_security_group_id: pulumi.Input[str]
    db_password: pulumi.Input[str]
    db_instance_class: str = "db.r6g.large"
    db_storage_gb: int = 100


class ControlPlane(pulumi.ComponentResource):
    """Deployment, Service (xDS gRPC + HTTP), RBAC, config ConfigMap, RDS Postgres."""

    service_host: pulumi.Output[str]
    """``control-plane.<namespace>.svc.cluster.local``: Envoy's xDS cluster and replicas' target."""
    xds_port: pulumi.Output[int]
    http_url: pulumi.Output[str]
    db_endpoint: pulumi.Output[str]
    config_map_name: pulumi.Output[str]

    def __init__(self, name: str, args: ControlPlaneArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        config_map = sm.config_map(args.namespace, args.config_files)  # raises on no files
        super().__init__("modelfleet:k8s:ControlPlane", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        ident = f"modelfleet-{args.region}"
        subnets = aws.rds.SubnetGroup(f"{name}-db", subnet_ids=args.subnet_ids, opts=child)
        sg = aws.ec2.SecurityGroup(f"{name}-db", vpc_id=args.vpc_id, description="modelfleet Postgres",
                                   ingress=[{"protocol": "tcp", "from_port": 5432, "to_port": 5432,
                                             "security_groups": [args.client_security_group_id]}], opts=child)
        db = aws.rds.Instance(
            f"{name}-db", identifier=ident, engine="postgres", engine_version="16",
            instance_class=args.db_instance_class, allocated_storage=args.db_storage_gb,
            max_allocated_storage=args.db_storage_gb * 10, storage_type="gp3", storage_encrypted=True,
            multi_az=True, db_name="modelfleet", username="modelfleet", password=args.db_password,
            db_subnet_group_name=subnets.name, vpc_security_group_ids=[sg.id],
            backup_retention_period=7, deletion_protection=True, skip_final_snapshot=False,
            final_snapshot_identifier=f"{ident}-final", performance_insights_enabled=True, opts=child)
        # secret because the password is: Pulumi keeps it encrypted in state and out of logs
        url = pulumi.Output.all(db.address, args.db_password).apply(
            lambda a: f"postgresql+psycopg://modelfleet:{a[1]}@{a[0]}:5432/modelfleet")
        declare(config_map, child)
        secret = declare(sm.db_secret(args.namespace, url), child)
        for obj in rbac(args.namespace):
            declare(obj, child)
        deployment = declare(control_plane_deployment(args.namespace, args.region, args.image),
                             pulumi.ResourceOptions(parent=self, depends_on=[secret]))
        svc = declare(sm.service(sm.CONTROL_PLANE, args.namespace,
                                 {"xds": sm.XDS_PORT, "http": sm.CONTROL_HTTP_PORT}), child)
        host = f"{sm.CONTROL_PLANE}.{args.namespace}.svc.cluster.local"
        self.service_host = known_after(svc, host)
        self.xds_port = pulumi.Output.from_input(sm.XDS_PORT)
        self.http_url = known_after(deployment, f"http://{host}:{sm.CONTROL_HTTP_PORT}")
        self.db_endpoint = db.address
        self.config_map_name = pulumi.Output.from_input(sm.CONFIG_MAP)
        self.register_outputs({"service_host": self.service_host, "xds_port": self.xds_port,
                               "http_url": self.http_url, "db_endpoint": self.db_endpoint,
                               "config_map_name": self.config_map_name})

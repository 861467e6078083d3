"""Gateway (Envoy + NLB + gateway_ext + Redis + DNS) and ControlPlane (one replica, RBAC, RDS)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from envoy_control.resources.batch import BATCH_CLUSTER
from envoy_control.resources.ext_authz import GATEWAY_CLUSTER

from components.k8s.control_plane import ControlPlane, ControlPlaneArgs
from components.k8s.gateway import Gateway, GatewayArgs
from components.program import config_files
from components.settings import Images
from components.testing import Build, inputs, objects
from components.validation import invalid_objects

CERT = "arn:aws:acm:us-east-1:000000000000:certificate/x"
CP_HOST = "control-plane.modelfleet.svc.cluster.local"


def _gateway(images: Images, cert: str = CERT) -> Gateway:
    return Gateway("gateway", GatewayArgs(
        "modelfleet", "us-east-1", images, CP_HOST,
        "us-east-1.api.modelfleet.example.com", "ZMOCKZONE", cert, "vpc-1", ["subnet-a"], "sg-nodes",
        drain_s=423))


def test_envoy_bootstraps_from_the_control_plane(build: Build, images: Images) -> None:
    mocks = build(lambda: _gateway(images))
    cm = next(c for c in objects(mocks, "ConfigMap") if c["metadata"]["name"] == "envoy-bootstrap")
    bootstrap = json.loads(cm["data"]["bootstrap.json"])
    clusters = {c["name"]: c for c in bootstrap["static_resources"]["clusters"]}

    def target(name: str) -> tuple[str, int]:
        lb = clusters[name]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]
        address = lb["endpoint"]["address"]["socket_address"]
        return address["address"], address["port_value"]

    xds = next(c for c in clusters.values() if target(c["name"]) == (CP_HOST, 18000))
    assert xds["type"] == "STRICT_DNS"
    # ext_authz and the batch routes need their clusters in the bootstrap, or every API request
    # (and every /v1/batches request) is refused with 503
    assert target(GATEWAY_CLUSTER) == ("gateway-ext.modelfleet.svc.cluster.local", 8080)
    assert target(BATCH_CLUSTER) == ("batch.modelfleet.svc.cluster.local", 8091)
    assert clusters[GATEWAY_CLUSTER]["type"] == clusters[BATCH_CLUSTER]["type"] == "STRICT_DNS"
    envoy = next(d for d in objects(mocks, "Deployment") if d["metadata"]["name"] == "envoy")
    pod = envoy["spec"]["template"]["spec"]
    assert pod["containers"][0]["lifecycle"]["preStop"]["sleep"]["seconds"] == 423
    assert pod["terminationGracePeriodSeconds"] == 433
    assert invalid_objects(mocks.kubernetes_objects()) == {}


def test_batch_service_sends_through_envoy_and_keeps_its_uploads(build: Build, images: Images) -> None:
    mocks = build(lambda: _gateway(images))
    batch = next(d for d in objects(mocks, "Deployment") if d["metadata"]["name"] == "batch")
    spec = batch["spec"]
    assert spec["replicas"] == 1 and spec["strategy"]["type"] == "Recreate"
    (c,) = spec["template"]["spec"]["containers"]
    args = c["args"]
    assert c["command"] == ["python", "-m", "batch"]
    assert args[args.index("--api-base-url") + 1] == \
        "http://envoy.modelfleet.svc.cluster.local:8080/v1"
    volumes = {v["name"]: v for v in spec["template"]["spec"]["volumes"]}
    assert volumes["files"]["persistentVolumeClaim"]["claimName"] == "batch-files"
    assert volumes["keys"]["secret"]["secretName"] == "modelfleet-batch-keys"
    assert any(s["metadata"]["name"] == "batch" for s in objects(mocks, "Service"))
    assert invalid_objects(mocks.kubernetes_objects()) == {}


def test_nlb_redis_autoscaling_and_dns(build: Build, images: Images) -> None:
    mocks = build(lambda: _gateway(images))
    nlb = next(s for s in objects(mocks, "Service") if s["metadata"]["name"] == "envoy")
    assert nlb["spec"]["type"] == "LoadBalancer"
    annotations = nlb["metadata"]["annotations"]
    assert annotations["service.beta.kubernetes.io/aws-load-balancer-type"] == "nlb"
    assert annotations["service.beta.kubernetes.io/aws-load-balancer-ssl-cert"] == CERT
    assert {h["spec"]["scaleTargetRef"]["name"] for h in objects(mocks, "HorizontalPodAutoscaler")} == \
        {"envoy", "gateway-ext"}
    (redis,) = inputs(mocks, "aws:elasticache/replicationGroup:ReplicationGroup")
    assert redis["automaticFailoverEnabled"] and redis["transitEncryptionEnabled"]
    ext = next(d for d in objects(mocks, "Deployment") if d["metadata"]["name"] == "gateway-ext")
    env = {e["name"]: e.get("value") for e in ext["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["MODELFLEET_GATEWAY_REDIS_URL"] == "rediss://gateway-redis.cache.mock:6379/0"
    args = ext["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:2] == ["--config", "/etc/modelfleet/config"] and "--region" in args
    # Prometheus scrapes gateway_ext: its admission queue is part of the pools' queue trigger
    (monitor,) = [m for m in objects(mocks, "PodMonitor") if m["metadata"]["name"] == "gateway-ext"]
    assert monitor["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": "gateway-ext"}
    # follows the control plane's router state and keeps a copy for restarts while it is down
    assert args[args.index("--control-plane-url") + 1].startswith("http://")
    assert env["MODELFLEET_GATEWAY_ROUTER_STATE_WRITE"] == "1"
    (record,) = inputs(mocks, "aws:route53/record:Record")
    assert (record["name"], record["type"]) == ("us-east-1.api.modelfleet.example.com", "CNAME")
    assert record["records"] == ["modelfleet-envoy.elb.mock"]


def test_a_gateway_needs_an_acm_certificate(build: Build, images: Images) -> None:
    with pytest.raises(ValueError, match="not an ACM certificate"):
        build(lambda: _gateway(images, cert="arn:aws:iam::0:server-certificate/x"))


def test_control_plane_one_replica_rbac_config_and_postgres(build: Build, images: Images) -> None:
    files = config_files(Path(__file__).resolve().parents[2] / "config")
    mocks = build(lambda: ControlPlane("control-plane", ControlPlaneArgs(
        "modelfleet", "us-east-1", images.platform, files, "vpc-1", ["subnet-a"], "sg-nodes", "pw")))
    (dep,) = objects(mocks, "Deployment")
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"] == {"type": "Recreate"}
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--xds-port") + 1] == "18000" and "--state-file" in args
    (role,) = objects(mocks, "Role")
    assert {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
            "verbs": ["get", "list", "watch"]} in role["rules"]
    (svc,) = objects(mocks, "Service")
    assert {p["name"]: p["port"] for p in svc["spec"]["ports"]} == {"xds": 18000, "http": 8081}
    cm = next(c for c in objects(mocks, "ConfigMap") if c["metadata"]["name"] == "modelfleet-config")
    assert sorted(cm["data"]) == ["models.yaml", "pools.yaml", "teams.yaml"]  # no dev keys
    (db,) = inputs(mocks, "aws:rds/instance:Instance")
    assert db["engine"] == "postgres" and db["multiAz"] and db["password"] == "<secret>"
    (secret,) = objects(mocks, "Secret")
    assert secret["stringData"]["MODELFLEET_DATABASE_URL"] == "<secret>"
    assert invalid_objects(mocks.kubernetes_objects()) == {}

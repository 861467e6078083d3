"""Run the Pulumi program without a cloud: ``pulumi.runtime.Mocks`` that record every resource.

The same mocks serve ``modelfleet render`` and the tests. Each resource's state is its inputs
plus the few outputs AWS or Kubernetes would compute that the program reads back (an EKS
endpoint, a node group's ASG, an NLB's hostname, ...), all deterministic, so two renders of the
same config are byte-identical.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pulumi
from pulumi.runtime import MockCallArgs, MockResourceArgs, Mocks

PROJECT = "modelfleet"
ACCOUNT = "000000000000"


@dataclass(frozen=True)
class Recorded:
    """One registered resource: Pulumi type token, name, inputs, and whether it is a custom
    (provider-managed) resource rather than a component."""

    type: str
    name: str
    inputs: dict[str, Any]
    custom: bool


def _computed(typ: str, name: str, inputs: dict[str, Any]) -> dict[str, Any]:
    """Outputs a real provider would compute that the program reads back."""
    arn = f"arn:aws:mock::{ACCOUNT}:{name}"
    by_type: dict[str, dict[str, Any]] = {
        "aws:eks/cluster:Cluster": {
            "endpoint": f"https://{name}.eks.mock", "certificateAuthority": {"data": "bW9jay1jYQ=="},
            "vpcConfig": {**inputs.get("vpcConfig", {}), "clusterSecurityGroupId": f"sg-{name}"}},
        "aws:eks/nodeGroup:NodeGroup": {"resources": [{"autoscalingGroups": [{"name": f"eks-{name}-asg"}]}]},
        "aws:ec2/launchTemplate:LaunchTemplate": {"latestVersion": 1},
        "aws:iam/role:Role": {"arn": f"arn:aws:iam::{ACCOUNT}:role/{name}", "name": name},
        "aws:s3/bucket:Bucket": {"arn": f"arn:aws:s3:::{inputs.get('bucket', name)}"},
        "aws:rds/instance:Instance": {"address": f"{name}.rds.mock", "endpoint": f"{name}.rds.mock:5432"},
        "aws:elasticache/replicationGroup:ReplicationGroup": {"primaryEndpointAddress": f"{name}.cache.mock"},
        "aws:route53/zone:Zone": {"zoneId": "ZMOCKZONE", "nameServers": ["ns-1.mock", "ns-2.mock"]},
        "pulumi:pulumi:StackReference": {"outputs": {"zoneId": "ZMOCKZONE"}},
    }
    out = by_type.get(typ, {})
    if typ == "kubernetes:core/v1:Service" and inputs.get("spec", {}).get("type") == "LoadBalancer":
        out = {"status": {"loadBalancer": {"ingress": [{"hostname": f"{name.replace('/', '-')}.elb.mock"}]}}}
    if typ.startswith("aws:") and "arn" not in out:
        out = {"arn": arn, **out}
    return out


class RecordingMocks(Mocks):
    """Mocks that answer every registration with deterministic state and keep a record of it."""

    def __init__(self) -> None:
        self.resources: list[Recorded] = []

    def new_resource(self, args: MockResourceArgs) -> tuple[str | None, dict[Any, Any]]:
        inputs = dict(args.inputs)
        self.resources.append(Recorded(args.typ, args.name, inputs, bool(args.custom)))
        return f"{args.name}-id", {**inputs, **_computed(args.typ, args.name, inputs)}

    def call(self, args: MockCallArgs) -> tuple[dict[Any, Any], list[tuple[str, str]] | None]:
        return {}, None

    def of_type(self, typ: str) -> list[Recorded]:
        """Every recorded resource of Pulumi type ``typ``."""
        return [r for r in self.resources if r.type == typ]

    def kubernetes_objects(self) -> list[dict[str, Any]]:
        """Every Kubernetes object declared (inputs of resources with apiVersion and kind)."""
        return [plain(r.inputs) for r in self.resources
                if r.type.startswith("kubernetes:") and "apiVersion" in r.inputs and "kind" in r.inputs]


SECRET = "<secret>"
"""What a secret's text becomes in plain data: a render never holds a password."""
_SIG_KEY, _SECRET_SIG = "4dabf18193072939515e22adb298388d", "1b47061264138c4ac30d75fd1eb44270"
"""How the Pulumi wire format marks a secret value (``pulumi.runtime.rpc``)."""


def plain(value: Any, *, secret: bool = False) -> Any:
    """Inputs as plain data: protobuf numbers that are whole back to ints, keys sorted, and the
    text inside a secret replaced by :data:`SECRET` (its shape kept, so a Secret still validates)."""
    if isinstance(value, dict):
        if value.get(_SIG_KEY) == _SECRET_SIG:
            return plain(value.get("value"), secret=True)
        return {str(k): plain(v, secret=secret) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, list | tuple):
        return [plain(v, secret=secret) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if secret and isinstance(value, str):
        return SECRET
    return value


def _ensure_event_loop() -> None:
    """Pulumi's runtime reads ``asyncio.get_event_loop()``: give this thread a loop when an earlier
    ``asyncio.run`` (a command, an async test) left it with none."""
    try:
        asyncio.get_event_loop_policy().get_event_loop()
    except RuntimeError:
        asyncio.set_event_loop(asyncio.new_event_loop())


def run_program(program: Callable[[], object], stack: str = "test",
                mocks: RecordingMocks | None = None) -> RecordingMocks:
    """Run ``program`` under fresh recording mocks (not a preview: every value is known) and
    wait for every registration; exceptions raised by the program propagate."""
    mocks = mocks or RecordingMocks()
    _ensure_event_loop()
    pulumi.runtime.set_mocks(mocks, project=PROJECT, stack=stack, preview=False)

    def body() -> None:
        program()

    pulumi.runtime.test(body)()  # type: ignore[no-untyped-call]
    return mocks

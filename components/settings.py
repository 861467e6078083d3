"""The stack's settings: what ``stacks/Pulumi.<stack>.yaml`` says under ``modelfleet:``.

One parser serves ``pulumi up`` (``infra/__main__.py`` reads ``pulumi.Config``) and ``modelfleet
render`` (which reads the YAML file itself), so both build the same program from the same file.
Relative paths (``configDir``) are relative to the Pulumi program's folder, ``infra/``, as
Pulumi runs it there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

KINDS = ("region", "global")


class StackSettingsError(ValueError):
    """A stack config value is missing or malformed."""


@dataclass(frozen=True)
class Images:
    """Container images. The platform's own are ``<registry>/<name>:<tag>``; third-party images
    are pinned by tag here so a bump is a reviewed diff."""

    registry: str = "registry.example.internal/modelfleet"
    tag: str = "0.1.0"
    envoy: str = "envoyproxy/envoy:v1.40.0"
    pause: str = "registry.k8s.io/pause:3.10"
    aws_cli: str = "public.ecr.aws/aws-cli/aws-cli:2.27.0"

    @property
    def platform(self) -> str:
        """The control plane, gateway_ext and the batch service (``images/platform.Dockerfile``:
        the ``gateway``, ``control-plane`` and ``batch`` extras)."""
        return f"{self.registry}/platform:{self.tag}"

    @property
    def vllm(self) -> str:
        """vLLM with the modelfleet middleware (``images/vllm.Dockerfile``: the ``middleware`` extra)."""
        return f"{self.registry}/vllm:{self.tag}"

    @property
    def sglang(self) -> str:
        """SGLang as it ships, pinned (``images/sglang.Dockerfile``; runs nothing of the project)."""
        return f"{self.registry}/sglang:{self.tag}"


@dataclass(frozen=True)
class StackSettings:
    """Settings of one stack. ``kind`` is ``region`` (one cluster) or ``global`` (buckets, DNS)."""

    stack: str
    kind: Literal["region", "global"]
    config_dir: Path
    domain: str
    """The hosted zone; the API answers at ``api.<domain>``, region ``r`` at ``r.api.<domain>``."""
    region: str | None = None
    primary_region: str | None = None
    """Where weights are registered and replicated from (default: the config's first region)."""
    zone_id: str | None = None
    """An existing hosted zone (global stack); without one the global stack creates the zone."""
    global_stack: str = "global"
    """The global stack's name, as ``pulumi.StackReference`` takes it (region stacks read the
    zone id from it)."""
    certificate_arn: str | None = None
    """ACM certificate for ``*.api.<domain>`` and ``api.<domain>`` in the region (TLS at the NLB)."""
    cluster_version: str = "1.32"
    vpc_cidr: str = "10.0.0.0/16"
    namespace: str = "modelfleet"
    images: Images = field(default_factory=Images)

    @property
    def api_host(self) -> str:
        """The global API name, e.g. ``api.modelfleet.example.com``."""
        return f"api.{self.domain}"

    def region_host(self, region: str) -> str:
        """The name of one region's load balancer, e.g. ``us-east-1.api.modelfleet.example.com``."""
        return f"{region}.{self.api_host}"


def settings_from(stack: str, get: Callable[[str], str | None], program_dir: Path) -> StackSettings:
    """Build the settings of ``stack`` from ``get(key)`` (keys without the ``modelfleet:``
    prefix). ``program_dir`` is the folder relative paths are read from (``infra/``)."""

    def required(key: str) -> str:
        value = get(key)
        if not value:
            raise StackSettingsError(f"stack {stack}: modelfleet:{key} is required")
        return value

    kind = get("kind") or "region"
    if kind not in KINDS:
        raise StackSettingsError(f"stack {stack}: modelfleet:kind must be one of {KINDS}, not {kind!r}")
    config_dir = Path(get("configDir") or "../config")
    if not config_dir.is_absolute():
        config_dir = (program_dir / config_dir).resolve()
    images = Images(registry=get("imageRegistry") or Images.registry,
                    tag=get("imageTag") or Images.tag)
    settings = StackSettings(
        stack=stack,
        kind="region" if kind == "region" else "global",
        config_dir=config_dir,
        domain=required("domain"),
        region=get("region"),
        primary_region=get("primaryRegion"),
        zone_id=get("zoneId"),
        global_stack=get("globalStack") or "global",
        certificate_arn=get("certificateArn"),
        cluster_version=get("clusterVersion") or "1.32",
        vpc_cidr=get("vpcCidr") or "10.0.0.0/16",
        images=images,
    )
    if settings.kind == "region":
        required("region")
        required("certificateArn")
    return settings


def stack_file_values(path: Path) -> dict[str, str]:
    """The ``modelfleet:`` values of a ``Pulumi.<stack>.yaml``, as ``pulumi.Config`` returns them
    (strings; lists and mappings as JSON). Secure (encrypted) values are left out."""
    import json

    import yaml

    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    out = {}
    for key, value in (data.get("config") or {}).items():
        ns, _, name = str(key).partition(":")
        if ns != "modelfleet" or (isinstance(value, dict) and "secure" in value):
            continue
        out[name] = value if isinstance(value, str) else json.dumps(value)
    return out


def settings_from_file(stacks_dir: Path, stack: str, config_dir: Path | None = None) -> StackSettings:
    """The settings of ``stacks_dir/Pulumi.<stack>.yaml``, relative paths read from the project's
    ``infra/`` (beside ``stacks_dir``); ``config_dir`` overrides ``modelfleet:configDir``."""
    path = stacks_dir / f"Pulumi.{stack}.yaml"
    if not path.is_file():
        known = sorted(p.name.removeprefix("Pulumi.").removesuffix(".yaml") for p in stacks_dir.glob("Pulumi.*.yaml"))
        raise StackSettingsError(f"no stack file {path} (stacks: {', '.join(known) or 'none'})")
    values = stack_file_values(path)
    if config_dir is not None:
        values["configDir"] = str(config_dir.resolve())
    return settings_from(stack, values.get, stacks_dir.resolve().parent / "infra")

"""The typed model of the declared platform config (the YAML under ``config/``).

Field names follow the seed's tables (models, model_versions, pools, teams, team_limits).
Every record is frozen: a loaded config is a value, never edited in place.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from modelfleet.config.autoscaling import AutoscalePolicy  # imports nothing of modelfleet.config
from modelfleet.config.hardware import GPU_TYPES
from modelfleet.config.rollout import RolloutSettings

Name = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")]
"""A model, team or region name: lower-case letters, digits and dashes (DNS-label safe)."""
VersionName = Annotated[str, StringConstraints(pattern=r"^v[0-9][a-z0-9.-]{0,30}$")]
"""A version name such as ``v13``."""
Sha256 = Annotated[str, StringConstraints(pattern=r"^sha256:[0-9a-f]{64}$")]
"""A content hash written ``sha256:<64 hex digits>``."""
Tier = Literal["interactive", "standard", "batch"]
TIERS: tuple[Tier, ...] = ("interactive", "standard", "batch")
"""Priority tiers, highest first."""


class Record(BaseModel):
    """Base of every config record: unknown keys are errors, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Canary(Record):
    """A canary stage: ``percent`` (0..100) of conversations go to ``version``."""

    version: VersionName
    percent: float = Field(ge=0, le=100)


class Shadow(Record):
    """Shadow traffic: a ``fraction`` (0..1) of requests is copied to ``version``, output discarded."""

    version: VersionName
    fraction: float = Field(ge=0, le=1)


class Model(Record):
    """A model name that clients ask for; ``live`` is the alias: the version it resolves to."""

    name: Name
    task: Literal["chat", "reasoning"] = "chat"
    live: VersionName
    canary: Canary | None = None
    shadow: Shadow | None = None
    max_output_tokens: int = Field(default=4096, ge=1, le=1_000_000)
    """The largest ``max_tokens`` a request may ask for, in tokens."""


class Architecture(Record):
    """The network's shape, which fixes weight and KV-cache sizes."""

    params_billion: float = Field(gt=0)
    layers: int = Field(ge=1)
    attention_heads: int = Field(ge=1)
    kv_heads: int = Field(ge=1)
    head_dim: int = Field(ge=1)


class Capacity(Record):
    """Load-tested capacity of one replica: the point where p95 TTFT stays under 1 s and streams
    keep their rate. ``output_tokens_per_s`` in tokens per second, ``tokens_in_flight`` in tokens
    (prompt plus remaining output of everything held), ``streams`` concurrent answers."""

    output_tokens_per_s: float = Field(gt=0)
    tokens_in_flight: int = Field(gt=0)
    streams: int = Field(gt=0)
    measured: bool = False
    """False while the figures are the seed's assumptions rather than a load test's."""


class EngineConfig(Record):
    """Engine settings that matter to the platform; ``extra_args`` pass through to the engine."""

    max_model_len: int = Field(default=8192, ge=256)
    """Longest prompt plus output, in tokens."""
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    enable_prefix_caching: bool = True
    max_num_seqs: int = Field(default=256, ge=1)
    extra_args: tuple[str, ...] = ()


class Version(Record):
    """One immutable model version (seed table ``model_versions``)."""

    model: Name
    version: VersionName
    weights_uri: Annotated[str, StringConstraints(pattern=r"^(s3|gs|file|hf)://\S+$")]
    weights_hash: Sha256
    tokenizer_hash: Sha256
    chat_template_hash: Sha256
    precision: Literal["fp16", "int8", "4bit"]
    gpu_type: str = "a100-80gb"
    gpus_per_replica: int = Field(ge=1, le=16)
    engine: Literal["vllm", "sglang"] = "vllm"
    engine_config: EngineConfig = EngineConfig()
    architecture: Architecture
    capacity: Capacity
    status: Literal["registered", "shadow", "canary", "live", "retired"] = "registered"

    @property
    def key(self) -> str:
        """``model@version``, the name of the version's Envoy cluster."""
        return f"{self.model}@{self.version}"

    def model_post_init(self, context: Any, /) -> None:
        if self.gpu_type not in GPU_TYPES:
            known = ", ".join(sorted(GPU_TYPES))
            raise ValueError(f"unknown gpu_type {self.gpu_type!r} (known: {known})")


class Pool(Record):
    """Replicas of one version in one region (seed table ``pools``)."""

    model: Name
    version: VersionName
    region: Name
    min_replicas: int = Field(ge=0)
    max_replicas: int = Field(ge=1)

    @property
    def key(self) -> str:
        """``model@version``."""
        return f"{self.model}@{self.version}"


class TeamLimit(Record):
    """One team's limits on one model (seed table ``team_limits``)."""

    model: Name
    tokens_per_minute: int = Field(gt=0)
    max_concurrency: int = Field(ge=1)
    guaranteed_share: float = Field(ge=0, le=1)
    """Share (0..1) of every pool of the model guaranteed to this team."""
    tiers: tuple[Tier, ...] = TIERS


class Team(Record):
    """A product team: its key hashes (never keys) and its limits per model."""

    name: Name
    display_name: str = ""
    key_hashes: tuple[Sha256, ...] = ()
    limits: tuple[TeamLimit, ...] = ()


class LocalStack(Record):
    """What ``modelfleet up`` starts: simulated replicas per ``model@version``."""

    region: Name = "local"
    replicas: dict[str, int] = Field(default_factory=dict)
    """Replicas per ``model@version``; versions not named get one if live, canary or shadow."""
    time_scale: float = Field(default=1.0, gt=0)
    """How much faster than real time the simulated replicas run."""
    dev_keys: dict[str, str] = Field(default_factory=dict)
    """Team -> key, for the local stack only: ``modelfleet up`` prints them and writes them to
    ``.modelfleet/local.json``. Each key's hash must be one of its team's ``key_hashes``."""


class PlatformConfig(Record):
    """The whole declared config, assembled from every ``config/*.yaml``."""

    regions: tuple[Name, ...] = ()
    models: tuple[Model, ...] = ()
    versions: tuple[Version, ...] = ()
    pools: tuple[Pool, ...] = ()
    teams: tuple[Team, ...] = ()
    local: LocalStack = LocalStack()
    autoscaling: AutoscalePolicy = AutoscalePolicy()
    """The ``autoscaling:`` section (KEDA, the local loop and the simulator); seed defaults."""
    rollout: RolloutSettings = RolloutSettings()
    """The ``rollout:`` section: guard thresholds and stages with holds; seed defaults."""

    def model(self, name: str) -> Model | None:
        """The model called ``name``, if declared."""
        return next((m for m in self.models if m.name == name), None)

    def version(self, model: str, version: str) -> Version | None:
        """The version ``model@version``, if declared."""
        return next((v for v in self.versions if v.model == model and v.version == version), None)

    def versions_of(self, model: str) -> tuple[Version, ...]:
        """Every declared version of ``model``."""
        return tuple(v for v in self.versions if v.model == model)

"""Request and answer bodies of the admin API (documented in its OpenAPI schema)."""

from __future__ import annotations

import hashlib
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from modelfleet.config.schema import (
    Architecture,
    Capacity,
    EngineConfig,
    Sha256,
    Tier,
    VersionName,
)


class Body(BaseModel):
    """Unknown fields are refused: a typo must not pass as a default."""

    model_config = ConfigDict(extra="forbid")


class VersionIn(Body):
    """``POST /admin/models/{model}/versions``: a version as the seed registers it. Every field
    but ``status`` is part of what the version *is*: registering it again with any of them
    different is refused (409)."""

    version: VersionName = Field(description="The version name, e.g. `v15`.")
    weights_uri: str = Field(pattern=r"^(s3|gs|file|hf)://\S+$",
                             description="Where the weights are: `s3://`, `gs://`, `file://`, `hf://`.")
    weights_hash: Sha256 = Field(description="`sha256:` of the weights.")
    tokenizer_hash: Sha256 = Field(description="`sha256:` of the tokenizer files.")
    chat_template_hash: Sha256 | None = Field(
        default=None, description="`sha256:` of the chat template; or send `chat_template`.")
    chat_template: str | None = Field(
        default=None, description="The chat template text; the control plane stores its hash.")
    precision: Literal["fp16", "int8", "4bit"]
    gpu_type: str = Field(default="a100-80gb", description="A known GPU type (see docs/config.md).")
    gpus_per_replica: int = Field(ge=1, le=16, description="Tensor parallelism, GPUs.")
    engine: Literal["vllm", "sglang"] = "vllm"
    engine_config: EngineConfig = EngineConfig()
    architecture: Architecture
    capacity: Capacity = Field(description="Capacity per replica; `measured: false` until the gate's "
                                           "load test replaces the assumption.")

    @model_validator(mode="after")
    def _one_template(self) -> VersionIn:
        if (self.chat_template is None) == (self.chat_template_hash is None):
            raise ValueError("give exactly one of chat_template_hash and chat_template")
        return self

    def template_hash(self) -> str:
        """The chat template's hash, computed from the text when the text was sent."""
        if self.chat_template_hash is not None:
            return self.chat_template_hash
        assert self.chat_template is not None
        return "sha256:" + hashlib.sha256(self.chat_template.encode()).hexdigest()


class RolloutIn(Body):
    """``PUT /admin/models/{model}/rollout``: put a version at a stage. ``percent`` is the share
    of conversations pinned to the canary, or of requests copied to the shadow (answers
    discarded). Percent 0 takes the version out of that stage: a rollback is one such call."""

    version: VersionName
    stage: Literal["shadow", "canary"]
    percent: float = Field(ge=0, le=100, description="0..100; 0 ends the stage.")


class AliasIn(Body):
    """``PUT /admin/models/{model}/alias``: point the model name at a version (promote, or roll
    back to a version still loaded)."""

    version: VersionName


class LimitIn(Body):
    """``PUT /admin/teams/{team}/limits``: one team's limits on one model."""

    model: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")
    tokens_per_minute: int = Field(gt=0, description="Prompt plus output tokens per minute.")
    max_concurrency: int = Field(ge=1, description="Requests in flight at once.")
    guaranteed_share: float = Field(ge=0, le=1, description="Share 0..1 of every pool of the model.")
    tiers: tuple[Tier, ...] | None = Field(
        default=None, description="Tiers the team may use; default: unchanged (all for a new limit).")


class RolloutStartIn(Body):
    """``POST /admin/models/{model}/rollouts``: hand a registered version to the rollout
    controller (shadow -> canary 1% -> 10% -> 50% -> alias, the guard judging every stage)."""

    version: VersionName
    hold_s: float | None = Field(default=None, gt=0, description="Seconds each stage is held "
                                 "(default: the control plane's policy).")
    window_s: float | None = Field(default=None, gt=0, description="Guard window, seconds.")
    min_requests: int | None = Field(default=None, ge=1,
                                     description="Finished requests each side needs per window.")


class Problem(BaseModel):
    """One reason a change was refused (the same shape as ``modelfleet validate --json``)."""

    file: str
    path: str
    line: int | None
    severity: Literal["error", "warning"]
    message: str


class Refusal(BaseModel):
    """A 422 answer: nothing changed, the previous state keeps serving."""

    message: str
    problems: list[Problem]


class RefusalBody(BaseModel):
    """``{"detail": {"message", "problems"}}``."""

    detail: Refusal


class Difference(BaseModel):
    """One field in which a re-registration differs from the registered version."""

    field: str
    registered: Any
    given: Any


class ConflictBody(BaseModel):
    """A 409 answer: the version is registered with other identity fields."""

    detail: dict[str, Any] = Field(description="`{message, differences: [{field, registered, given}]}`")


class RouteOut(BaseModel):
    """Where a model's traffic goes after the change."""

    model: str
    live: str
    canary: dict[str, Any] | None
    shadow: dict[str, Any] | None
    snapshot_version: str
    changed: bool = Field(description="True when Envoy's resources changed (a new xDS snapshot).")
    router_state_version: int | None = Field(
        default=None, description="The router state gateways are given, after the change.")
    warnings: list[Problem] = []


class VersionOut(BaseModel):
    """A registered version."""

    model: str
    version: str
    created: bool = Field(description="False when this exact record was registered before.")
    record_hash: str
    status: str
    snapshot_version: str


class LimitOut(BaseModel):
    """A team's limit after the change."""

    team: str
    limit: dict[str, Any]
    snapshot_version: str
    changed: bool


class LoadTestIn(Body):
    """The gate's load test result per replica: the highest output tokens/s meeting the
    targets (p95 TTFT under 1 s, streams at 30 tokens/s) and the load at that point."""

    output_tokens_per_s: float = Field(gt=0)
    tokens_in_flight: int = Field(gt=0)
    streams: int = Field(gt=0)


class GateIn(Body):
    """``PUT /admin/models/{model}/versions/{version}/gate``: the gate's results, saved with the
    version in the registry (its identity never changes; these are facts about it)."""

    eval_report: dict[str, Any] | None = Field(default=None, description="Scores per category.")
    eval_report_uri: str | None = None
    load_test: LoadTestIn | None = None

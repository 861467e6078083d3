"""Records of the registry (:mod:`envoy_control.registry.store`) as plain data: a version's identity and
its hash, the conflict of a changed version, and the rows that mirror the served desired state."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from typing import Any

from envoy_control.registry.tables import IDENTITY_FIELDS

from modelfleet.config import PlatformConfig, Version


class VersionConflict(Exception):
    """``model@version`` is registered with other identity fields; ``differences`` lists
    ``(field, registered, given)``."""

    def __init__(self, key: str, differences: list[tuple[str, Any, Any]]) -> None:
        self.key, self.differences = key, differences
        fields = ", ".join(f for f, _, _ in differences)
        super().__init__(f"{key} is registered and never changes; this record differs in {fields}:"
                         " register a new version instead")


def identity(version: Version) -> dict[str, Any]:
    """The identity fields of ``version`` as plain data."""
    data = version.model_dump(mode="json")
    return {f: data[f] for f in IDENTITY_FIELDS}


def record_hash(ident: dict[str, Any]) -> str:
    """``sha256:`` of the canonical JSON of an identity (sorted keys, no spaces)."""
    text = json.dumps(ident, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def at_utc(now_s: float) -> datetime:
    """The aware UTC datetime of ``now_s`` (Unix seconds)."""
    return datetime.fromtimestamp(now_s, UTC)


def served_rows(served: PlatformConfig, released: dict[tuple[str, str, str], Any],
                at: datetime) -> list[tuple[str, list[dict[str, Any]]]]:
    """The rows of the ``models``, ``pools``, ``teams`` and ``team_limits`` tables (by table
    name, in insertion order) that mirror ``served``; ``released`` keeps each pool's
    ``released_at`` by ``(model, version, region)``, ``at`` is the models' ``updated_at``."""
    rows = [{"model": m.name, "live_version": m.live,
             "canary_version": m.canary.version if m.canary else None,
             "canary_percent": m.canary.percent if m.canary else 0.0,
             "shadow_version": m.shadow.version if m.shadow else None,
             "shadow_fraction": m.shadow.fraction if m.shadow else 0.0,
             "task": m.task, "max_output_tokens": m.max_output_tokens,
             "updated_at": at} for m in served.models]
    return [
        ("models", rows),
        ("pools", [
            {"model": p.model, "version": p.version, "region": p.region,
             "min_replicas": p.min_replicas, "max_replicas": p.max_replicas,
             "released_at": released.get((p.model, p.version, p.region))}
            for p in served.pools]),
        ("teams", [{"team": x.name, "name": x.display_name or x.name} for x in served.teams]),
        ("team_limits", [
            {"team": x.name, "model": lim.model, "tokens_per_minute": lim.tokens_per_minute,
             "max_concurrency": lim.max_concurrency,
             "guaranteed_share": lim.guaranteed_share, "tiers": list(lim.tiers)}
            for x in served.teams for lim in x.limits]),
    ]

"""Admin requests turned into overrides (pure): the rollout, alias, limit, version and status
changes of the admin API and the rollout controller.

Each function reads the served config (``served``: the config directory with the overrides
in effect) and the config directory alone (``declared``: each override's ``base``), and
returns the overrides to put. A version has one stage at a time: putting it at ``canary``
removes it from ``shadow`` and the other way round; pointing the alias at it removes both.
Percent 0 takes the version out of that stage (a rollback is one such weight change).
"""

from __future__ import annotations

from typing import Any, Literal

from envoy_control.state.overrides import Kind, Override, config_value

from modelfleet.config import Canary, PlatformConfig, Shadow, TeamLimit, Version

Stage = Literal["shadow", "canary"]


def _override(declared: PlatformConfig, kind: Kind, target: str, value: Any, source: str,
              reason: str, at: float) -> Override:
    return Override(kind, target, value, config_value(declared, kind, target), source, reason, at)


def rollout_changes(served: PlatformConfig, declared: PlatformConfig, model: str, version: str,
                    stage: Stage, percent: float, *, source: str, reason: str = "",
                    at: float = 0.0) -> list[Override]:
    """Put ``model@version`` at ``stage`` for ``percent`` (0..100) of traffic: the canary share
    of conversations, or the shadow copy of requests (fraction ``percent / 100``). Percent 0
    takes the version out of ``stage`` (nothing to do when it is not there)."""
    m = served.model(model)
    if m is None:
        return []
    other: Stage = "shadow" if stage == "canary" else "canary"
    current, opposite = getattr(m, stage), getattr(m, other)
    out: list[Override] = []
    if percent <= 0:
        if current is not None and current.version == version:
            out.append(_override(declared, stage, model, None, source, reason, at))
        return out
    value = (Canary(version=version, percent=percent) if stage == "canary"
             else Shadow(version=version, fraction=percent / 100.0)).model_dump()
    out.append(_override(declared, stage, model, value, source, reason, at))
    if opposite is not None and opposite.version == version:
        out.append(_override(declared, other, model, None, source, reason, at))
    return out


def alias_changes(served: PlatformConfig, declared: PlatformConfig, model: str, version: str,
                  *, source: str, reason: str = "", at: float = 0.0) -> list[Override]:
    """Point ``model``'s alias at ``version`` (promote, or roll back to a version still
    loaded); a canary or shadow of that version ends, since it now takes all the traffic."""
    m = served.model(model)
    if m is None:
        return []
    out = [_override(declared, "live", model, version, source, reason, at)]
    for stage in ("canary", "shadow"):
        target = getattr(m, stage)
        if target is not None and target.version == version:
            out.append(_override(declared, stage, model, None, source, reason, at))
    return out


def limit_changes(declared: PlatformConfig, team: str, limit: TeamLimit, *, source: str,
                  reason: str = "", at: float = 0.0) -> list[Override]:
    """Set ``team``'s limits on ``limit.model`` (tokens per minute, concurrency, share)."""
    value = limit.model_dump(mode="json")
    return [_override(declared, "limit", f"{team}/{limit.model}", value, source, reason, at)]


def version_changes(declared: PlatformConfig, version: Version, *, source: str,
                    reason: str = "", at: float = 0.0) -> list[Override]:
    """Serve a newly registered ``version`` (not in the config directory yet): its cluster
    exists, with no traffic until a rollout stage names it."""
    if declared.version(version.model, version.version) is not None:
        return []
    value = version.model_dump(mode="json")
    return [_override(declared, "version", version.key, value, source, reason, at)]


def status_changes(declared: PlatformConfig, key: str, status: str, *, source: str,
                   reason: str = "", at: float = 0.0) -> list[Override]:
    """Set the status of ``model@version`` (``retired`` releases its pool: no cluster, no
    replica routed)."""
    return [_override(declared, "status", key, status, source, reason, at)]

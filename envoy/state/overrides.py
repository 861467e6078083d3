"""The admin override layer (pure): changes made through the admin API or by the rollout
controller, held on top of the config directory.

Precedence: the control plane serves ``apply(config, overrides)``. An override holds until the
config *acknowledges* it (the config now says the same) or the config *changes that field*
(a newer reviewed change wins); either way it is dropped at the next reload. Each override
remembers the config's value when it was made (``base``) to tell the two apart from a field
the config left alone. Overrides are keyed by ``(kind, target)``:

| kind | target | value |
|---|---|---|
| ``live`` | model | the alias: a version name |
| ``canary`` | model | ``{version, percent}`` or None (no canary) |
| ``shadow`` | model | ``{version, fraction}`` or None (no shadow) |
| ``limit`` | ``team/model`` | a ``TeamLimit`` as data |
| ``version`` | ``model@version`` | a ``Version`` as data (registered, not yet declared) |
| ``status`` | ``model@version`` | a version status (``retired`` when its pool is released) |
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal, get_args

from modelfleet.config import Canary, PlatformConfig, Shadow, TeamLimit, Version

Kind = Literal["live", "canary", "shadow", "limit", "version", "status"]
KINDS: tuple[Kind, ...] = get_args(Kind)


@dataclass(frozen=True)
class Override:
    """One change held over the config: ``value`` replaces the config's ``base`` (plain data).
    ``source`` is who made it (``admin:<name>`` or ``controller``), ``at`` Unix seconds."""

    kind: Kind
    target: str
    value: Any
    base: Any
    source: str
    reason: str = ""
    at: float = 0.0

    @property
    def key(self) -> tuple[str, str]:
        """``(kind, target)``: at most one override per key."""
        return (self.kind, self.target)

    def as_dict(self) -> dict[str, Any]:
        """Plain data (the registry's ``desired_overrides`` rows, ``GET /admin/desired``)."""
        return asdict(self)


def override_from_dict(data: dict[str, Any]) -> Override:
    """The inverse of :meth:`Override.as_dict`; raises ValueError on an unknown kind."""
    kind = data.get("kind")
    if kind not in KINDS:
        raise ValueError(f"unknown override kind {kind!r}")
    return Override(kind, str(data["target"]), data.get("value"), data.get("base"),
                    str(data.get("source") or ""), str(data.get("reason") or ""),
                    float(data.get("at") or 0.0))


def config_value(config: PlatformConfig, kind: Kind, target: str) -> Any:
    """What ``config`` says for ``(kind, target)``, in an override's plain-data form."""
    if kind in ("live", "canary", "shadow"):
        model = config.model(target)
        if model is None:
            return None
        stage = model.live if kind == "live" else getattr(model, kind)
        return stage if stage is None or isinstance(stage, str) else stage.model_dump()
    if kind == "limit":
        team_name, _, model_name = target.partition("/")
        team = next((t for t in config.teams if t.name == team_name), None)
        limit = next((x for x in team.limits if x.model == model_name), None) if team else None
        return limit.model_dump(mode="json") if limit else None
    name, _, version = target.partition("@")
    declared = config.version(name, version)
    if declared is None:
        return None
    return declared.model_dump(mode="json") if kind == "version" else declared.status


def _models(config: PlatformConfig, overrides: Sequence[Override]) -> PlatformConfig:
    models = []
    for m in config.models:
        update: dict[str, Any] = {}
        for o in overrides:
            if o.target != m.name or o.kind not in ("live", "canary", "shadow"):
                continue
            if o.kind == "live":
                update["live"] = o.value
            elif o.kind == "canary":
                update["canary"] = None if o.value is None else Canary.model_validate(o.value)
            else:
                update["shadow"] = None if o.value is None else Shadow.model_validate(o.value)
        models.append(m.model_copy(update=update) if update else m)
    return config.model_copy(update={"models": tuple(models)})


def _teams(config: PlatformConfig, overrides: Sequence[Override]) -> PlatformConfig:
    teams = []
    for t in config.teams:
        limits = list(t.limits)
        for o in overrides:
            team, _, model = o.target.partition("/")
            if o.kind != "limit" or team != t.name:
                continue
            limits = [x for x in limits if x.model != model]
            if o.value is not None:
                limits.append(TeamLimit.model_validate(o.value))
        teams.append(t.model_copy(update={"limits": tuple(limits)}) if limits != list(t.limits) else t)
    return config.model_copy(update={"teams": tuple(teams)})


def _versions(config: PlatformConfig, overrides: Sequence[Override]) -> PlatformConfig:
    versions = list(config.versions)
    keys = {v.key for v in versions}
    for o in overrides:
        if o.kind == "version" and o.target not in keys and o.value is not None:
            versions.append(Version.model_validate(o.value))
            keys.add(o.target)
    status = {o.target: o.value for o in overrides if o.kind == "status"}
    versions = [v.model_copy(update={"status": status[v.key]}) if v.key in status else v
                for v in versions]
    return config.model_copy(update={"versions": tuple(versions)})


def apply(config: PlatformConfig, overrides: Sequence[Override]) -> PlatformConfig:
    """``config`` with every override in effect (versions first, so a route may name one)."""
    return _teams(_models(_versions(config, overrides), overrides), overrides)


def put(overrides: Sequence[Override], changes: Iterable[Override]) -> tuple[Override, ...]:
    """``overrides`` with ``changes`` in effect, one per key, the latest winning. A change back
    to what the config says (``value == base``) removes the key's override instead."""
    out = {o.key: o for o in overrides}
    for c in changes:
        out.pop(c.key, None)
        if c.value != c.base:
            out[c.key] = c
    return tuple(out.values())


def rebase(overrides: Sequence[Override], config: PlatformConfig
           ) -> tuple[tuple[Override, ...], list[tuple[Override, str]]]:
    """After a reload: the overrides that still hold over ``config``, and those dropped with
    why (``acknowledged``: the config says the same; ``config changed``: the config moved
    that field since the override was made, and the reviewed change wins)."""
    kept: list[Override] = []
    dropped: list[tuple[Override, str]] = []
    for o in overrides:
        now = config_value(config, o.kind, o.target)
        if o.kind == "version" and now is not None:
            dropped.append((o, "acknowledged"))  # declared: the registry proved it identical
        elif now == o.value:
            dropped.append((o, "acknowledged"))
        elif now != o.base:
            dropped.append((o, "config changed"))
        else:
            kept.append(o)
    return tuple(kept), dropped


def stamped(o: Override, source: str, reason: str, at: float) -> Override:
    """``o`` with who made it, why and when (Unix seconds)."""
    return replace(o, source=source, reason=reason, at=at)

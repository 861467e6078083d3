"""The control plane's desired state: the config directory plus the override layer, checked.

``declared`` is the config directory as last loaded, ``overrides`` the admin and controller
changes held over it (:mod:`envoy_control.state.overrides`), ``served`` the two combined: what every
Envoy and gateway is given. A proposed change is applied to a copy and run through the same
cross-checks as ``modelfleet validate`` (:func:`modelfleet.config.checks.cross_check`);
any error refuses it and nothing changes.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from envoy_control.state.overrides import Override, apply, put, rebase

from modelfleet.config import ConfigError, PlatformConfig, Problem
from modelfleet.config.checks import cross_check
from modelfleet.config.problems import ItemOrigin, Origins

log = logging.getLogger(__name__)

ORIGIN = "desired state"
"""The ``file`` of problems found in a proposed change (it has no YAML file or line)."""


class DesiredStore(Protocol):
    """Where the desired state is kept between starts (the registry,
    :class:`envoy_control.registry.store.Registry`)."""

    def conflicts(self, config: PlatformConfig, origins: Origins) -> list[Problem]:
        """Problems for declared versions that differ from their registered record."""
        ...

    def saved_overrides(self) -> list[Override]:
        """The overrides held when the state was last saved."""
        ...

    def sync(self, served: PlatformConfig, overrides: Sequence[Override], by: str,
             now_s: float) -> None:
        """Save the served state and its overrides (``now_s``: Unix seconds)."""
        ...


def synthetic_origins(config: PlatformConfig, where: str = ORIGIN) -> Origins:
    """Origins that name each item instead of a file position: ``models[chat-7b]``,
    ``versions[chat-7b@v14]``, ``teams[search]``, ``pools[chat-7b@v13/us-east-1]``."""
    names = {
        "models": [m.name for m in config.models],
        "versions": [v.key for v in config.versions],
        "pools": [f"{p.key}/{p.region}" for p in config.pools],
        "teams": [t.name for t in config.teams],
        "regions": list(config.regions),
    }
    items = {s: [ItemOrigin(where, f"{s}[{n}]") for n in ns] for s, ns in names.items()}
    items["local"] = [ItemOrigin(where, "local")]
    return Origins(items)


def check(config: PlatformConfig) -> list[Problem]:
    """Every cross-check finding of ``config`` (errors and warnings), located by item name."""
    return cross_check(config, synthetic_origins(config))


@dataclass(frozen=True)
class Desired:
    """One consistent desired state: the config directory, the overrides, their result."""

    declared: PlatformConfig
    overrides: tuple[Override, ...]
    served: PlatformConfig

    @classmethod
    def of(cls, declared: PlatformConfig, overrides: Sequence[Override] = ()) -> Desired:
        """``declared`` with ``overrides`` applied (not checked)."""
        return cls(declared, tuple(overrides), apply(declared, overrides))

    def propose(self, changes: Sequence[Override]) -> Desired:
        """This state with ``changes`` put; raises :class:`ConfigError` (every error and
        warning of the result) when the result fails a cross-check."""
        candidate = Desired.of(self.declared, put(self.overrides, changes))
        problems = check(candidate.served)
        if any(p.severity == "error" for p in problems):
            raise ConfigError(problems)
        return candidate

    def rebased(self, declared: PlatformConfig) -> tuple[Desired, list[tuple[Override, str]]]:
        """After the config directory changed: the overrides that still hold over
        ``declared`` (see :func:`envoy_control.state.overrides.rebase`), each kept only if the
        result still passes the cross-checks; returns the state and what was dropped, why."""
        kept, dropped = rebase(self.overrides, declared)
        state = Desired.of(declared)
        for o in kept:
            candidate = Desired.of(declared, (*state.overrides, o))
            errors = [p for p in check(candidate.served) if p.severity == "error"]
            if errors:
                dropped.append((o, f"no longer fits the config: {errors[0].message}"))
                continue
            state = candidate
        for o, why in dropped:
            log.info("override %s %s (%s by %s) dropped: %s", o.kind, o.target, o.value,
                     o.source, why)
        return state, dropped

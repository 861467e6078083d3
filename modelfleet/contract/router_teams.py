"""Team limits in the router state (standard library only, like :mod:`modelfleet.contract.router_state`,
which re-exports these names).

The control plane publishes every team's effective limits (the config with the admin overrides
in effect) so that each gateway_ext process decides on them without a restart. JSON shape, under
the state's ``teams`` key::

    {"search": {"chat-7b": {"tokens_per_minute": 6000000, "max_concurrency": 500,
                            "guaranteed_share": 0.5, "tiers": ["interactive", "standard"]}}}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


class TeamsError(ValueError):
    """The ``teams`` JSON is not what this reader understands (the message locates it)."""


@dataclass(frozen=True)
class TeamLimitRoute:
    """One team's effective limits on one model (config + admin overrides): tokens per minute,
    open requests, guaranteed share of the pool (0..1), allowed tiers."""

    model: str
    tokens_per_minute: int
    max_concurrency: int
    guaranteed_share: float
    tiers: tuple[str, ...]


@dataclass(frozen=True)
class TeamRoute:
    """A team's effective limits, one per model it may use (none: no model)."""

    team: str
    limits: tuple[TeamLimitRoute, ...] = ()


def teams_json(teams: Sequence[TeamRoute]) -> dict[str, Any]:
    """The JSON object of ``teams`` (see the module docstring)."""
    return {t.team: {lim.model: {"tokens_per_minute": lim.tokens_per_minute,
                                 "max_concurrency": lim.max_concurrency,
                                 "guaranteed_share": lim.guaranteed_share,
                                 "tiers": list(lim.tiers)} for lim in t.limits}
            for t in teams}


def _field(d: Mapping[str, Any], key: str, kinds: tuple[type, ...], where: str) -> Any:
    value = d.get(key)
    if not isinstance(value, kinds) or isinstance(value, bool):
        raise TeamsError(f"{where}.{key}: expected {'/'.join(k.__name__ for k in kinds)}, "
                         f"got {value!r}")
    return value


def parse_teams(data: Any) -> tuple[TeamRoute, ...] | None:
    """The teams of a state's ``teams`` value; None when absent (an older control plane's
    state: the gateway keeps its own config's limits). Raises :class:`TeamsError`."""
    if data is None:
        return None
    if not isinstance(data, Mapping):
        raise TeamsError("state.teams: expected an object")
    teams = []
    for team, limits in sorted(data.items()):
        if not isinstance(limits, Mapping):
            raise TeamsError(f"teams[{team}]: expected an object")
        out = []
        for model, d in sorted(limits.items()):
            where = f"teams[{team}][{model}]"
            if not isinstance(d, Mapping):
                raise TeamsError(f"{where}: expected an object")
            tiers = _field(d, "tiers", (list,), where)
            if not all(isinstance(x, str) for x in tiers):
                raise TeamsError(f"{where}.tiers: expected strings")
            out.append(TeamLimitRoute(
                model=model,
                tokens_per_minute=_field(d, "tokens_per_minute", (int,), where),
                max_concurrency=_field(d, "max_concurrency", (int,), where),
                guaranteed_share=float(_field(d, "guaranteed_share", (int, float), where)),
                tiers=tuple(tiers)))
        teams.append(TeamRoute(team, tuple(out)))
    return tuple(teams)

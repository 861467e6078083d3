"""Team limits from the control plane's router state, over the gateway's config (pure).

The control plane publishes every team's effective limits (the config directory with the admin
overrides in effect, e.g. ``PUT /admin/teams/{team}/limits``) in its router state
(:class:`modelfleet.contract.router_teams.TeamRoute`). The gateway keeps its own config for everything
else (key hashes, models) and takes the published limits as they are: for a team the state
names, its limits become exactly the published ones (tokens per minute, max concurrency,
guaranteed share, tiers); a team the state does not name keeps the config's. A state without
teams (``None``: an older control plane's file) changes nothing.

The token buckets take the new ``tokens_per_minute`` at the next reservation (the bucket's
level carries over, capped at the new capacity); admission reads max concurrency and the
guaranteed share per request, so both apply from the next decision.
"""

from __future__ import annotations

from collections.abc import Sequence

from modelfleet.config.schema import TIERS, PlatformConfig, TeamLimit, Tier
from modelfleet.contract.router_teams import TeamRoute


def _tiers(names: Sequence[str]) -> tuple[Tier, ...]:
    return tuple(t for t in TIERS if t in names)


def limits_of(route: TeamRoute) -> tuple[TeamLimit, ...]:
    """A published team's limits as config records (unknown tier names dropped)."""
    return tuple(
        TeamLimit(model=lim.model, tokens_per_minute=lim.tokens_per_minute,
                  max_concurrency=lim.max_concurrency, guaranteed_share=lim.guaranteed_share,
                  tiers=_tiers(lim.tiers))
        for lim in route.limits)


def with_team_limits(config: PlatformConfig, teams: Sequence[TeamRoute] | None
                     ) -> PlatformConfig:
    """``config`` with each published team's limits in place of its own; ``config`` itself
    (the same object) when nothing changes."""
    if teams is None:
        return config
    published = {t.team: limits_of(t) for t in teams}
    changed = False
    out = []
    for team in config.teams:
        limits = published.get(team.name)
        if limits is None or sorted(limits, key=lambda x: x.model) == sorted(
                team.limits, key=lambda x: x.model):
            out.append(team)
            continue
        out.append(team.model_copy(update={"limits": limits}))
        changed = True
    return config.model_copy(update={"teams": tuple(out)}) if changed else config

"""Team limits published in the router state: their JSON, the control plane's build (config plus
admin overrides), and the gateway deciding on them without a restart (token bucket rate,
max concurrency, tiers)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from envoy_control.state.changes import limit_changes
from envoy_control.state.overrides import apply
from envoy_control.state.publish import build_router_state

from gateway_ext.decision import Admitted, Refused
from gateway_ext.limits.team_limits import with_team_limits
from gateway_ext.routing.feed import RouterFeed
from gateway_ext.runtime import build_runtime
from gateway_ext.settings import Settings
from modelfleet.config import PlatformConfig, TeamLimit
from modelfleet.contract.headers import PRIORITY_HEADER
from modelfleet.contract.router_state import parse_router_state, write_router_state
from modelfleet.contract.router_state_types import (
    ModelAlias,
    PoolRoute,
    RoutableReplica,
    RouterState,
    RouterStateError,
)
from modelfleet.contract.router_teams import TeamLimitRoute, TeamRoute

CHAT = {"model": "chat-7b", "max_tokens": 50, "messages": [{"role": "user", "content": "Hi!"}]}


def state(teams: tuple[TeamRoute, ...] | None, version: int = 3) -> RouterState:
    reps = (RoutableReplica("chat-7b@v13-0", "10.1.0.1", 9000, "local", 0, 0, 0, 0.0, True),)
    return RouterState(version, "cp-a", "3", 0.0, 1.0,
                       (PoolRoute("chat-7b", "v13", 112_000, reps),
                        PoolRoute("chat-7b", "v14", 112_000, ())),
                       (ModelAlias("chat-7b", "v13"),), teams=teams)


def search(tokens_per_minute: int, max_concurrency: int = 500,
           tiers: tuple[str, ...] = ("interactive", "standard")) -> TeamRoute:
    return TeamRoute("search", (
        TeamLimitRoute("chat-7b", tokens_per_minute, max_concurrency, 0.5, tiers),
        TeamLimitRoute("reason-70b", 300_000, 20, 0.2, ("standard",))))


def settings(tmp_path: Path, **values: Any) -> Settings:
    base = {"usage_db_url": f"sqlite:///{tmp_path / 'usage.db'}", "spool": tmp_path / "spool",
            "seed": 1, "router_state_file": None, "control_plane_url": None}
    return Settings.from_env({}, **{**base, **values})


def test_team_limits_round_trip_through_the_json_and_an_older_state_has_none() -> None:
    published = state((search(1000), TeamRoute("support", ())))
    data = json.loads(json.dumps(published.as_dict()))
    assert data["teams"]["search"]["chat-7b"] == {
        "tokens_per_minute": 1000, "max_concurrency": 500, "guaranteed_share": 0.5,
        "tiers": ["interactive", "standard"]}
    assert parse_router_state(data) == published
    del data["teams"]
    assert parse_router_state(data).teams is None
    data["teams"] = {"search": {"chat-7b": {"tokens_per_minute": "lots", "max_concurrency": 1,
                                            "guaranteed_share": 0.5, "tiers": []}}}
    with pytest.raises(RouterStateError, match=r"teams\[search\]\[chat-7b\].tokens_per_minute"):
        parse_router_state(data)


def test_the_control_plane_publishes_the_effective_limits(platform_config: PlatformConfig) -> None:
    lowered = TeamLimit(model="chat-7b", tokens_per_minute=1234, max_concurrency=7,
                        guaranteed_share=0.25, tiers=("standard",))
    served = apply(platform_config, limit_changes(platform_config, "search", lowered,
                                                  source="admin:test"))
    teams = {t.team: t for t in build_router_state(served, {}, "1", 1.0).teams or ()}
    assert set(teams) == {t.name for t in platform_config.teams}
    assert teams["search"].limits[0] == TeamLimitRoute("chat-7b", 1234, 7, 0.25, ("standard",))
    assert teams["support"].limits[0].tokens_per_minute == 3_000_000  # the config's
    before = build_router_state(platform_config, {}, "1", 1.0)
    assert before.routing() != build_router_state(served, {}, "1", 1.0).routing()  # at once


def test_published_limits_replace_a_named_team_only(platform_config: PlatformConfig) -> None:
    assert with_team_limits(platform_config, None) is platform_config
    same = build_router_state(platform_config, {}, "1", 1.0).teams
    assert with_team_limits(platform_config, same) is platform_config
    changed = with_team_limits(platform_config, (search(1000),))
    by_name = {t.name: t for t in changed.teams}
    assert by_name["search"].limits[0].tokens_per_minute == 1000
    assert by_name["search"].key_hashes == platform_config.teams[0].key_hashes
    assert by_name["support"] == next(t for t in platform_config.teams if t.name == "support")


def test_a_gateway_decides_on_the_published_limits(
        tmp_path: Path, platform_config: PlatformConfig, dev_keys: dict[str, str]) -> None:
    write_router_state(tmp_path / "state.json", state((search(6_000_000),)))
    runtime = build_runtime(settings(tmp_path, router_state_file=tmp_path / "state.json"),
                            platform_config, clock=lambda: 100.0)
    feed = RouterFeed(runtime.router, runtime.lifecycle, None, state_file=tmp_path / "state.json")
    core = runtime.lifecycle.core
    headers = {"authorization": f"Bearer {dev_keys['search']}", PRIORITY_HEADER: "interactive"}

    def decide(request_id: str, now: float = 100.0) -> Admitted | Refused:
        return core.decide(headers, json.dumps(CHAT).encode(), now, request_id)

    assert isinstance(decide("r1"), Admitted)
    feed._apply(state((search(40),), 4), "control-plane")  # below one request's reservation
    too_large = decide("r2")
    assert isinstance(too_large, Refused) and too_large.error.status == 400
    assert "at most 40 tokens per minute" in too_large.error.message
    feed._apply(state((search(100),), 5), "control-plane")  # room for one request, then 429
    assert isinstance(decide("r3"), Admitted)
    denied = decide("r4")
    assert isinstance(denied, Refused) and denied.error.status == 429
    feed._apply(state((search(6_000_000, tiers=("standard",)),), 6), "control-plane")
    tier = decide("r5", 101.0)
    assert isinstance(tier, Refused) and tier.error.status == 403
    feed._apply(state((search(6_000_000, max_concurrency=3),), 7), "control-plane")
    admitted = decide("r6", 101.0)  # 1 s refills 100,000 tokens; r1 and r3 are still open
    assert isinstance(admitted, Admitted)
    second = decide("r7", 101.0)
    assert isinstance(second, Refused) and second.error.status == 429
    assert "max_concurrency" in second.error.message
    assert runtime.router.state is not None and runtime.router.state.state_version == 7

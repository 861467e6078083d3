"""Router state: building, publishing (versions, load throttling, long polls), the file, the
gateway-side reader and poller."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from envoy_control.state.beats import BeatRules, record_beat, replica_of
from envoy_control.state.pool_state import pool_states
from envoy_control.state.publish import RouterPublisher, build_router_state
from envoy_control.state.replicas import Replica

from gateway_ext.routing.poller import RouterStatePoller, is_newer
from modelfleet.config import PlatformConfig
from modelfleet.contract.heartbeat import Heartbeat
from modelfleet.contract.router_state import (
    load_router_state,
    parse_router_state,
    write_router_state,
)
from modelfleet.contract.router_state_types import RouterState, RouterStateError

if TYPE_CHECKING:
    from tests.envoy_control.conftest import FakeClock

RULES = BeatRules()


def _state(config: PlatformConfig, tokens: int = 1000, extra: bool = False) -> RouterState:
    """chat-7b@v13 with a beating replica (``tokens`` in flight) and a registered one."""
    beat = Heartbeat(
        "hb-0", "chat-7b", "v13", "127.0.0.1", 9100, "local", "serving", tokens, 1, 2, 0.5, 0, 0
    )
    replicas = [replica_of(beat), Replica("put-0", "chat-7b", "v13", "::1", 9101)]
    if extra:
        replicas.append(Replica("put-1", "chat-7b", "v14", "127.0.0.1", 9102))
    served = {"chat-7b@v13", "chat-7b@v14", "reason-70b@v1"}
    pools = pool_states(replicas, {"hb-0": record_beat(None, beat, 0.0, RULES)}, served, 0.0, RULES)
    return build_router_state(config, pools, "3", RULES.interval_s)


def test_router_state_lists_routable_replicas_and_aliases(example_config: PlatformConfig) -> None:
    state = _state(example_config)
    assert [p.key for p in state.pools] == ["chat-7b@v13", "chat-7b@v14", "reason-70b@v1"]
    v13 = state.pool("chat-7b@v13")
    assert v13 is not None and v13.replica_capacity_tokens == 112_000
    assert [(r.replica_id, r.address, r.beating) for r in v13.replicas] == [
        ("hb-0", "127.0.0.1:9100", True),
        ("put-0", "[::1]:9101", False),
    ]
    assert v13.tokens_in_flight == 1000 and v13.queue_depth == 1
    alias = state.alias("chat-7b")
    assert alias is not None and (alias.live, alias.canary, alias.canary_percent) == (
        "v13",
        "v14",
        10.0,
    )
    data = json.loads(json.dumps(state.as_dict()))
    assert set(data) == {
        "format",
        "state_version",
        "instance_id",
        "snapshot_version",
        "published_at",
        "beat_interval_s",
        "pools",
        "aliases",
        "teams",
    }
    assert data["pools"]["chat-7b@v13"]["replicas"][0]["address"] == "127.0.0.1:9100"
    assert parse_router_state(data) == state  # the reader gives back what was published


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(format=2), "format"),
        (lambda d: d.update(pools=[]), "state.pools"),
        (lambda d: d["pools"]["chat-7b@v13"]["replicas"][0].update(port="80"), "replicas[0].port"),
        (lambda d: d["aliases"]["chat-7b"].pop("live"), "aliases[chat-7b].live"),
        (lambda d: d.update(state_version=True), "state_version"),
    ],
)
def test_reader_refuses_bad_shapes(
    example_config: PlatformConfig, change: Any, message: str
) -> None:
    data = _state(example_config).as_dict()
    change(data)
    with pytest.raises(RouterStateError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_router_state(data)


def test_state_file_round_trip(example_config: PlatformConfig, tmp_path: Path) -> None:
    path = tmp_path / "sub" / "router-state.json"
    assert load_router_state(path) is None
    state = replace(_state(example_config), state_version=5, instance_id="abc")
    write_router_state(path, state)
    assert load_router_state(path) == state
    assert [p.name for p in path.parent.iterdir()] == ["router-state.json"]  # no temp left
    path.write_text("{torn")
    with pytest.raises(RouterStateError, match="not JSON"):
        load_router_state(path)


def test_publisher_versions_routing_at_once_and_loads_once_a_second(
    example_config: PlatformConfig, clock: FakeClock
) -> None:
    pub = RouterPublisher(clock=clock, wall_clock=lambda: 1.7e9, instance_id="i-1")
    assert pub.offer(_state(example_config)) and pub.current is not None
    first = pub.current
    assert (first.state_version, first.instance_id, first.published_at) == (1, "i-1", 1.7e9)
    assert not pub.offer(_state(example_config))  # same content: no new version
    assert not pub.offer(_state(example_config, tokens=2000))  # load only, < 1 s later
    assert pub.offer(_state(example_config, extra=True))  # routing change: at once
    assert pub.current.state_version == 2
    clock.advance(0.5)
    assert not pub.offer(_state(example_config, tokens=2000, extra=True))
    clock.advance(0.5)
    assert pub.offer(_state(example_config, tokens=2000, extra=True))  # 1 s since: published
    assert pub.current.state_version == 3
    assert RouterPublisher(first_version=41).instance_id != pub.instance_id


async def test_wait_past_returns_on_publication_or_timeout(example_config: PlatformConfig) -> None:
    pub = RouterPublisher()
    pub.offer(_state(example_config))
    assert (await pub.wait_past(None, 5.0)) is pub.current
    assert (await pub.wait_past(99, 5.0)) is pub.current  # a client of an earlier instance
    waiting = asyncio.create_task(pub.wait_past(1, 5.0))
    while pub.waiting == 0:
        await asyncio.sleep(0)
    pub.offer(_state(example_config, extra=True))
    got = await asyncio.wait_for(waiting, 1.0)
    assert got is not None and got.state_version == 2 and pub.waiting == 0
    same = await pub.wait_past(2, 0.01)
    assert same is not None and same.state_version == 2


async def test_save_writes_only_new_versions(
    example_config: PlatformConfig, tmp_path: Path
) -> None:
    pub, path = RouterPublisher(), tmp_path / "state.json"
    assert not await pub.save(path)  # nothing published yet
    pub.offer(_state(example_config))
    assert await pub.save(path) and not await pub.save(path)
    pub.offer(_state(example_config, extra=True))
    assert await pub.save(path)
    saved = load_router_state(path)
    assert saved is not None and saved.state_version == 2


async def test_poller_keeps_the_last_state_through_errors(
    example_config: PlatformConfig, clock: FakeClock
) -> None:
    v1 = replace(_state(example_config), state_version=1, instance_id="a")
    v2 = replace(_state(example_config, extra=True), state_version=2, instance_id="a")
    restarted = replace(v1, state_version=1, instance_id="b")
    answers: list[Any] = [
        v2.as_dict(),
        OSError("connection refused"),
        v1.as_dict(),
        restarted.as_dict(),
    ]
    asked: list[tuple[int | None, float]] = []

    async def fetch(after: int | None, wait_s: float) -> Any:
        asked.append((after, wait_s))
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    seen: list[int] = []
    poller = RouterStatePoller(
        fetch, initial=v1, clock=clock, on_change=lambda s: seen.append(s.state_version)
    )
    assert poller.staleness_s() is None
    assert await poller.poll_once() and poller.state == v2
    clock.advance(2.0)
    assert not await poller.poll_once() and poller.state == v2  # control plane down: keep v2
    assert poller.last_error is not None and poller.staleness_s() == 2.0
    assert not await poller.poll_once() and poller.state == v2  # an older version: ignored
    assert await poller.poll_once() and poller.state == restarted  # another instance: taken
    assert asked == [(1, 1.0), (2, 1.0), (2, 1.0), (2, 1.0)] and seen == [2, 1]
    assert is_newer(None, v1) and not is_newer(v2, v1)

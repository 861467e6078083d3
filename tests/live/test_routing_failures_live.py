"""Failures through `modelfleet up`: the control plane killed under load for 60 s (Envoy and the
gateway keep serving from their last state, a gateway started meanwhile starts from the state
file; it comes back from its state file, everything resyncs and a config change made after it
reaches the gateway and Envoy), and a replica lost mid-run, by an engine failure (explicit error
events) and by SIGKILL (transport cut), in both cases requests that had not started streaming are
retried on another replica."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from modelfleet.contract.metrics import REPLICA_REQUESTS
from modelfleet.local.harness import RunningStack, assert_all_stopped, start_stack

if TYPE_CHECKING:
    import tests.live.outage_support as os_
    import tests.live.routing_support as rs
else:  # pytest puts tests/live on sys.path
    import outage_support as os_
    import routing_support as rs

pytestmark = pytest.mark.live

REPLICAS = {"chat-7b@v13": 3, "chat-7b@v14": 1, "reason-70b@v1": 1}
OUTAGE_S = 60.0
"""How long the control plane stays dead: `modelfleet up` restarts it after this delay."""


@pytest.fixture(scope="module")
def failing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    """3 x chat-7b@v13 and the canary, 50x; a dead control plane is restarted after 60 s."""
    cwd = tmp_path_factory.mktemp("failures")
    config = rs.routing_config(cwd / "config", REPLICAS, 50.0)
    running = start_stack(cwd, config, "--debug", "--control-plane-restart-delay",
                          str(OUTAGE_S))
    try:
        rs.wait_for(lambda: len(rs.routable(running)) == 3, 10, "3 routable v13 replicas")
        yield running
    finally:
        assert running.stop(signal.SIGINT) == 0, running.log.read_text()
        assert_all_stopped(running)


def facts(stack: RunningStack) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((stack.cwd / ".modelfleet" / "local.json").read_text())
    return data


def cp_pid(stack: RunningStack) -> int:
    return int(next(p["pid"] for p in facts(stack)["processes"] if p["role"] == "control-plane"))


def test_control_plane_down_60_s_under_load_fails_no_request_and_resyncs(
        failing: RunningStack, request: pytest.FixtureRequest) -> None:
    old_pid, old_state = cp_pid(failing), rs.router_state(failing)
    load = os_.Load(failing, users=6, think_s=1.0).start()
    request.addfinalizer(load.stop)  # also when an assertion stops the test half-way
    time.sleep(2.0)
    os.kill(old_pid, signal.SIGKILL)
    down_at = time.monotonic()
    rs.wait_for(lambda: httpx.get(failing.gateway_url + "/health").json()["router"]
                ["control_plane_silent_s"] > 2, 10, "the gateway notices the control plane is gone")

    # a gateway process started now (a restart, a new pod) starts from the state file and serves
    second = os_.SecondGateway(failing)
    try:
        health = rs.wait_for(lambda: second.health(), 45, "a second gateway up")
        assert health["router"]["source"] == "file", health
        assert health["router"]["state_version"] >= old_state["state_version"]
        replicas = {r["address"] for p in old_state["pools"].values() for r in p["replicas"]}
        for i in range(5):
            r = second.check(failing.key(rs.KEY_TEAM), f"second-{i}")
            assert r.status_code == 200, r.text
            assert r.headers["x-route-version"].startswith("chat-7b@")
            assert set(r.headers["x-gateway-destination-endpoint"].split(",")) <= replicas
    finally:
        second.stop()

    rs.wait_for(lambda: cp_pid(failing) != old_pid, OUTAGE_S + 30, "the control plane restarted")
    down_s = time.monotonic() - down_at
    outage = load.served_between(down_at, down_at + OUTAGE_S)
    new_instance = rs.wait_for(lambda: (s := rs.router_state(failing))["instance_id"]
                               != old_state["instance_id"] and s["instance_id"], 10,
                               "the new control plane's state")
    rs.wait_for(lambda: rs.routing_view(failing)["instance_id"] == new_instance, 5,
                "the gateway follows the new control plane's state")
    rs.wait_for(lambda: sorted(rs.routable(failing)) == [f"chat-7b@v13-{i}" for i in range(3)], 5,
                "every replica routable again")
    resynced = rs.wait_for(lambda: os_.envoy_acked(failing), 10,
                           "Envoy ACKs the new control plane's snapshot")

    # a config change made after the restart reaches the gateway and Envoy
    config = Path(failing.facts["config_dir"])
    os_.drop_canary_add_shadow(config, 0.5)
    changed_at = time.monotonic()
    rs.wait_for(lambda: rs.routing_view(failing)["aliases"]["chat-7b"]["canary"] is None, 10,
                "the gateway takes the new alias (no canary)")
    seen_at = time.monotonic()
    rs.wait_for(lambda: os_.envoy_acked(failing) not in (None, resynced), 10,
                "Envoy ACKs the changed routes")
    shadow_before = rs.replica_metric(failing, "chat-7b@v14-0", REPLICA_REQUESTS,
                                      traffic="shadow")
    rs.wait_for(lambda: rs.replica_metric(failing, "chat-7b@v14-0",
                                          REPLICA_REQUESTS,
                                          traffic="shadow") > shadow_before, 15,
                "Envoy mirrors to the new shadow")
    time.sleep(1.0)
    done = load.stop()
    errors = [t.turn.error for t in done if t.turn.error]
    print(f"outage {down_s:.1f} s: {len(outage)} requests served "
          f"({sum(t.stream for t in outage)} streamed), {len(done)} in all, {len(errors)} failed")
    assert errors == [], errors[:5]
    assert down_s >= OUTAGE_S - 1
    assert len(outage) >= 100, len(outage)  # ~6 a second for the whole minute, both kinds
    assert {t.stream for t in outage} == {True, False}
    assert all(t.turn.replica_id and t.turn.model_version for t in done)
    after = [t for t in done if t.started > seen_at]
    assert after and all(t.turn.model_version == "v13" for t in after), \
        [(t.turn.model_version, t.started - changed_at) for t in after if t.turn.model_version != "v13"]


def test_a_replica_that_misses_a_beat_is_not_a_first_choice(failing: RunningStack) -> None:
    """A hung replica (SIGSTOP: its port still accepts connections, nothing answers) stays in EDS
    and in the router state until three beats are missed, but once its beat is stale the gateway
    names other replicas: conversations homed on it are served elsewhere at once."""
    ids = sorted(rs.routable(failing))
    victim = ids[0]
    pid = int(next(p["pid"] for p in failing.facts["processes"] if p.get("replica_id") == victim))

    def listed() -> dict[str, Any]:
        replicas = rs.routing_view(failing)["pools"]["chat-7b@v13"]["replicas"]
        return {r["replica_id"]: r for r in replicas}

    async def turns() -> list[rs.Turn]:
        client = rs.aclient(failing)
        return list(await asyncio.wait_for(asyncio.gather(*(
            rs.stream_turn(client, cid, [{"role": "user", "content": "are you there?"}],
                           model="chat-7b@v13")
            for cid in rs.homed_on(ids, victim, "hung", 4))), 15))

    def back() -> None:
        rs.wait_for(lambda: (v := listed()).get(victim) and not v[victim]["stale"], 15,
                    f"{victim} a first choice again")
        rs.wait_for(lambda: len(rs.routable(failing)) == 3, 10, "3 routable v13 replicas")

    # The window between "stale" (2 missed intervals) and leaving the state (3) is about a
    # second; on a loaded machine the four turns can outlast it, and then this attempt cannot
    # tell steering from removal: it is run again (at most 3 times), never counted as a pass.
    attempts = []
    for _ in range(3):
        os.kill(pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        try:
            rs.wait_for(lambda: listed()[victim]["stale"], 5, "the gateway sees a stale beat", 0.02)
            stale_s = time.monotonic() - stopped_at
            served = asyncio.run(turns())
            still_listed = victim in listed()
        finally:
            os.kill(pid, signal.SIGCONT)
        print(f"{victim} stale in the gateway {stale_s:.2f} s after SIGSTOP; still listed after "
              f"the turns: {still_listed}")
        assert all(t.error is None and t.replica_id not in (None, victim) for t in served), served
        attempts.append(still_listed)
        back()
        if still_listed:  # served while it was still in the state (and in EDS): not its removal
            break
    assert attempts[-1], attempts


def test_a_replica_lost_mid_run_retries_what_had_not_started(failing: RunningStack) -> None:
    ids = rs.routable(failing)
    for victim, how in ((ids[0], "engine"), (ids[1], "kill")):
        started, waiting, left_s = asyncio.run(_lose(failing, ids, victim, how))
        assert all(t.replica_id and t.replica_id != victim and t.error is None for t in waiting), \
            (how, waiting)
        assert all(t.chunks > 0 and t.final == {} for t in started), (how, started)
        if how == "engine":  # the replica survived its rs.engine: it ended the streams explicitly
            assert all(t.error and "stream_interrupted" in t.error for t in started), started
        else:  # the process is gone: the stream stops without the final event or [DONE]
            assert all(t.error for t in started), started
        assert left_s <= 3.0, (how, left_s)
        ids = [i for i in ids if i != victim]


async def _lose(stack: RunningStack, ids: list[str], victim: str,
                how: str) -> tuple[list[rs.Turn], list[rs.Turn], float]:
    """Streams started on ``victim``, then requests queued there, then its loss; returns the
    turns of both and the seconds until it left the ring."""
    client = rs.aclient(stack)
    convs = iter(rs.homed_on(ids, victim, f"lose-{how}", 8))
    # Below the floor of the bound (10% of 112,000 tokens), counted twice for up to 2 s (its
    # report and the gateway's own ledger): every request stays on the victim.
    rs.engine(stack, victim, slowdown=5)  # 10x real time: a 2,000-token answer takes ~2 s
    started = [asyncio.create_task(rs.stream_turn(client, next(convs), [{"role": "user", "content": "go"}],
                                                  model="chat-7b@v13", max_tokens=2000,
                                                  extra_body={"ignore_eos": True}))
               for _ in range(2)]
    await asyncio.sleep(0.3)  # streaming by now, far from the end
    rs.engine(stack, victim, slowdown=10_000)  # no first token for anyone from now on
    waiting = [asyncio.create_task(rs.stream_turn(client, next(convs), [{"role": "user", "content": "hi"}],
                                               model="chat-7b@v13")) for _ in range(3)]
    await asyncio.sleep(1.0)
    assert all(not t.done() for t in waiting), [t.result() for t in waiting if t.done()]
    await asyncio.to_thread(rs.wait_for, lambda: rs.last_beat_age_s(stack, victim) >= 0.5, 5,
                            "mid-way between two beats")
    lost_at = time.monotonic()
    if how == "engine":
        rs.engine(stack, victim, fail=True, exit=True)
    else:
        pid = next(p["pid"] for p in stack.facts["processes"] if p.get("replica_id") == victim)
        os.kill(int(pid), signal.SIGKILL)
    await asyncio.to_thread(rs.wait_for, lambda: victim not in rs.routable(stack), 5,
                            f"{victim} out of the ring", 0.02)
    left_s = time.monotonic() - lost_at
    return list(await asyncio.gather(*started)), list(await asyncio.gather(*waiting)), left_s

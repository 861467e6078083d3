"""Failures through `modelfleet up`: the control plane killed under load (Envoy and the gateway keep
serving from their last state; it comes back from its state file and everything resyncs), and a
replica lost mid-run, by an engine failure (explicit error events) and by SIGKILL (transport
cut), in both cases requests that had not started streaming are retried on another replica."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from modelfleet.local.harness import RunningStack, assert_all_stopped, start_stack

if TYPE_CHECKING:
    import tests.live.routing_support as rs
else:  # pytest puts tests/live on sys.path
    import routing_support as rs

pytestmark = pytest.mark.live

REPLICAS = {"chat-7b@v13": 3, "chat-7b@v14": 1, "reason-70b@v1": 1}
RESTART_DELAY_S = 5.0


@pytest.fixture(scope="module")
def failing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    """3 x chat-7b@v13 and the canary, 50x; a dead control plane is restarted after 5 s."""
    cwd = tmp_path_factory.mktemp("failures")
    config = rs.routing_config(cwd / "config", REPLICAS, 50.0)
    running = start_stack(cwd, config, "--debug", "--control-plane-restart-delay",
                          str(RESTART_DELAY_S))
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


def test_control_plane_down_under_load_fails_no_request_and_resyncs(failing: RunningStack) -> None:
    cp_url = str(failing.facts["control_plane"]["http_url"])
    old_pid, old_instance = cp_pid(failing), rs.router_state(failing)["instance_id"]
    stop = threading.Event()
    turns: list[rs.Turn] = []

    async def load() -> None:
        client = rs.aclient(failing)

        async def user(u: int) -> None:
            t = 0
            while not stop.is_set():
                turns.append(await rs.stream_turn(client, f"cp-{u}-{t % 3}",
                                               [{"role": "user", "content": f"turn {t}"}]))
                t += 1

        await asyncio.gather(*(user(u) for u in range(8)))

    runner = threading.Thread(target=lambda: asyncio.run(load()))
    runner.start()
    time.sleep(1.0)
    os.kill(old_pid, signal.SIGKILL)
    down_at = time.monotonic()
    rs.wait_for(lambda: httpx.get(failing.gateway_url + "/health").json()["router"]
             ["control_plane_silent_s"] > 2, 10, "the gateway notices the control plane is gone")
    during = len(turns)
    rs.wait_for(lambda: cp_pid(failing) != old_pid, 30, "the control plane restarted")
    down_s = time.monotonic() - down_at
    new_instance = rs.wait_for(lambda: (s := rs.router_state(failing))["instance_id"] != old_instance
                            and s["instance_id"], 10, "the new control plane's state")
    rs.wait_for(lambda: rs.routing_view(failing)["instance_id"] == new_instance, 5,
             "the gateway takes the new control plane's state")
    rs.wait_for(lambda: sorted(rs.routable(failing)) == [f"chat-7b@v13-{i}" for i in range(3)], 5,
             "every replica routable again")
    rs.wait_for(lambda: httpx.get(cp_url + "/v1/xds/status").json()["converged"], 10,
             "Envoy resynced with the new control plane")
    time.sleep(1.0)
    stop.set()
    runner.join(timeout=30)
    assert down_s >= RESTART_DELAY_S - 1
    assert [t.error for t in turns if t.error] == []
    assert during > 20 and len(turns) > during  # served while it was down, and after
    assert all(t.replica_id and t.model_version for t in turns)


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

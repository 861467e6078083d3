"""Pool state from heartbeats, on a fake clock: the missed-beat rule, sums, the prefix hit rate."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import pytest
from envoy_control.state.beat_book import BeatBook
from envoy_control.state.beats import BeatRecord, BeatRules, prefix_tokens, record_beat, replica_of
from envoy_control.state.pool_state import pool_states, routable_ids, silent_ids, why_not_routable
from envoy_control.state.replicas import Replica

from modelfleet.contract.heartbeat import Heartbeat
from modelfleet.contract.router_state_types import PoolRoute, RoutableReplica, RouterState

if TYPE_CHECKING:
    from tests.envoy_control.conftest import FakeClock

RULES = BeatRules()
SERVED = {"chat-7b@v13", "chat-7b@v14"}


def beat(replica_id: str = "r-0", **changes: object) -> Heartbeat:
    base = Heartbeat(
        replica_id=replica_id,
        model="chat-7b",
        version="v13",
        host="127.0.0.1",
        port=9100,
        region="local",
        state="serving",
        tokens_in_flight=1000,
        queue_depth=2,
        running=4,
        kv_cache_usage=0.5,
        prefix_cache_queries=0,
        prefix_cache_hits=0,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def test_three_missed_beats_take_a_replica_out_and_a_beat_brings_it_back() -> None:
    replica = replica_of(beat())
    record = record_beat(None, beat(), 100.0, RULES)
    assert why_not_routable(replica, record, SERVED, 100.0, RULES) is None
    assert why_not_routable(replica, record, SERVED, 103.0, RULES) is None  # 3 s: still in
    out = why_not_routable(replica, record, SERVED, 103.01, RULES)
    assert out is not None and out.startswith("missed beats")
    again = record_beat(record, beat(), 110.0, RULES)
    assert why_not_routable(replica, again, SERVED, 110.0, RULES) is None


def test_a_registered_replica_without_beats_stays_routable() -> None:
    replica = Replica("put-0", "chat-7b", "v13", "127.0.0.1", 9100)
    assert why_not_routable(replica, None, SERVED, 1e9, RULES) is None
    stray = Replica("x-0", "chat-7b", "v99", "127.0.0.1", 9100)
    assert "not a served version" in str(why_not_routable(stray, None, SERVED, 0.0, RULES))


@pytest.mark.parametrize("state", ["starting", "draining"])
def test_starting_and_draining_replicas_are_members_but_not_routable(state: str) -> None:
    records = {"r-0": record_beat(None, beat(state=state), 100.0, RULES)}
    replicas = [replica_of(beat())]
    assert routable_ids(replicas, records, SERVED, 100.0, RULES) == frozenset()
    (pool,) = pool_states(replicas, records, SERVED, 100.0, RULES).values()
    (member,) = pool.members
    assert member.state == state and not member.routable and member.why_not == f"state {state}"
    assert pool.totals.tokens_in_flight == 1000  # a draining replica's streams are still load


def test_sums_count_fresh_beats_only() -> None:
    records = {
        "r-0": record_beat(None, beat("r-0", tokens_in_flight=1000, queue_depth=1), 100.0, RULES),
        "r-1": record_beat(None, beat("r-1", tokens_in_flight=500, queue_depth=3), 102.0, RULES),
    }
    replicas = [
        replica_of(beat("r-0")),
        replica_of(beat("r-1")),
        Replica("p-0", "chat-7b", "v13", "127.0.0.1", 1),
    ]
    pool = pool_states(replicas, records, SERVED, 103.5, RULES)["chat-7b@v13"]
    assert [m.replica_id for m in pool.members] == ["p-0", "r-0", "r-1"]
    by_id = {m.replica_id: m for m in pool.members}
    assert by_id["p-0"].state == "registered" and by_id["p-0"].routable
    assert by_id["p-0"].last_beat_age_s is None and not by_id["p-0"].fresh
    assert not by_id["r-0"].routable and by_id["r-0"].last_beat_age_s == 3.5  # 3.5 s: out
    t = pool.totals
    assert (t.replicas, t.routable, t.tokens_in_flight, t.queue_depth) == (3, 2, 500, 3)


def test_prefix_hit_rate_from_counter_deltas_over_the_window() -> None:
    r = record_beat(None, beat(prefix_cache_queries=10_000, prefix_cache_hits=1_000), 0.0, RULES)
    for at, queries, hits in [(30.0, 14_000, 4_000), (59.0, 20_000, 8_000)]:
        r = record_beat(r, beat(prefix_cache_queries=queries, prefix_cache_hits=hits), at, RULES)
    assert prefix_tokens(r, 59.0, RULES) == (10_000, 7_000)  # since the first sample: 70 %
    assert prefix_tokens(r, 80.0, RULES) == (6_000, 4_000)  # the 0 s sample left the window
    assert prefix_tokens(r, 200.0, RULES) == (0, 0)
    restarted = record_beat(r, beat(prefix_cache_queries=500, prefix_cache_hits=100), 60.0, RULES)
    assert prefix_tokens(restarted, 60.0, RULES) == (500, 100)  # counters went down: a restart
    (pool,) = pool_states([replica_of(beat())], {"r-0": r}, SERVED, 59.0, RULES).values()
    assert pool.totals.prefix_hit_rate == pytest.approx(0.7)
    single = record_beat(None, beat(prefix_cache_queries=9, prefix_cache_hits=9), 0.0, RULES)
    (one,) = pool_states([replica_of(beat())], {"r-0": single}, SERVED, 0.0, RULES).values()
    assert one.totals.prefix_hit_rate is None  # one sample: no delta yet


def test_moving_to_another_version_restarts_the_samples() -> None:
    r = record_beat(None, beat(prefix_cache_queries=100, prefix_cache_hits=50), 0.0, RULES)
    moved = record_beat(r, beat(version="v14", prefix_cache_queries=200), 1.0, RULES)
    assert len(moved.samples) == 1


def test_silent_replicas_are_forgotten_after_forget_after_s() -> None:
    records = {"r-0": record_beat(None, beat(), 0.0, RULES)}
    assert silent_ids(records, RULES.forget_after_s, RULES) == []
    assert silent_ids(records, RULES.forget_after_s + 0.1, RULES) == ["r-0"]


def test_beat_book_restores_a_saved_state(clock: FakeClock) -> None:
    saved = RouterState(
        state_version=7,
        instance_id="old",
        snapshot_version="4",
        published_at=0.0,
        beat_interval_s=1.0,
        pools=(
            PoolRoute(
                "chat-7b",
                "v13",
                112_000,
                (
                    RoutableReplica("hb-0", "127.0.0.1", 9100, "local", 10, 0, 1, 0.1, True),
                    RoutableReplica("put-0", "127.0.0.1", 9101, None, 0, 0, 0, None, False),
                ),
            ),
        ),
    )
    book = BeatBook(RULES, clock)
    replicas = book.restore(saved)
    assert [r.replica_id for r in replicas] == ["hb-0", "put-0"]
    assert isinstance(book.get("hb-0"), BeatRecord) and book.get("put-0") is None
    assert book.routable(replicas, SERVED) == {"hb-0", "put-0"}
    clock.advance(3.01)  # the restored beat counts as "just now": 3 s of grace
    assert book.routable(replicas, SERVED) == {"put-0"}

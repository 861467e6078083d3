"""Replica picking: the consistent-hash ring (pinned by replica id, ~1/N keys move when a replica
joins), affinity bounded by 125% of the pool's average tokens in flight, and the two baselines."""

from __future__ import annotations

import pytest

from gateway_ext.routing.picking import (
    Pick,
    PickReason,
    build_ring,
    over_bound,
    pick,
    pick_least_loaded,
    pick_round_robin,
    ring_order,
)

IDS = [f"chat-7b@v13-{i}" for i in range(12)]
KEYS = [f"conv-{i}" for i in range(6000)]


def owners(ids: list[str]) -> dict[str, str]:
    ring = build_ring(ids)
    return {k: ring_order(ring, k)[0] for k in KEYS}


def test_ring_depends_on_replica_ids_only_not_their_order() -> None:
    a, b = build_ring(IDS), build_ring(list(reversed(IDS)))
    assert (a.points, a.owners) == (b.points, b.owners)
    assert owners(IDS) == owners(list(reversed(IDS)))  # a restart elsewhere moves no key


def test_adding_a_replica_moves_about_one_key_in_n_plus_one_all_to_it() -> None:
    before, after = owners(IDS), owners([*IDS, "chat-7b@v13-12"])
    moved = [k for k in KEYS if before[k] != after[k]]
    assert 0.05 < len(moved) / len(KEYS) < 0.11  # 1/13 = 0.077
    assert {after[k] for k in moved} == {"chat-7b@v13-12"}


def test_removing_a_replica_moves_only_its_keys() -> None:
    before, after = owners(IDS), owners(IDS[1:])
    assert {k for k in KEYS if before[k] != after[k]} == {k for k in KEYS if before[k] == IDS[0]}


def test_keys_spread_evenly_over_the_ring() -> None:
    counts: dict[str, int] = {}
    for owner in owners(IDS).values():
        counts[owner] = counts.get(owner, 0) + 1
    share = len(KEYS) / len(IDS)
    assert all(0.7 * share < c < 1.3 * share for c in counts.values())


def test_ring_order_lists_every_replica_once() -> None:
    ring = build_ring(IDS)
    order = ring_order(ring, "conv-7")
    assert sorted(order) == sorted(IDS)
    assert ring_order(ring, "conv-7") == order


def test_bad_rings_are_refused() -> None:
    for ids, vnodes in (([], 10), (["a", "a"], 10), (["a"], 0)):
        with pytest.raises(ValueError):
            build_ring(ids, vnodes)
    with pytest.raises(ValueError):
        pick_least_loaded([], {})
    with pytest.raises(ValueError):
        pick_round_robin([], 0)


RING = build_ring(["a", "b", "c", "d"], vnodes=64)
HOME = ring_order(RING, "conv-1")  # the walk from conv-1's hash: HOME[0] is its replica


def even(**over: int) -> dict[str, int]:
    loads = dict.fromkeys("abcd", 1000)
    loads.update(over)
    return loads


@pytest.mark.parametrize(("name", "key", "loads", "replica", "reason"), [
    ("idle pool: the key's replica", "conv-1", {}, HOME[0], PickReason.AFFINITY),
    ("even load: the key's replica", "conv-1", even(), HOME[0], PickReason.AFFINITY),
    ("at 125% of the average it still takes it", "conv-1",
     {HOME[0]: 1250, HOME[1]: 1000, HOME[2]: 1000, HOME[3]: 750}, HOME[0], PickReason.AFFINITY),
    ("above 125%: the next one on the ring", "conv-1", even(**{HOME[0]: 3000}), HOME[1],
     PickReason.SPILLED),
    ("the next one over too: the one after", "conv-1",
     {HOME[0]: 3000, HOME[1]: 3000, HOME[2]: 0, HOME[3]: 0}, HOME[2], PickReason.SPILLED),
    ("no conversation id: least tokens in flight", None, even(c=10), "c", PickReason.LEAST_LOADED),
    ("empty conversation id: least tokens in flight", "", even(b=10), "b", PickReason.LEAST_LOADED),
    ("unreported replicas read 0", None, {"a": 5, "b": 5, "c": 5}, "d", PickReason.LEAST_LOADED),
])
def test_pick(name: str, key: str | None, loads: dict[str, int], replica: str,
              reason: PickReason) -> None:
    got = pick(RING, key, loads)
    assert (got.replica, got.reason) == (replica, reason), name
    assert got.replica not in got.fallbacks and len(got.fallbacks) == 2


def test_fallbacks_are_the_acceptable_ones_in_ring_order_then_the_skipped() -> None:
    loads = {HOME[0]: 3000, HOME[1]: 1000, HOME[2]: 1000, HOME[3]: 1000}
    assert pick(RING, "conv-1", loads, max_fallbacks=3) == Pick(
        HOME[1], (HOME[2], HOME[3], HOME[0]), PickReason.SPILLED)
    assert pick(RING, "conv-1", {}, max_fallbacks=3).fallbacks == HOME[1:]


def test_over_bound_uses_the_pool_average() -> None:
    assert over_bound({"a": 126, "b": 74}, ["a", "b"], 1.25) == {"a"}
    assert over_bound({"a": 125, "b": 75}, ["a", "b"], 1.25) == set()
    assert over_bound({}, ["a", "b"], 1.25) == set()


def test_least_loaded_breaks_ties_by_id_and_round_robin_cycles() -> None:
    assert pick_least_loaded(["b", "a", "c"], {"c": 1}) == Pick("a", ("b", "c"), PickReason.LEAST_LOADED)
    picks = [pick_round_robin(["a", "b", "c"], i).replica for i in range(5)]
    assert picks == ["a", "b", "c", "a", "b"]
    assert pick_round_robin(["a", "b", "c"], 2).fallbacks == ("a", "b")
    assert pick_round_robin(["a"], 7) == Pick("a", (), PickReason.ROUND_ROBIN)

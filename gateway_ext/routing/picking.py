"""Replica picking within one version's pool (pure; the gateway and the simulator call it).

The seed's router: a consistent-hash ring over the version's replicas, keyed by conversation id,
so the next turn of a conversation goes to the replica whose prefix cache holds its history;
balance bounded by tokens in flight (prompt plus remaining output of everything a replica holds).

* **Ring.** Each replica owns ``vnodes`` points at ``hash(replica_id # i)``. Positions depend on
  the replica id only, never on its address: a replica restarted elsewhere keeps its keys, and
  adding one to N replicas moves about 1 key in N + 1.
* **Affinity with bounded load** (:func:`pick`): walk the ring clockwise from the key's hash and
  take the first replica whose tokens in flight are not above ``bound`` (1.25) x the pool
  average; the skipped ones become fallbacks after the acceptable ones. At least one replica is
  always at or below the average, so a pick never fails on load. A replica at or below
  ``floor_tokens`` is never skipped: in a nearly idle pool one request puts its replica above
  125% of the (tiny) average, and spilling then would trade a warm prefix cache for nothing.
* **No conversation id**: the replica with the least tokens in flight.
* **Health first** (:func:`first_choices`): the caller leaves out replicas it has reason to
  think dead (a stale beat) before picking, unless that would leave none; they may still be
  reached through Envoy's fallback policy.
* **Baselines** for the routing A/B: :func:`pick_round_robin` and :func:`pick_least_loaded`.

Loads are tokens (a missing replica reads 0: it has not reported yet). Every result is a
:class:`Pick`: the chosen replica and the ordered fallbacks Envoy may try if it fails before
the first byte (``x-gateway-destination-endpoint``).
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

DEFAULT_VNODES = 160
"""Points per replica: the share of keys a replica owns varies by about 1/sqrt(160) = 8%."""
DEFAULT_BOUND = 1.25
"""Skip a replica whose tokens in flight exceed this multiple of the pool average (the seed's 125%)."""
DEFAULT_FALLBACKS = 2
"""Fallbacks returned after the choice."""


def ring_hash(text: str) -> int:
    """A stable 64-bit hash of ``text`` (the same in every process; Python's ``hash`` is salted)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class PickReason(StrEnum):
    """Why a replica was chosen."""

    AFFINITY = "affinity"          # the key's own replica on the ring
    SPILLED = "spilled"            # the key's replica was over the bound: the next acceptable one
    LEAST_LOADED = "least_loaded"  # no key, or the least-tokens-in-flight policy
    ROUND_ROBIN = "round_robin"


@dataclass(frozen=True)
class Pick:
    """The chosen replica id, the ordered fallbacks, and why."""

    replica: str
    fallbacks: tuple[str, ...]
    reason: PickReason


@dataclass(frozen=True)
class Ring:
    """A consistent-hash ring: sorted ``points`` and the replica owning each (``owners``)."""

    points: tuple[int, ...]
    owners: tuple[str, ...]
    replicas: tuple[str, ...]
    """Members, sorted by id."""
    _orders: dict[int, tuple[str, ...]] = field(default_factory=dict, compare=False, repr=False)
    """Memo of :func:`ring_order` by start point (at most one entry per point)."""

    def __len__(self) -> int:
        return len(self.replicas)


def build_ring(replica_ids: Iterable[str], vnodes: int = DEFAULT_VNODES) -> Ring:
    """The ring of ``replica_ids`` with ``vnodes`` points each. Raises ``ValueError`` on an
    empty or duplicated membership or ``vnodes < 1``."""
    ids = list(replica_ids)
    if not ids:
        raise ValueError("a ring needs at least one replica")
    if len(set(ids)) != len(ids):
        raise ValueError("replica ids on a ring must be unique")
    if vnodes < 1:
        raise ValueError(f"vnodes must be positive, got {vnodes}")
    # Ties between two replicas' points (astronomically rare) are broken by id: deterministic.
    points = sorted((ring_hash(f"{rid}#{i}"), rid) for rid in ids for i in range(vnodes))
    return Ring(tuple(p for p, _ in points), tuple(r for _, r in points), tuple(sorted(ids)))


def ring_order(ring: Ring, key: str) -> tuple[str, ...]:
    """Every replica once, in the order met walking clockwise from ``key``'s hash."""
    n = len(ring.owners)
    start = bisect.bisect_left(ring.points, ring_hash(key)) % n
    order = ring._orders.get(start)
    if order is None:
        want = len(ring.replicas)
        seen: dict[str, None] = {}
        for i in range(n):
            owner = ring.owners[(start + i) % n]
            if owner not in seen:
                seen[owner] = None
                if len(seen) == want:
                    break
        order = ring._orders[start] = tuple(seen)
    return order


def first_choices(replicas: Sequence[str], suspect: Collection[str]) -> tuple[str, ...]:
    """``replicas`` (in order) without the ``suspect`` ones; all of ``replicas`` when every one
    is suspect: a pick never fails for health, Envoy's retries still stand behind it."""
    healthy = tuple(r for r in replicas if r not in suspect)
    return healthy or tuple(replicas)


def over_bound(loads: Mapping[str, int], replicas: Sequence[str], bound: float,
               floor_tokens: int = 0) -> set[str]:
    """The replicas whose tokens in flight exceed ``bound`` x the average over ``replicas`` and
    ``floor_tokens`` (tokens)."""
    total = sum(loads.get(r, 0) for r in replicas)
    if total <= 0:
        return set()
    limit = max(bound * total / len(replicas), floor_tokens)
    return {r for r in replicas if loads.get(r, 0) > limit}


def pick(ring: Ring, conversation_id: str | None, loads: Mapping[str, int],
         bound: float = DEFAULT_BOUND, max_fallbacks: int = DEFAULT_FALLBACKS,
         floor_tokens: int = 0) -> Pick:
    """Affinity with bounded load: the first replica clockwise from ``conversation_id`` whose
    tokens in flight (``loads``, tokens) are at most ``bound`` x the pool average (or at most
    ``floor_tokens``); without a conversation id, the least loaded replica. Fallbacks: the next
    acceptable replicas in ring order, then the skipped ones, at most ``max_fallbacks``."""
    if not conversation_id:
        return pick_least_loaded(ring.replicas, loads, max_fallbacks)
    order = ring_order(ring, conversation_id)
    skip = over_bound(loads, order, bound, floor_tokens)
    if not skip:
        return Pick(order[0], order[1 : 1 + max_fallbacks], PickReason.AFFINITY)
    ok = [r for r in order if r not in skip]
    rest = ok[1:] + [r for r in order if r in skip]
    reason = PickReason.AFFINITY if ok[0] == order[0] else PickReason.SPILLED
    return Pick(ok[0], tuple(rest[:max_fallbacks]), reason)


def pick_least_loaded(replicas: Sequence[str], loads: Mapping[str, int],
                      max_fallbacks: int = DEFAULT_FALLBACKS) -> Pick:
    """The replica with the least tokens in flight (ties: the lowest id); fallbacks the next
    least loaded. Raises ``ValueError`` when ``replicas`` is empty."""
    if not replicas:
        raise ValueError("no replica to pick from")
    ranked = sorted(replicas, key=lambda r: (loads.get(r, 0), r))
    return Pick(ranked[0], tuple(ranked[1 : 1 + max_fallbacks]), PickReason.LEAST_LOADED)


def pick_round_robin(replicas: Sequence[str], counter: int,
                     max_fallbacks: int = DEFAULT_FALLBACKS) -> Pick:
    """Replica number ``counter`` modulo the pool (the caller advances ``counter`` by one per
    request); fallbacks the ones after it. Raises ``ValueError`` when ``replicas`` is empty."""
    if not replicas:
        raise ValueError("no replica to pick from")
    n = len(replicas)
    i = counter % n
    rest = tuple(replicas[(i + k) % n] for k in range(1, min(n, 1 + max_fallbacks)))
    return Pick(replicas[i], rest, PickReason.ROUND_ROBIN)

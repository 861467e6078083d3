"""Pool state from heartbeats: who is routable, and the sums per ``model@version`` (pure).

Rules, over :class:`~envoy_control.state.beats.BeatRecord` values and the control plane's clock
(``now``, monotonic seconds):

- a replica is **routable** when its version is served and either it has not beaten yet (it was
  registered with ``PUT /v1/replicas``: the local-stack path, before replicas beat) or its last
  beat says ``serving`` and is at most ``missed_beats x interval_s`` (3 s) old. More than 3 s
  without a beat (three missed beats) takes it out; a replica that beats again comes back.
  ``starting`` and ``draining`` replicas are members but not routable;
- pool sums (tokens in flight, queue depth, running) count members whose last beat is fresh,
  draining ones included: their streams are load the pool holds;
- the pool's prefix hit rate sums each member's windowed hit and queried tokens
  (:func:`~envoy_control.state.beats.prefix_tokens`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from envoy_control.state.beats import BeatRecord, BeatRules, hit_rate, prefix_tokens
from envoy_control.state.replicas import Replica

REGISTERED = "registered"
"""The ``state`` shown for a replica registered by ``PUT`` that has not beaten yet."""


def why_not_routable(
    replica: Replica,
    record: BeatRecord | None,
    served: Collection[str],
    now: float,
    rules: BeatRules,
) -> str | None:
    """Why ``replica`` must not take traffic at ``now`` (seconds), or None when it may."""
    if replica.key not in served:
        return f"{replica.key} is not a served version"
    if record is None:
        return None  # registered, no beat yet: routable until its first beat starts the count
    age = now - record.received_at
    if age > rules.timeout_s:
        return f"missed beats: last beat {age:.1f} s ago (limit {rules.timeout_s:g} s)"
    if record.last.state != "serving":
        return f"state {record.last.state}"
    return None


def routable_ids(
    replicas: Iterable[Replica],
    beats: Mapping[str, BeatRecord],
    served: Collection[str],
    now: float,
    rules: BeatRules,
) -> frozenset[str]:
    """Ids of the replicas that belong in the ring and in EDS at ``now``."""
    return frozenset(
        r.replica_id
        for r in replicas
        if why_not_routable(r, beats.get(r.replica_id), served, now, rules) is None
    )


def silent_ids(beats: Mapping[str, BeatRecord], now: float, rules: BeatRules) -> list[str]:
    """Replicas silent for more than ``forget_after_s`` seconds: to be forgotten."""
    return sorted(i for i, b in beats.items() if now - b.received_at > rules.forget_after_s)


@dataclass(frozen=True)
class MemberState:
    """One replica of a pool at one instant (loads in tokens; ages in seconds)."""

    replica_id: str
    model: str
    version: str
    host: str
    port: int
    region: str | None
    state: str
    """``starting``/``serving``/``draining`` from the last beat, or ``registered``."""
    routable: bool
    why_not: str | None
    fresh: bool
    """Whether the last beat is recent enough to count its load (False before any beat)."""
    tokens_in_flight: int
    queue_depth: int
    running: int
    kv_cache_usage: float | None
    last_beat_age_s: float | None
    prefix_cache_queries: int
    """Prefix-cache tokens queried within the window (tokens)."""
    prefix_cache_hits: int
    prefix_hit_rate: float | None


@dataclass(frozen=True)
class PoolTotals:
    """Sums over the fresh members of one or more pools (tokens, requests)."""

    replicas: int
    routable: int
    tokens_in_flight: int
    queue_depth: int
    running: int
    prefix_cache_queries: int
    prefix_cache_hits: int

    @property
    def prefix_hit_rate(self) -> float | None:
        """Hit tokens / queried tokens over the window (0..1), None when nothing was queried."""
        return hit_rate(self.prefix_cache_queries, self.prefix_cache_hits)


@dataclass(frozen=True)
class PoolState:
    """The replicas of one ``model@version`` (sorted by id) and their sums."""

    model: str
    version: str
    members: tuple[MemberState, ...]
    totals: PoolTotals

    @property
    def key(self) -> str:
        """``model@version``."""
        return f"{self.model}@{self.version}"


def member_state(
    replica: Replica,
    record: BeatRecord | None,
    served: Collection[str],
    now: float,
    rules: BeatRules,
) -> MemberState:
    """The state of one replica at ``now`` (seconds, the control plane's clock)."""
    why_not = why_not_routable(replica, record, served, now, rules)
    queries, hits = prefix_tokens(record, now, rules)
    beat = record.last if record is not None else None
    age = now - record.received_at if record is not None else None
    fresh = age is not None and age <= rules.timeout_s
    return MemberState(
        replica_id=replica.replica_id,
        model=replica.model,
        version=replica.version,
        host=replica.host,
        port=replica.port,
        region=beat.region if beat else None,
        state=beat.state if beat else REGISTERED,
        routable=why_not is None,
        why_not=why_not,
        fresh=fresh,
        tokens_in_flight=beat.tokens_in_flight if beat else 0,
        queue_depth=beat.queue_depth if beat else 0,
        running=beat.running if beat else 0,
        kv_cache_usage=beat.kv_cache_usage if beat else None,
        last_beat_age_s=round(age, 3) if age is not None else None,
        prefix_cache_queries=queries,
        prefix_cache_hits=hits,
        prefix_hit_rate=hit_rate(queries, hits),
    )


def totals(members: Iterable[MemberState]) -> PoolTotals:
    """Sums over ``members``: loads count only fresh beats; prefix tokens count every window."""
    ms = list(members)
    fresh = [m for m in ms if m.fresh]
    return PoolTotals(
        replicas=len(ms),
        routable=sum(m.routable for m in ms),
        tokens_in_flight=sum(m.tokens_in_flight for m in fresh),
        queue_depth=sum(m.queue_depth for m in fresh),
        running=sum(m.running for m in fresh),
        prefix_cache_queries=sum(m.prefix_cache_queries for m in ms),
        prefix_cache_hits=sum(m.prefix_cache_hits for m in ms),
    )


def pool_states(
    replicas: Iterable[Replica],
    beats: Mapping[str, BeatRecord],
    served: Collection[str],
    now: float,
    rules: BeatRules,
) -> dict[str, PoolState]:
    """Pool state per ``model@version`` of every replica (served versions or not), by key."""
    groups: dict[str, list[MemberState]] = {}
    for r in sorted(replicas, key=lambda r: r.replica_id):
        groups.setdefault(r.key, []).append(
            member_state(r, beats.get(r.replica_id), served, now, rules)
        )
    return {
        key: PoolState(ms[0].model, ms[0].version, tuple(ms), totals(ms))
        for key, ms in sorted(groups.items())
    }

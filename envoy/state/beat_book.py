"""The control plane's book of heartbeats: the last beat of every replica, read by the rules of
:mod:`envoy_control.state.pool_state` at the injected clock (monotonic seconds)."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable

from envoy_control.state.beats import BeatRecord, BeatRules, record_beat
from envoy_control.state.pool_state import (
    PoolState,
    pool_states,
    routable_ids,
    silent_ids,
    why_not_routable,
)
from envoy_control.state.replicas import Replica

from modelfleet.contract.heartbeat import Heartbeat
from modelfleet.contract.router_state_types import RouterState


class BeatBook:
    """Beat records by replica id. Holds no replicas: the control plane passes them in."""

    def __init__(self, rules: BeatRules, clock: Callable[[], float] = time.monotonic) -> None:
        self.rules = rules
        self._clock = clock
        self._records: dict[str, BeatRecord] = {}

    def get(self, replica_id: str) -> BeatRecord | None:
        """The last beat of ``replica_id``, if it ever beat (since it was registered here)."""
        return self._records.get(replica_id)

    def record(self, beat: Heartbeat) -> BeatRecord:
        """Keep ``beat`` as the replica's last, stamped with the clock now."""
        record = record_beat(self._records.get(beat.replica_id), beat, self._clock(), self.rules)
        self._records[beat.replica_id] = record
        return record

    def forget(self, replica_id: str) -> None:
        """Drop the beats of ``replica_id`` (removed, or moved to a new address)."""
        self._records.pop(replica_id, None)

    def forget_silent(self) -> list[str]:
        """Drop and return the replicas silent for more than ``rules.forget_after_s`` seconds."""
        gone = silent_ids(self._records, self._clock(), self.rules)
        for replica_id in gone:
            del self._records[replica_id]
        return gone

    def why_not(self, replica: Replica, served: Collection[str]) -> str | None:
        """Why ``replica`` is kept out of the ring now, or None when it is routable."""
        record = self._records.get(replica.replica_id)
        return why_not_routable(replica, record, served, self._clock(), self.rules)

    def routable(self, replicas: Iterable[Replica], served: Collection[str]) -> frozenset[str]:
        """Ids of the routable ``replicas`` now."""
        return routable_ids(replicas, self._records, served, self._clock(), self.rules)

    def pools(self, replicas: Iterable[Replica], served: Collection[str]) -> dict[str, PoolState]:
        """Pool state of ``replicas`` per ``model@version`` now."""
        return pool_states(replicas, self._records, served, self._clock(), self.rules)

    def restore(self, saved: RouterState) -> list[Replica]:
        """The routable replicas of a saved router state. Those that were beating are booked
        as having beaten just now: alive ones beat again within a second, dead ones leave the
        ring after the usual ``rules.timeout_s``. Raises ValueError on a bad replica."""
        now, out = self._clock(), []
        for pool in saved.pools:
            for r in pool.replicas:
                out.append(Replica(r.replica_id, pool.model, pool.version, r.host, r.port))
                if r.beating:
                    beat = Heartbeat(
                        r.replica_id, pool.model, pool.version, r.host, r.port,
                        r.region or "", "serving", r.tokens_in_flight, r.queue_depth,
                        r.running, r.kv_cache_usage or 0.0, 0, 0,
                    )  # fmt: skip
                    self._records[r.replica_id] = BeatRecord(beat, now)  # no counter samples
        return out

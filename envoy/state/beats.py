"""What the control plane keeps of the heartbeats replicas send (the beat itself is
:class:`modelfleet.contract.heartbeat.Heartbeat`; pure; times are the control plane's monotonic
seconds, never the sender's).

Prefix hit rate: hit tokens / queried tokens over the last ``hit_rate_window_s`` (60 s), from
deltas of the cumulative counters a replica reports (vLLM's ``prefix_cache_queries`` and
``prefix_cache_hits``, in tokens). A counter that goes down means the replica restarted: its new
value then counts as the whole delta.
"""

from __future__ import annotations

from dataclasses import dataclass

from envoy_control.state.replicas import Replica

from modelfleet.contract.heartbeat import BEAT_INTERVAL_S, MISSED_BEATS, Heartbeat


@dataclass(frozen=True)
class BeatRules:
    """The heartbeat contract: ``interval_s`` seconds between beats, ``missed_beats`` before a
    replica leaves the ring, the prefix hit-rate window and when a silent replica is forgotten."""

    interval_s: float = BEAT_INTERVAL_S
    missed_beats: int = MISSED_BEATS
    hit_rate_window_s: float = 60.0
    forget_after_s: float = 300.0
    """A replica silent this long (seconds) is dropped from the pool state altogether."""

    @property
    def timeout_s(self) -> float:
        """Seconds without a beat after which a replica is not routable (3 x 1 s)."""
        return self.interval_s * self.missed_beats


def replica_of(beat: Heartbeat) -> Replica:
    """The registration ``beat`` implies; raises ValueError on a bad id, host or port."""
    return Replica(beat.replica_id, beat.model, beat.version, beat.host, beat.port)


@dataclass(frozen=True)
class PrefixSample:
    """The cumulative prefix-cache counters (tokens) received ``at`` (control-plane seconds)."""

    at: float
    queries: int
    hits: int


@dataclass(frozen=True)
class BeatRecord:
    """A replica's last beat, when it arrived (control-plane monotonic seconds), and its prefix
    counter samples within the hit-rate window, oldest first."""

    last: Heartbeat
    received_at: float
    samples: tuple[PrefixSample, ...] = ()


def record_beat(
    previous: BeatRecord | None, beat: Heartbeat, now: float, rules: BeatRules
) -> BeatRecord:
    """The record after ``beat`` arrived at ``now``; samples older than the window drop out."""
    kept = previous.samples if previous is not None and previous.last.key == beat.key else ()
    window = tuple(s for s in kept if now - s.at <= rules.hit_rate_window_s)
    sample = PrefixSample(now, beat.prefix_cache_queries, beat.prefix_cache_hits)
    return BeatRecord(beat, now, (*window, sample))


def prefix_tokens(record: BeatRecord | None, now: float, rules: BeatRules) -> tuple[int, int]:
    """(queried, hit) prefix-cache tokens of one replica over the window ending at ``now``."""
    if record is None:
        return 0, 0
    samples = [s for s in record.samples if now - s.at <= rules.hit_rate_window_s]
    if len(samples) < 2:
        return 0, 0
    first, last = samples[0], samples[-1]
    if last.queries < first.queries or last.hits < first.hits:  # counters reset: a restart
        return last.queries, last.hits
    return last.queries - first.queries, last.hits - first.hits


def hit_rate(queries: int, hits: int) -> float | None:
    """``hits / queries`` (0..1), or None when nothing was queried."""
    return min(1.0, hits / queries) if queries > 0 else None

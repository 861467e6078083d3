"""The control plane's state: declared config, replica set and debug injections, made snapshots.

Every change (a replica registered or removed, a config reloaded, a debug injection) builds a new
snapshot from the whole desired state and publishes it through the cache, which pushes it to
every connected Envoy. A change that leaves every resource as it was publishes nothing. A change
whose snapshot fails the consistency check is rolled back; an invalid config is refused; in both
cases the previous snapshot keeps serving.

The desired state is the config directory plus an override layer of admin and controller
changes (:mod:`envoy_control.state.desired`): :meth:`ControlPlane.change` proposes overrides,
cross-checked like the config itself; a reload keeps the overrides the new config neither
acknowledges nor changes. With a ``store`` (the registry) the served state is mirrored there
after every change, the overrides are resumed at start, and a config that would change a
registered version is refused.

Heartbeats (:meth:`ControlPlane.heartbeat`) register replicas and carry their load; only the
routable replicas (:mod:`envoy_control.state.pool_state`) go into EDS. A timer task
(:meth:`ControlPlane.watch_beats`) re-evaluates the missed-beat rule every ~250 ms and publishes
the router state for gateways (:mod:`envoy_control.state.publish`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from envoy_control.resources.bootstrap import BOOTSTRAP_CLUSTERS
from envoy_control.resources.build import ListenerSpec, build_resources, served_version_keys
from envoy_control.state.beat_book import BeatBook
from envoy_control.state.beats import BeatRules, replica_of
from envoy_control.state.desired import Desired, DesiredStore
from envoy_control.state.overrides import Override
from envoy_control.state.pool_state import PoolState
from envoy_control.state.publish import RouterPublisher, build_router_state
from envoy_control.state.replicas import Replica
from envoy_control.state.watch import ConfigSignature, config_signature, watch_beats, watch_config
from envoy_control.xds.cache import SnapshotCache
from envoy_control.xds.snapshot import Snapshot, new_snapshot, same_resources
from google.protobuf.message import Message

from modelfleet.config import ConfigError, PlatformConfig, Problem, load_config
from modelfleet.contract.heartbeat import Heartbeat
from modelfleet.contract.router_state_types import RouterState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Published:
    """The outcome of a change: the snapshot now serving and whether the change made a new one."""

    snapshot: Snapshot
    changed: bool


@dataclass
class _State:
    config: PlatformConfig
    replicas: dict[str, Replica]
    injected: dict[str, list[Message]]


class ControlPlane:
    """Owns the desired state and publishes it to ``cache`` and ``router``. Call :meth:`load`
    first. ``clock`` is monotonic seconds: heartbeat ages never use a sender's clock."""

    def __init__(
        self,
        config_dir: Path,
        cache: SnapshotCache,
        listener: ListenerSpec,
        region: str | None = None,
        *,
        rules: BeatRules | None = None,
        router: RouterPublisher | None = None,
        clock: Callable[[], float] = time.monotonic,
        store: DesiredStore | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.config_dir = config_dir
        self.store = store
        self.wall_clock = wall_clock
        self.cache = cache
        self.listener = listener
        self.region = region
        self.beats = BeatBook(rules if rules is not None else BeatRules(), clock)
        self.router = router if router is not None else RouterPublisher(clock=clock)
        self.warnings: list[Problem] = []
        self._state: _State | None = None
        self._sequence = 0
        self.signature: ConfigSignature = ()
        """The config files as last read (see :func:`envoy_control.state.watch.config_signature`)."""
        self._routable: frozenset[str] = frozenset()
        self._desired: Desired | None = None

    @property
    def config(self) -> PlatformConfig:
        """The config being served: the config directory with the overrides in effect."""
        return self._require().config

    @property
    def desired(self) -> Desired:
        """The config directory, the overrides held over it, and the served result."""
        if self._desired is None:
            raise RuntimeError("control plane not loaded: call load() first")
        return self._desired

    @property
    def replicas(self) -> Mapping[str, Replica]:
        """The registered replicas by id."""
        return dict(self._require().replicas)

    @property
    def snapshot(self) -> Snapshot:
        """The snapshot being served."""
        snapshot = self.cache.snapshot
        if snapshot is None:
            raise RuntimeError("no snapshot yet: call load() first")
        return snapshot

    def load(self) -> Published:
        """Read the config directory, resume the store's overrides and publish the first
        snapshot. Raises ConfigError."""
        saved = self.store.saved_overrides() if self.store is not None else []
        desired = self._read_config(Desired.of(PlatformConfig(), saved))
        return self._commit(desired, "config", lambda s: s, _State(desired.served, {}, {}))

    def reload(self) -> Published:
        """Re-read the config directory; raises ConfigError (previous config keeps serving)."""
        desired = self._read_config(self.desired)
        return self._commit(
            desired, "config", lambda s: _State(desired.served, s.replicas, s.injected)
        )

    def _read_config(self, current: Desired) -> Desired:
        self.signature = config_signature(self.config_dir)
        result = load_config(self.config_dir)
        if self.store is not None and (conflicts := self.store.conflicts(result.config, result.origins)):
            raise ConfigError(conflicts)
        self.warnings = result.warnings
        return current.rebased(result.config)[0]

    def change(self, changes: Sequence[Override], by: str) -> Published:
        """Put ``changes`` over the config directory (``by``: who asks). Raises ConfigError
        when the result fails a cross-check; the store's errors propagate (nothing changes)."""
        desired = self.desired.propose(changes)
        return self._commit(
            desired, by, lambda s: _State(desired.served, s.replicas, s.injected)
        )

    def _commit(
        self, desired: Desired, by: str, apply: Callable[[_State], _State], initial: _State | None = None
    ) -> Published:
        if self.store is not None:
            self.store.sync(desired.served, desired.overrides, by, self.wall_clock())
        published = self._change(apply, initial)
        self._desired = desired
        return published

    def put_replica(self, replica: Replica) -> Published:
        """Register (or move) a replica. A move forgets its beats: the process at the new
        address has not beaten yet, so it is routable until its first beat (see pool_state)."""
        if self._require().replicas.get(replica.replica_id, replica) != replica:
            self.beats.forget(replica.replica_id)
        return self._change(
            lambda s: _State(s.config, {**s.replicas, replica.replica_id: replica}, s.injected)
        )

    def delete_replica(self, replica_id: str) -> Published | None:
        """Remove a replica; None if it was not registered."""
        if replica_id not in self._require().replicas:
            return None
        self.beats.forget(replica_id)
        rest = {k: v for k, v in self._require().replicas.items() if k != replica_id}
        return self._change(lambda s: _State(s.config, rest, s.injected))

    def heartbeat(self, beat: Heartbeat) -> Published:
        """Record ``beat``; registers (or moves) the replica it names. Raises ValueError on a
        bad id, host or port. Publishes a snapshot only when the replica joins or leaves EDS."""
        replica = replica_of(beat)
        rid = replica.replica_id
        self.beats.record(beat)
        if self._require().replicas.get(rid) != replica:
            return self._change(
                lambda s: _State(s.config, {**s.replicas, rid: replica}, s.injected)
            )
        if (self.why_not_routable(rid) is None) != (rid in self._routable):
            return self._change(lambda s: s)
        return Published(self.snapshot, changed=False)

    def why_not_routable(self, replica_id: str) -> str | None:
        """Why a registered replica is kept out of EDS now, or None when it is routable."""
        state = self._require()
        return self.beats.why_not(state.replicas[replica_id], served_version_keys(state.config))

    def pool_states(self) -> dict[str, PoolState]:
        """Pool state per ``model@version`` now (every registered replica)."""
        state = self._require()
        return self.beats.pools(state.replicas.values(), served_version_keys(state.config))

    def refresh(self) -> Published:
        """Apply the missed-beat rule now: forget replicas silent past ``forget_after_s``,
        publish a snapshot if the routable set changed, and offer the router state."""
        state = self._require()
        gone = set(self.beats.forget_silent())
        if gone:
            log.info("forgetting silent replicas %s", ", ".join(sorted(gone)))
            rest = {k: v for k, v in state.replicas.items() if k not in gone}
            return self._change(lambda s: _State(s.config, rest, s.injected))
        served = served_version_keys(state.config)
        if self.beats.routable(state.replicas.values(), served) != self._routable:
            return self._change(lambda s: s)
        self.router.offer(self._router_candidate())
        return Published(self.snapshot, changed=False)

    def restore(self, saved: RouterState) -> Published:
        """Register the routable replicas of a saved router state (a restart with
        ``--state-file``); see :meth:`BeatBook.restore`."""
        restored = {r.replica_id: r for r in self.beats.restore(saved)}
        return self._change(lambda s: _State(s.config, {**s.replicas, **restored}, s.injected))

    def _router_candidate(self) -> RouterState:
        return build_router_state(
            self.config, self.pool_states(), self.snapshot.version, self.beats.rules.interval_s
        )

    def inject(self, type_url: str, message: Message) -> Published:
        """Add ``message`` as it is to every next snapshot (debug: a deliberately invalid resource)."""

        def apply(s: _State) -> _State:
            injected = {t: list(v) for t, v in s.injected.items()}
            injected.setdefault(type_url, []).append(message)
            return _State(s.config, s.replicas, injected)

        return self._change(apply)

    def clear_injected(self) -> Published:
        """Drop every injected resource."""
        return self._change(lambda s: _State(s.config, s.replicas, {}))

    def injected(self) -> dict[str, list[Message]]:
        """Injected resources by type URL."""
        return {t: list(v) for t, v in self._require().injected.items()}

    def _require(self) -> _State:
        if self._state is None:
            raise RuntimeError("control plane not loaded: call load() first")
        return self._state

    def _change(
        self, apply: Callable[[_State], _State], initial: _State | None = None
    ) -> Published:
        state = apply(initial if initial is not None else self._require())
        previous = self.cache.snapshot
        served = served_version_keys(state.config)
        routable = self.beats.routable(state.replicas.values(), served)
        resources = build_resources(
            state.config,
            [r for r in state.replicas.values() if r.replica_id in routable],
            self.listener,
            state.injected,
            self.region,
        )
        candidate = new_snapshot(str(self._sequence + 1), resources, previous,
                                 external_clusters=BOOTSTRAP_CLUSTERS)
        published = Published(candidate, changed=True)
        if previous is not None and same_resources(previous, candidate):
            published = Published(previous, changed=False)
        else:
            self.cache.set_snapshot(candidate)  # raises InconsistentSnapshot: state stays
            self._sequence += 1
        if routable != self._routable:
            joined, left = sorted(routable - self._routable), sorted(self._routable - routable)
            log.info("routable replicas: joined %s, left %s", joined or "-", left or "-")
        self._state, self._routable = state, routable
        self.router.offer(self._router_candidate())
        return published

    async def watch_config(self, interval_s: float = 0.2) -> None:
        """Reload on config file changes; see :func:`envoy_control.state.watch.watch_config`."""
        await watch_config(self, interval_s)

    async def watch_beats(self, interval_s: float = 0.25, state_file: Path | None = None) -> None:
        """The heartbeat timer; see :func:`envoy_control.state.watch.watch_beats`."""
        await watch_beats(self, interval_s, state_file)

"""The control plane's state: declared config, replica set and debug injections, made snapshots.

Every change (a replica registered or removed, a config reloaded, a debug injection) builds a new
snapshot from the whole desired state and publishes it through the cache, which pushes it to
every connected Envoy. A change that leaves every resource as it was publishes nothing. A change
whose snapshot fails the consistency check is rolled back; an invalid config is refused; in both
cases the previous snapshot keeps serving.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from envoy_control.cache import SnapshotCache
from envoy_control.desired import ListenerSpec, build_resources
from envoy_control.replicas import Replica
from envoy_control.snapshot import Snapshot, new_snapshot, same_resources
from google.protobuf.message import Message

from modelfleet.config import ConfigError, PlatformConfig, Problem, load_config

log = logging.getLogger(__name__)

ConfigSignature = tuple[tuple[str, int, int], ...]


def config_signature(config_dir: Path) -> ConfigSignature:
    """Name, mtime (ns) and size of every ``*.yaml``/``*.yml`` file: changes when any file does."""
    out = []
    for path in sorted([*config_dir.glob("*.yaml"), *config_dir.glob("*.yml")]):
        try:
            st = path.stat()
        except FileNotFoundError:
            continue
        out.append((path.name, st.st_mtime_ns, st.st_size))
    return tuple(out)


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
    """Owns the desired state and publishes it to ``cache``. Call :meth:`load` first."""

    def __init__(
        self,
        config_dir: Path,
        cache: SnapshotCache,
        listener: ListenerSpec,
        region: str | None = None,
    ) -> None:
        self.config_dir = config_dir
        self.cache = cache
        self.listener = listener
        self.region = region
        self.warnings: list[Problem] = []
        self._state: _State | None = None
        self._sequence = 0
        self._signature: ConfigSignature = ()

    @property
    def config(self) -> PlatformConfig:
        """The config being served."""
        return self._require().config

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
        """Read the config directory and publish the first snapshot. Raises ConfigError."""
        self._signature = config_signature(self.config_dir)
        result = load_config(self.config_dir)
        self.warnings = result.warnings
        return self._change(lambda s: s, _State(result.config, {}, {}))

    def reload(self) -> Published:
        """Re-read the config directory; raises ConfigError (previous config keeps serving)."""
        self._signature = config_signature(self.config_dir)
        result = load_config(self.config_dir)
        self.warnings = result.warnings

        def apply(s: _State) -> _State:
            return _State(result.config, s.replicas, s.injected)

        return self._change(apply)

    def put_replica(self, replica: Replica) -> Published:
        """Register (or move) a replica."""
        return self._change(
            lambda s: _State(s.config, {**s.replicas, replica.replica_id: replica}, s.injected)
        )

    def delete_replica(self, replica_id: str) -> Published | None:
        """Remove a replica; None if it was not registered."""
        if replica_id not in self._require().replicas:
            return None
        rest = {k: v for k, v in self._require().replicas.items() if k != replica_id}
        return self._change(lambda s: _State(s.config, rest, s.injected))

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
        resources = build_resources(
            state.config, state.replicas.values(), self.listener, state.injected, self.region
        )
        candidate = new_snapshot(str(self._sequence + 1), resources, previous)
        if previous is not None and same_resources(previous, candidate):
            self._state = state
            return Published(previous, changed=False)
        self.cache.set_snapshot(candidate)  # raises InconsistentSnapshot: state stays as it was
        self._state = state
        self._sequence += 1
        return Published(candidate, changed=True)

    async def watch_config(self, interval_s: float = 0.2) -> None:
        """Reload whenever a config file changes, polling mtimes every ``interval_s`` seconds.

        Runs until cancelled. An invalid config is logged with its problems and not retried until
        the files change again.
        """
        while True:
            await asyncio.sleep(interval_s)
            signature = config_signature(self.config_dir)
            if signature == self._signature:
                continue
            try:
                published = self.reload()
            except ConfigError as exc:
                self._signature = signature
                log.error(
                    "config change refused, version %s keeps serving:\n%s",
                    self.snapshot.version,
                    "\n".join(str(p) for p in exc.problems),
                )
                continue
            except Exception:
                self._signature = signature
                log.exception(
                    "config change failed, version %s keeps serving", self.snapshot.version
                )
                continue
            log.info(
                "config reloaded from %s: snapshot %s%s",
                self.config_dir,
                published.snapshot.version,
                "" if published.changed else " (no resource changed)",
            )

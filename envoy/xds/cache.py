"""The snapshot cache: the one current snapshot, served to every Envoy, and who to tell on change.

Like go-control-plane's ``SnapshotCache.SetSnapshot``, a snapshot is checked for consistency
before it replaces the current one; a failed check leaves the current snapshot serving. One
snapshot serves every node: all Envoys of a region get the same configuration.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from envoy_control.xds.consistency import check_consistent
from envoy_control.xds.snapshot import SHORT_NAMES, Snapshot
from envoy_control.xds.status import XdsStatus

log = logging.getLogger(__name__)

Watcher = Callable[[Snapshot], None]


class SnapshotCache:
    """Holds the current snapshot and the streams watching it; ``status`` records ACKs/NACKs."""

    def __init__(
        self, status: XdsStatus | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        self.status = status if status is not None else XdsStatus(clock)
        self._clock = clock
        self._snapshot: Snapshot | None = None
        self._published_at: float | None = None
        self._watchers: list[Watcher] = []

    @property
    def snapshot(self) -> Snapshot | None:
        """The snapshot being served (None before the first one)."""
        return self._snapshot

    @property
    def published_at(self) -> float | None:
        """When the current snapshot was published (Unix seconds from the clock)."""
        return self._published_at

    def set_snapshot(self, snapshot: Snapshot) -> None:
        """Publish ``snapshot`` to every watcher after checking it for consistency.

        Raises :class:`envoy_control.xds.consistency.InconsistentSnapshot`; the current snapshot
        then stays.
        """
        check_consistent(snapshot)
        self._snapshot = snapshot
        self._published_at = self._clock()
        changed = ", ".join(
            f"{SHORT_NAMES[t]}={v}" for t, v in snapshot.versions.items() if v == snapshot.version
        )
        log.info("snapshot %s published (changed: %s)", snapshot.version, changed or "nothing")
        for watcher in list(self._watchers):
            watcher(snapshot)

    def watch(self, watcher: Watcher) -> Callable[[], None]:
        """Call ``watcher`` with each new snapshot; returns the function that stops watching."""
        self._watchers.append(watcher)

        def unwatch() -> None:
            if watcher in self._watchers:
                self._watchers.remove(watcher)

        return unwatch

    @property
    def watchers(self) -> int:
        """How many streams are watching."""
        return len(self._watchers)

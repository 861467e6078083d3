"""Requests each team has open (admitted or queued) on one model, against its ``max_concurrency``.

One counter per model, shared by the :class:`~gateway_ext.limits.admission.PoolAdmission` of each of its
pools (live, canary), since ``max_concurrency`` is per team and model, not per version.
"""

from __future__ import annotations


class TeamConcurrency:
    """Open requests per team (a count of requests)."""

    def __init__(self) -> None:
        self._open: dict[str, int] = {}

    def in_use(self, team: str) -> int:
        """Requests ``team`` has open."""
        return self._open.get(team, 0)

    def acquire(self, team: str) -> None:
        """One more open request for ``team``."""
        self._open[team] = self._open.get(team, 0) + 1

    def release(self, team: str) -> None:
        """One fewer open request for ``team`` (never below zero)."""
        left = self._open.get(team, 0) - 1
        if left > 0:
            self._open[team] = left
        else:
            self._open.pop(team, None)

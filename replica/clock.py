"""Clocks the engine reads: model seconds, never wall time directly."""

from __future__ import annotations

from typing import Protocol


class Clock(Protocol):
    """Something that tells the current model time in seconds."""

    def now(self) -> float:
        """Current model time, in seconds."""
        ...


class ManualClock:
    """A clock that moves only when told to: tests, the simulator and the server's driver."""

    def __init__(self, start_s: float = 0.0) -> None:
        self._now = start_s

    def now(self) -> float:
        """Current model time, in seconds."""
        return self._now

    def set(self, t_s: float) -> None:
        """Move to ``t_s`` seconds; a clock never goes back."""
        if t_s < self._now:
            raise ValueError(f"clock cannot go back from {self._now} to {t_s}")
        self._now = t_s

    def advance(self, dt_s: float) -> None:
        """Move ``dt_s`` seconds forward."""
        self.set(self._now + dt_s)

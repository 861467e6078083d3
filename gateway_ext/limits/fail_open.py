"""The fail-open window shared by every store that falls back from Redis to this process's memory
(buckets, sync and awaited: :mod:`gateway_ext.limits.fallback_store`,
:mod:`gateway_ext.limits.async_fallback_store`; conversation pins: :mod:`gateway_ext.routing.pins`,
:mod:`gateway_ext.routing.async_pins`): after a failed call the shared store is skipped for ``retry_s``
seconds, then tried again. One warning per outage, ``on_failure(op)`` at every failure (a metric).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

log = logging.getLogger(__name__)


class FailOpenWindow:
    """When the shared store is skipped; ``clock`` in seconds. ``fallback`` says in the warning
    what serves meanwhile (e.g. "per-process buckets")."""

    def __init__(self, fallback: str, clock: Callable[[], float], retry_s: float,
                 on_failure: Callable[[str], None] = lambda _op: None) -> None:
        self.fallback = fallback
        self.clock = clock
        self.retry_s = retry_s
        self.on_failure = on_failure
        self.down_until = float("-inf")

    @property
    def degraded(self) -> bool:
        """True while the shared store is being skipped."""
        return self.clock() < self.down_until

    def failed(self, op: str, exc: BaseException) -> None:
        """The shared store failed ``op`` with ``exc``: skip it for ``retry_s`` seconds."""
        if not self.degraded:
            log.warning("shared store unreachable (%s: %s): %s for %.1f s", op,
                        exc.__class__.__name__, self.fallback, self.retry_s)
        self.down_until = self.clock() + self.retry_s
        self.on_failure(op)

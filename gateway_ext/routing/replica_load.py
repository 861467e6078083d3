"""A replica's load as the picker sees it: its last report plus what this gateway sent it since
(pure; times are this process's monotonic seconds, passed in).

Reports come with the control plane's router state (each replica's heartbeat, at most once a
second per publication), so between two reports a burst of requests would all see the same old
figure and land on the same replica. :class:`SentLedger` remembers each request this gateway
routed (its reserved tokens: prompt estimate + max_tokens, the replica's own unit) until

* the request ends (its settle reached this process, or its client left): :meth:`remove`;
* a report arrives that must already count it: it was sent more than ``lag_s`` (2 s: a beat
  interval plus the publication throttle) before the report came in (:meth:`reported`);
* ``ttl_s`` passes (a settle that went to another gateway process while the control plane is
  down): :meth:`expire`.

Erring high (a request counted in the report and here for up to ``lag_s``) is deliberate: a
replica looks busier for a second, never idler than it is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

DEFAULT_LAG_S = 2.0
DEFAULT_TTL_S = 600.0


@dataclass(frozen=True, slots=True)
class Sent:
    """One request routed to ``replica`` at ``at`` (seconds) holding ``tokens`` (tokens)."""

    replica: str
    tokens: int
    at: float


class SentLedger:
    """Requests this gateway routed, per replica, not yet covered by a report."""

    def __init__(self, lag_s: float = DEFAULT_LAG_S, ttl_s: float = DEFAULT_TTL_S) -> None:
        self.lag_s, self.ttl_s = lag_s, ttl_s
        self._sent: dict[str, Sent] = {}
        self._per_replica: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._sent)

    def add(self, request_id: str, replica: str, tokens: int, now: float) -> None:
        """``request_id`` was routed to ``replica`` at ``now`` with ``tokens`` reserved."""
        self.remove(request_id)
        self._sent[request_id] = Sent(replica, tokens, now)
        self._per_replica[replica] = self._per_replica.get(replica, 0) + tokens

    def remove(self, request_id: str) -> None:
        """The request ended (or is counted elsewhere); unknown ids are ignored."""
        sent = self._sent.pop(request_id, None)
        if sent is not None:
            left = self._per_replica[sent.replica] - sent.tokens
            if left:
                self._per_replica[sent.replica] = left
            else:
                del self._per_replica[sent.replica]

    def reported(self, now: float) -> None:
        """A report arrived at ``now``: forget what it must already count."""
        self._drop(rid for rid, s in self._sent.items() if s.at < now - self.lag_s)

    def expire(self, now: float) -> None:
        """Forget requests older than ``ttl_s``."""
        self._drop(rid for rid, s in self._sent.items() if s.at < now - self.ttl_s)

    def _drop(self, ids: Iterable[str]) -> None:
        for rid in list(ids):
            self.remove(rid)

    def pending(self, replica: str) -> int:
        """Tokens sent to ``replica`` not yet in a report."""
        return self._per_replica.get(replica, 0)

    def loads(self, reported: Mapping[str, int]) -> dict[str, int]:
        """Load per replica of ``reported`` (tokens in flight from the last report): the report
        plus the tokens sent since."""
        return {r: tokens + self._per_replica.get(r, 0) for r, tokens in reported.items()}

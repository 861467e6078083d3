"""Settle reporting: when a request that gateway_ext admitted ends, report its real usage.

gateway_ext reserved the prompt estimate plus ``max_tokens`` from the team's token bucket and put
the reservation id on the request (``x-modelfleet-reservation``, with ``x-modelfleet-team`` and
``x-route-version``). When the request ends (finished, client gone, engine error, refused here)
the replica POSTs ``{reservation_id, team, model, version, prompt_tokens, cached_tokens,
completion_tokens, outcome}`` to gateway_ext's ``/v1/settle``; the gateway refunds what was not
used, frees the admission slot and meters the usage. A request without the header (sent to the
replica directly) reports nothing.

Off the hot path: :meth:`SettleReporter.report` only buffers the report; reports that end within
``linger_s`` of each other (or ``max_batch`` of them) go out in one POST ``{"reports": [...]}``,
which gateway_ext also accepts (a single report object is accepted too). A failed POST is retried
a bounded number of times with backoff, then dropped with a warning (the reservations then expire
on the gateway and count as fully used). Self-contained (httpx only) so it can move into the vLLM
middleware; the header names are gateway_ext's contract (``modelfleet.contract.headers``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Literal

import httpx

from modelfleet.contract.headers import (
    RESERVATION_HEADER,
    ROUTE_VERSION_HEADER,
    TEAM_HEADER,
    TIER_HEADER,
)

log = logging.getLogger(__name__)

Outcome = Literal["finished", "client_disconnect", "error", "rejected"]


@dataclass(frozen=True, slots=True)
class SettleReport:
    """What one reservation really used, in tokens, and how the request ended."""

    reservation_id: str
    team: str
    model: str
    version: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    outcome: Outcome
    tier: str = "standard"
    """The request's tier as the gateway admitted it (``x-modelfleet-tier``): metered with the
    usage when the settle lands on a gateway process that did not admit the request."""


def settle_report(headers: Mapping[str, str], prompt_tokens: int, cached_tokens: int,
                  completion_tokens: int, outcome: Outcome) -> SettleReport | None:
    """The report for a request with these (lower-case) headers, or None if the gateway did not
    admit it (no reservation header). Usage in tokens."""
    reservation = headers.get(RESERVATION_HEADER)
    if not reservation:
        return None
    model, _, version = (headers.get(ROUTE_VERSION_HEADER) or "").partition("@")
    return SettleReport(reservation, headers.get(TEAM_HEADER, ""), model, version,
                        prompt_tokens, cached_tokens, completion_tokens, outcome,
                        headers.get(TIER_HEADER) or "standard")


class SettleReporter:
    """POSTs reports to ``url`` in the background, batched: a batch leaves ``linger_s`` seconds
    after its first report or at ``max_batch`` reports; ``attempts`` tries per batch,
    ``backoff_s`` doubling between them, each bounded by ``timeout_s`` seconds."""

    def __init__(self, url: str, client: httpx.AsyncClient | None = None, attempts: int = 4,
                 backoff_s: float = 0.1, timeout_s: float = 2.0, linger_s: float = 0.02,
                 max_batch: int = 64) -> None:
        self.url = url
        self.client = client or httpx.AsyncClient(timeout=timeout_s)
        self.attempts = attempts
        self.backoff_s = backoff_s
        self.linger_s = linger_s
        self.max_batch = max_batch
        self.sent = 0
        """Reports the gateway answered (2xx or 4xx)."""
        self.dropped = 0
        """Reports given up after every attempt."""
        self._buffer: list[SettleReport] = []
        self._timer: asyncio.TimerHandle | None = None
        self._pending: set[asyncio.Task[None]] = set()

    def report(self, report: SettleReport) -> None:
        """Queue ``report`` for the next batch (returns at once; needs a running loop)."""
        self._buffer.append(report)
        if len(self._buffer) >= self.max_batch:
            self._flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.linger_s, self._flush)

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._buffer:
            return
        batch, self._buffer = self._buffer, []
        task = asyncio.get_running_loop().create_task(self._send(batch))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _send(self, batch: list[SettleReport]) -> None:
        body = {"reports": [asdict(r) for r in batch]}
        for attempt in range(self.attempts):
            try:
                r = await self.client.post(self.url, json=body)
                if r.status_code < 500:
                    if r.status_code >= 400:
                        log.warning("settle of %d reports refused: %s %s", len(batch),
                                    r.status_code, r.text[:200])
                    self.sent += len(batch)
                    return
            except httpx.HTTPError as exc:
                log.debug("settle of %d reports failed: %s", len(batch), exc)
            await asyncio.sleep(self.backoff_s * 2**attempt)
        self.dropped += len(batch)
        log.warning("settle of %d reports (%s, ...) dropped after %d attempts; the reservations "
                    "will expire", len(batch), batch[0].reservation_id, self.attempts)

    async def aclose(self, timeout_s: float = 5.0) -> None:
        """Send what is buffered, wait up to ``timeout_s`` seconds for batches in flight, then
        close the client."""
        self._flush()
        if self._pending:
            await asyncio.wait(set(self._pending), timeout=timeout_s)
        for task in self._pending:
            task.cancel()
        await self.client.aclose()

"""The pace and the reports of one running batch: its :class:`~batch.policy.Pacer`,
tier, deadline forecast, throttled count, and what it tells the world about them (the batch's
status fields through the lease renewal, logs, metrics). Decisions are the pure functions of
:mod:`batch.policy`; this class only keeps their state and reports it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from batch.context import RunContext
from batch.models import BatchRecord, BatchStatus, LineState, Risk
from batch.policy import Pacer, RateWindow, choose_tier, forecast
from batch.store import LineResult
from modelfleet.config import Tier

log = logging.getLogger(__name__)


class RunPace:
    """State of one run of ``rec`` by this worker."""

    def __init__(self, ctx: RunContext, rec: BatchRecord) -> None:
        self.ctx, self.rec = ctx, rec
        self.pacer = Pacer(ctx.settings.concurrency)
        self.tier: Tier = "standard" if rec.tier == "standard" else "batch"
        self.risk: Risk | None = rec.deadline_risk
        self.throttled_count = rec.throttled
        self.remaining = 0
        self.rate = RateWindow(ctx.clock())
        self._gauges = {"at_risk": False, "paused": False}

    def _gauge(self, name: str, on: bool) -> None:
        if self._gauges[name] != on:
            self._gauges[name] = on
            gauge = self.ctx.metrics.at_risk if name == "at_risk" else self.ctx.metrics.paused
            (gauge.labels(team=self.rec.team).inc if on else gauge.labels(team=self.rec.team).dec)()

    def start(self, pending: int) -> None:
        """Sending begins with ``pending`` lines left."""
        self.remaining = pending
        self.rate = RateWindow(self.ctx.clock())

    def sent(self) -> None:
        """One request went out at the current tier."""
        self.ctx.metrics.requests.labels(team=self.rec.team, model=self.rec.model,
                                         tier=self.tier).inc()

    def throttled(self, now: float, status: str, wait_s: float) -> None:
        """A 429/503 (or, ``status`` "unreachable", no connection to the API) at ``now``: the
        whole batch pauses ``wait_s`` seconds."""
        if not self.pacer.paused(now):
            log.info("batch %s: paused %.2f s (%s), window %.0f -> %.0f", self.rec.batch_id,
                     wait_s, status, self.pacer.window, max(1.0, self.pacer.window / 2))
        self.pacer.on_throttled(now, wait_s)
        self.throttled_count += 1
        self.ctx.metrics.throttled.labels(team=self.rec.team, model=self.rec.model,
                                          status=status).inc()
        self._gauge("paused", True)

    def ended(self, results: Sequence[LineResult]) -> None:
        """Lines got their results."""
        self.remaining -= len(results)
        self.rate.add(self.ctx.clock(), len(results))
        for r in results:
            outcome = "completed" if r.state is LineState.DONE else str(r.state)
            self.ctx.metrics.lines.labels(team=self.rec.team, model=self.rec.model,
                                          outcome=outcome).inc()

    async def tick(self, now: float) -> BatchStatus | None:
        """Forecast, choose the tier, renew the lease with the progress fields and read the
        status back; None if the lease was lost."""
        rec, settings = self.rec, self.ctx.settings
        left_s = rec.deadline - now
        risk = forecast(self.remaining, self.rate.rate(now), left_s,
                        min_lead_s=settings.risk_min_lead_s)
        if risk is not self.risk and (risk is Risk.AT_RISK or self.risk is not None):
            level = logging.WARNING if risk is Risk.AT_RISK else logging.INFO
            log.log(level, "batch %s: %s, %d lines left, %.0f s to the deadline",
                    rec.batch_id, risk, self.remaining, left_s)
        self.risk = risk
        self._gauge("at_risk", risk is Risk.AT_RISK)
        tier = choose_tier(self.tier, risk, left_s, settings.urgent_window_s,
                           self.ctx.tiers(rec.team, rec.model))
        if tier != self.tier:
            log.warning("batch %s: urgency raised, lines now sent at %s (%.0f s left)",
                        rec.batch_id, tier, left_s)
        self.tier = tier
        paused = self.pacer.paused(now)
        self._gauge("paused", paused)
        kept = await asyncio.to_thread(
            self.ctx.store.renew, rec.batch_id, settings.worker_id, now, settings.lease_s,
            deadline_risk=str(risk), tier=tier, throttled=self.throttled_count,
            paused_until=self.pacer.paused_until if paused else None)
        if not kept:
            log.warning("batch %s: lease lost to another worker; stopping", rec.batch_id)
            return None
        fresh = await asyncio.to_thread(self.ctx.store.get, rec.batch_id)
        return None if fresh is None else fresh.status

    def finish(self) -> None:
        """The run ended: this batch no longer counts in the gauges."""
        self._gauge("at_risk", False)
        self._gauge("paused", False)

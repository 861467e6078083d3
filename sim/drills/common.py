"""What every drill shares: the pool under test from the declared config, the run's options,
progress on stderr, and plain-text tables."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TextIO

from modelfleet.config.schema import PlatformConfig, Pool, Version
from replica.params import CHAT_7B, EngineParams
from replica.version_params import engine_params


@dataclass(frozen=True)
class PoolUnderTest:
    """The version a drill simulates: its engine, its load-tested tokens in flight per replica
    (tokens), and its pool record (replica bounds) in the first region that has one."""

    version: Version
    params: EngineParams
    capacity_tokens_per_replica: int
    pool: Pool | None


def pool_under_test(config: PlatformConfig, model: str = "chat-7b",
                    version: str | None = None) -> PoolUnderTest:
    """The live version of ``model`` (or ``version``) with its engine parameters, as
    ``modelfleet up`` would start it. Raises ``ValueError`` when it is not declared."""
    m = config.model(model)
    if m is None:
        raise ValueError(f"model {model!r} is not declared in the config")
    v = config.version(model, version or m.live)
    if v is None:
        raise ValueError(f"version {model}@{version or m.live} is not declared in the config")
    pool = next((p for p in config.pools if (p.model, p.version) == (v.model, v.version)), None)
    # As `modelfleet up` starts the replica: the chat-7b preset overridden by the version's fields.
    params = CHAT_7B.with_overrides(engine_params(v))
    return PoolUnderTest(v, params, v.capacity.tokens_in_flight, pool)


def with_capacity(put: PoolUnderTest, tokens_in_flight: int | None) -> PoolUnderTest:
    """``put`` with its load-tested tokens in flight per replica replaced (admission capacity
    and the autoscaler's target follow), e.g. by what the capacity gate measured; None: as is."""
    if tokens_in_flight is None:
        return put
    if tokens_in_flight <= 0:
        raise ValueError(f"tokens in flight per replica must be positive, got {tokens_in_flight}")
    capacity = put.version.capacity.model_copy(update={"tokens_in_flight": tokens_in_flight})
    version = put.version.model_copy(update={"capacity": capacity})
    return PoolUnderTest(version, put.params, tokens_in_flight, put.pool)


@dataclass(frozen=True)
class RunOptions:
    """Options every drill takes: the trace (preset name or file), mean rate (requests per
    second, None: the drill's default), seed, measured seconds and warm-up seconds."""

    trace: str = "chat"
    rate_rps: float | None = None
    seed: int = 1
    duration_s: float | None = None
    warmup_s: float | None = None
    capacity_tokens: int | None = None
    """Tokens in flight per replica for admission and the autoscaler (None: the version's)."""


@dataclass
class StderrProgress:
    """Prints ``label: 42% (126/300 s simulated, 9 s)`` lines to ``stream``, at most every
    ``every_s`` wall seconds."""

    label: str
    stream: TextIO = field(default_factory=lambda: sys.stderr)
    every_s: float = 2.0
    clock: Callable[[], float] = time.monotonic
    _t0: float = field(default=-1.0, init=False)
    _last: float = field(default=-1e9, init=False)

    def __call__(self, done_s: float, total_s: float) -> None:
        now = self.clock()
        if self._t0 < 0:
            self._t0 = now
        if now - self._last >= self.every_s:
            self._last = now
            share = 100 * done_s / total_s if total_s else 100.0
            print(f"{self.label}: {share:3.0f}% ({done_s:.0f}/{total_s:.0f} s simulated, "
                  f"{now - self._t0:.0f} s)", file=self.stream, flush=True)


def fmt(value: float | int | str | None, digits: int = 2) -> str:
    """A table cell: thousands separators for large numbers, ``-`` for None or NaN."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, str):
        return value
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    if isinstance(value, int) or abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain-text table: first column left-aligned, the others right-aligned."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True)))

    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])

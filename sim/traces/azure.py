"""The Azure LLM inference trace (CSV) and the conversations the simulator adds to it.

Format: ``TIMESTAMP,ContextTokens,GeneratedTokens``, wall-clock times with 100 ns digits. Times
become seconds from the first row. The trace has no conversations or prompt contents, so
:func:`add_conversations` adds them by a stated, seeded model (:class:`ConversationModel`):

* each request continues an open conversation with probability ``1 - 1 / turns`` (mean
  ``turns`` requests per conversation) and otherwise starts a new one;
* a continued conversation is drawn uniformly (up to 8 draws) among the open ones; it fits if
  its last request came ``min_gap_s`` to ``max_idle_s`` seconds earlier and its history (last
  prompt plus its answer) is shorter than this request's prompt, which then begins with that
  history (the trace's prompt length is kept); when no draw fits, a new conversation starts;
* optionally every prompt begins with one shared system prompt of ``system_tokens``.

Rates: :func:`sim.traces.arrivals.time_scaled` replays the trace faster; add conversations after
scaling, so think times are in replay seconds.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from sim.traces.arrivals import Arrival, block_base, runs_for

AZURE_CONV = Path("/work/shared/traces/azure_llm_2023_conv.csv")
"""Where the shared copy of the Azure conversation trace lives on this machine."""


def _azure_time(text: str) -> float:
    """Seconds since the epoch of ``2023-11-16 18:15:46.6805900`` (any number of digits)."""
    whole, _, frac = text.strip().partition(".")
    return datetime.fromisoformat(whole).timestamp() + (float("0." + frac) if frac else 0.0)


def read_azure_csv(path: str | Path, limit: int | None = None) -> list[Arrival]:
    """The first ``limit`` (default all) requests of an Azure trace file, in time order, times in
    seconds from the first row, without conversations. Raises ``ValueError`` on a bad row."""
    out: list[Arrival] = []
    with open(path, newline="") as f:
        header = f.readline().strip().split(",")
        if header[:3] != ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]:
            raise ValueError(f"{path}: not an Azure trace (header {header})")
        t0: float | None = None
        for line_no, line in enumerate(f, start=2):
            if limit is not None and len(out) >= limit:
                break
            if not line.strip():
                continue
            try:
                stamp, prompt, output = line.strip().split(",")[:3]
                t = _azure_time(stamp)
                a = Arrival(0.0, max(1, int(prompt)), max(1, int(output)))
            except ValueError as exc:
                raise ValueError(f"{path}:{line_no}: not an Azure trace row: {exc}") from exc
            t0 = t if t0 is None else t0
            out.append(replace(a, time_s=t - t0))
    out.sort(key=lambda a: a.time_s)
    return out


@dataclass(frozen=True)
class ConversationModel:
    """How :func:`add_conversations` groups requests: mean ``turns`` per conversation, the gap
    between two turns (seconds) and a shared system prompt (tokens, 0: none)."""

    turns: float = 5.0
    min_gap_s: float = 5.0
    max_idle_s: float = 600.0
    system_tokens: int = 0


class _Open:
    __slots__ = ("base", "history", "id", "last_s")

    def __init__(self, cid: str, base: int, last_s: float) -> None:
        self.id, self.base, self.history, self.last_s = cid, base, 0, last_s


def add_conversations(arrivals: Iterable[Arrival], model: ConversationModel, seed: int,
                      block_size: int = 16) -> Iterator[Arrival]:
    """``arrivals`` (in time order) with conversation ids, history and block runs; the same
    ``seed`` gives the same conversations."""
    rng = random.Random(seed)
    p_continue = 1.0 - 1.0 / max(1.0, model.turns)
    system = ((block_base("system", seed), model.system_tokens // block_size),)
    shared = system if model.system_tokens else ()
    live: list[_Open] = []
    for i, a in enumerate(arrivals):
        if i % 512 == 0:
            live = [c for c in live if a.time_s - c.last_s <= model.max_idle_s]
        chosen: _Open | None = None
        if live and rng.random() < p_continue:
            for _ in range(8):
                c = live[int(rng.random() * len(live))]
                if (model.min_gap_s <= a.time_s - c.last_s <= model.max_idle_s
                        and c.history < a.prompt_tokens):
                    chosen = c
                    break
        if chosen is None:
            chosen = _Open(f"conv-{i}", block_base("conversation", seed, i), a.time_s)
            live.append(chosen)
        runs = runs_for(shared, chosen.base, a.prompt_tokens + a.output_tokens, block_size)
        history = chosen.history
        chosen.history, chosen.last_s = a.prompt_tokens + a.output_tokens, a.time_s
        yield replace(a, conversation_id=chosen.id, blocks=runs, history_tokens=history)

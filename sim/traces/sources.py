"""Where a drill's arrivals come from: ``--trace NAME_OR_PATH`` and ``--rate``.

* ``chat`` / ``seed``: the synthetic presets of :mod:`sim.traces.synthetic` at ``rate_rps``;
* ``*.csv``: an Azure trace, replayed at ``rate_rps`` on average (times divided by the ratio of
  rates; looped end to end when the replay is longer than the trace), conversations added by
  :func:`sim.traces.azure.add_conversations` after scaling;
* ``*.jsonl``: a Mooncake trace, replayed at ``rate_rps`` on average, not looped (its prefix
  ids belong to one pass).

Teams and tiers come from the mix (:data:`sim.traces.arrivals.DEFAULT_MIX` unless given), except that
synthetic arrivals already carry theirs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

from sim.traces.arrivals import DEFAULT_MIX, Arrival, TeamMix, time_scaled, with_teams
from sim.traces.azure import ConversationModel, add_conversations, read_azure_csv
from sim.traces.mooncake import read_mooncake_jsonl
from sim.traces.synthetic import PRESETS, ChatWorkload, chat_arrivals


def _looped(trace: list[Arrival], until_s: float) -> Iterator[Arrival]:
    """``trace`` (times from 0) repeated end to end until ``until_s`` seconds."""
    if not trace:
        return
    span = trace[-1].time_s + (trace[-1].time_s / len(trace) if len(trace) > 1 else 1.0)
    offset = 0.0
    while True:
        for a in trace:
            t = a.time_s + offset
            if t >= until_s:
                return
            yield dataclasses.replace(a, time_s=t)
        offset += span


def mean_rate(trace: list[Arrival]) -> float:
    """Requests per second of a trace over its span (0 for fewer than two requests)."""
    if len(trace) < 2 or trace[-1].time_s <= trace[0].time_s:
        return 0.0
    return (len(trace) - 1) / (trace[-1].time_s - trace[0].time_s)


def arrivals(trace: str, rate_rps: float | None, duration_s: float, seed: int,
             mix: TeamMix = DEFAULT_MIX, block_size: int = 16,
             workload: ChatWorkload | None = None,
             conversations: ConversationModel | None = None) -> Iterator[Arrival]:
    """The arrivals of ``trace`` in ``[0, duration_s)`` seconds at ``rate_rps`` requests per
    second on average (None: the preset's or the trace's own rate). ``workload`` replaces a
    preset's other parameters. Raises ``ValueError`` for an unknown name or format."""
    if trace in PRESETS:
        w = workload or PRESETS[trace]
        if rate_rps is not None:
            w = dataclasses.replace(w, rate_rps=rate_rps)
        return chat_arrivals(w, duration_s, seed, mix, block_size)
    path = Path(trace)
    if path.suffix == ".csv":
        rows = read_azure_csv(path)
        factor = rate_rps / mean_rate(rows) if rate_rps and mean_rate(rows) else 1.0
        scaled = list(time_scaled(rows, factor))
        grouped = add_conversations(_looped(scaled, duration_s), conversations or ConversationModel(),
                                    seed, block_size)
        return with_teams(grouped, mix, seed)
    if path.suffix == ".jsonl":
        rows = read_mooncake_jsonl(path, block_size)
        factor = rate_rps / mean_rate(rows) if rate_rps and mean_rate(rows) else 1.0
        kept = (a for a in time_scaled(rows, factor) if a.time_s < duration_s)
        return with_teams(kept, mix, seed)
    known = ", ".join(sorted(PRESETS))
    raise ValueError(f"unknown trace {trace!r}: a preset ({known}), an Azure .csv or a Mooncake .jsonl")

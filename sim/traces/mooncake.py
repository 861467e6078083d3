"""The Mooncake FAST'25 trace format (JSONL): one request a line, ``timestamp`` (milliseconds),
``input_length`` and ``output_length`` (tokens), ``hash_ids`` (chained ids of the prompt's
512-token blocks: equal ids mean equal prefixes; the last block may be partial).

* Blocks: hash id ``h`` at position ``m`` covers prompt tokens ``512 m .. 512 m + 511`` and becomes
  ``512 / block_size`` engine block hashes; blocks that reach into the answer are unique to the
  request, as in a real prefix cache.
* ``history_tokens``: the prompt tokens covered by the leading hash ids that an earlier request of
  the trace already carried (a shared system prompt, a document, or the conversation's history).
* Routing key (the trace has no conversation id), a stated rule over the trace's prefix tree: the
  hash id right after the deepest id that has two or more different *full* successor blocks in
  the trace; every turn of a conversation, which extends the same chain, gets the same key. A
  first turn whose own part ends inside a partial block gets that block's id instead (the only
  id it has), so its second turn may start on another replica.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from sim.traces.arrivals import Arrival, block_base, runs_for

MOONCAKE_BLOCK_TOKENS = 512
"""Tokens per Mooncake hash id."""


def _row(data: Any, where: str) -> tuple[float, int, int, list[int]]:
    """``(timestamp ms, input, output, hash ids)`` of one parsed line; ``ValueError`` if malformed."""
    if not isinstance(data, dict):
        raise ValueError(f"{where}: a Mooncake line must be a JSON object")
    try:
        stamp, inp, out = float(data["timestamp"]), int(data["input_length"]), int(data["output_length"])
        ids = [int(h) for h in data.get("hash_ids", [])]
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{where}: not a Mooncake request: {exc}") from exc
    if inp < 1 or out < 1:
        raise ValueError(f"{where}: input_length and output_length must be positive")
    return stamp, inp, out, ids


def _full_ids(ids: list[int], input_tokens: int) -> int:
    """How many of ``ids`` are full 512-token blocks of a prompt of ``input_tokens``."""
    return min(len(ids), input_tokens // MOONCAKE_BLOCK_TOKENS)


def routing_keys(rows: list[tuple[float, int, int, list[int]]]) -> list[str | None]:
    """The routing key of each row (see the module docstring); None for a row without ids."""
    successors: dict[int, set[int]] = defaultdict(set)
    for _, inp, _, ids in rows:
        full = _full_ids(ids, inp)
        for j in range(1, full):
            successors[ids[j - 1]].add(ids[j])
    keys: list[str | None] = []
    for _, _, _, ids in rows:
        if not ids:
            keys.append(None)
            continue
        deepest = next((j for j in range(len(ids) - 2, -1, -1) if len(successors[ids[j]]) > 1), -1)
        keys.append(f"mc-{ids[deepest + 1]}")
    return keys


def read_mooncake_jsonl(path: str | Path, block_size: int = 16,
                        limit: int | None = None) -> list[Arrival]:
    """The first ``limit`` (default all) requests of a Mooncake trace, times in seconds from
    the first row, in time order. Raises ``ValueError`` on a malformed line."""
    if MOONCAKE_BLOCK_TOKENS % block_size:
        raise ValueError(f"block_size {block_size} must divide {MOONCAKE_BLOCK_TOKENS}")
    rows: list[tuple[float, int, int, list[int]]] = []
    with open(path) as f:
        for line_no, line in enumerate(f, start=1):
            if limit is not None and len(rows) >= limit:
                break
            if line.strip():
                try:
                    data = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{line_no}: invalid JSON: {exc}") from exc
                rows.append(_row(data, f"{path}:{line_no}"))
    rows.sort(key=lambda r: r[0])
    keys = routing_keys(rows)
    per_id = MOONCAKE_BLOCK_TOKENS // block_size
    seen: set[int] = set()
    t0 = rows[0][0] if rows else 0.0
    out: list[Arrival] = []
    for i, ((stamp, inp, outp, ids), key) in enumerate(zip(rows, keys, strict=True)):
        known = next((j for j, h in enumerate(ids) if h not in seen), len(ids))
        seen.update(ids)
        shared = [(block_base("mooncake", h), per_id) for h in ids]
        runs = runs_for(shared, block_base("mooncake-request", i), inp + outp, block_size,
                        shared_tokens=inp)
        out.append(Arrival((stamp - t0) / 1000.0, inp, outp, key, blocks=runs,
                           history_tokens=min(inp, known * MOONCAKE_BLOCK_TOKENS)))
    return out

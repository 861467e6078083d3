"""What the simulator replays: one request's arrival as plain data, and who sends it.

Every source (the Azure CSV, the Mooncake JSONL, the synthetic multi-turn generator) yields
:class:`Arrival` values in time order. A request's prompt is described by its prefix-cache
blocks rather than its text: ``blocks`` lists runs of consecutive block hashes ``(first, count)``
covering the full ``block_size``-token blocks of prompt plus output, which is exactly what
``replica.engine.EngineRequest.block_hashes`` needs. Runs keep an arrival small (a 4,000-token
conversation is two or three pairs, not 250 hashes) and expand in C (``range``).

A hash stands for the whole prefix up to its block, as in vLLM: a run's hashes are unique to
that content (a team's system prompt, one conversation's history), so two requests share a hash
only if they share everything before it.

Teams and tiers: a trace has neither, so :class:`TeamMix` assigns each conversation to a
``(team, tier)`` by a seeded hash of its id, in proportion to the mix's shares.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace

from modelfleet.config.schema import Tier

BlockRuns = tuple[tuple[int, int], ...]
"""Runs ``(first_hash, count)``: the hashes ``first_hash .. first_hash + count - 1`` in order."""


@dataclass(frozen=True, slots=True)
class Arrival:
    """One request reaching the gateway at ``time_s`` (seconds from the start of the replay).

    Tokens: ``prompt_tokens`` and ``output_tokens`` (what the answer will be), ``max_tokens`` the
    client's reservation (0: equal to ``output_tokens``). ``history_tokens``: prompt tokens an
    earlier request of the same conversation computed (its reusable history; found only on a
    replica that served that conversation). ``conversation_id`` None: no affinity key.
    """

    time_s: float
    prompt_tokens: int
    output_tokens: int
    conversation_id: str | None = None
    team: str = ""
    tier: Tier = "standard"
    blocks: BlockRuns = ()
    history_tokens: int = 0
    max_tokens: int = 0
    model: str = "chat-7b"

    @property
    def reserve_max_tokens(self) -> int:
        """The ``max_tokens`` the gateway reserves (tokens)."""
        return self.max_tokens or self.output_tokens


def expand(blocks: BlockRuns) -> tuple[int, ...]:
    """The block hashes of ``blocks``, in order."""
    if len(blocks) == 1:
        first, count = blocks[0]
        return tuple(range(first, first + count))
    return tuple(itertools.chain.from_iterable(range(f, f + c) for f, c in blocks))


def block_base(*parts: object) -> int:
    """A stable 62-bit starting hash for a run named by ``parts`` (runs of different names
    overlap with negligible probability: a run holds at most a few thousand hashes)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 2


def runs_for(shared: Sequence[tuple[int, int]], own_base: int, total_tokens: int,
             block_size: int, shared_tokens: int | None = None) -> BlockRuns:
    """Runs covering the full blocks of ``total_tokens`` tokens: first the ``shared`` runs (as far
    as they reach, and within the first ``shared_tokens`` tokens if given), then blocks of
    ``own_base`` numbered by their position in the sequence."""
    full = total_tokens // block_size
    limit = full if shared_tokens is None else min(full, shared_tokens // block_size)
    out: list[tuple[int, int]] = []
    used = 0
    for first, count in shared:
        take = min(count, limit - used)
        if take <= 0:
            break
        out.append((first, take))
        used += take
    if full > used:
        out.append((own_base + used, full - used))
    return tuple(out)


@dataclass(frozen=True)
class TeamShare:
    """A share (0..1] of conversations sent by ``team`` at ``tier``."""

    team: str
    tier: Tier
    share: float


@dataclass(frozen=True)
class TeamMix:
    """Who sends the conversations. Shares are normalised, so they need not sum to 1."""

    shares: tuple[TeamShare, ...]

    def __post_init__(self) -> None:
        if not self.shares or any(s.share <= 0 for s in self.shares):
            raise ValueError("a team mix needs at least one positive share")

    def assign(self, key: str, seed: int) -> tuple[str, Tier]:
        """The ``(team, tier)`` of conversation (or request) ``key``: a seeded hash, so every
        turn of a conversation comes from the same team and tier."""
        digest = hashlib.blake2b(f"{seed}/{key}".encode(), digest_size=8).digest()
        u = int.from_bytes(digest, "big") / 2**64 * sum(s.share for s in self.shares)
        for s in self.shares:
            u -= s.share
            if u < 0:
                return s.team, s.tier
        return self.shares[-1].team, self.shares[-1].tier


DEFAULT_MIX = TeamMix((
    TeamShare("search", "interactive", 0.45),
    TeamShare("search", "standard", 0.15),
    TeamShare("support", "interactive", 0.15),
    TeamShare("support", "standard", 0.10),
    TeamShare("support", "batch", 0.05),
    TeamShare("research", "standard", 0.07),
    TeamShare("research", "batch", 0.03),
))
"""The config's three teams at 60 / 30 / 10% of the traffic, each about 90% of its chat-7b token
limit at the seed's peak (100 requests/s of 1,500 tokens), on the tiers each may use."""


def with_teams(arrivals: Iterable[Arrival], mix: TeamMix, seed: int) -> Iterator[Arrival]:
    """``arrivals`` with team and tier assigned by ``mix`` (per conversation, else per request)."""
    for i, a in enumerate(arrivals):
        team, tier = mix.assign(a.conversation_id or f"request-{i}", seed)
        yield replace(a, team=team, tier=tier)


def time_scaled(arrivals: Iterable[Arrival], factor: float) -> Iterator[Arrival]:
    """``arrivals`` with every time divided by ``factor`` (2.0: twice the rate)."""
    if factor <= 0:
        raise ValueError(f"the rate factor must be positive, got {factor}")
    for a in arrivals:
        yield replace(a, time_s=a.time_s / factor)


def window(arrivals: Iterable[Arrival], start_s: float, end_s: float) -> Iterator[Arrival]:
    """The arrivals in ``[start_s, end_s)`` seconds, shifted so that ``start_s`` becomes 0."""
    for a in arrivals:
        if a.time_s >= end_s:
            return
        if a.time_s >= start_s:
            yield replace(a, time_s=a.time_s - start_s)

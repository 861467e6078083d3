"""A seeded synthetic multi-turn chat workload: conversations, turns, think times, a shared
system prompt per team and a growing history.

Model (every number a field of :class:`ChatWorkload`, the defaults the seed's peak):

* conversations start as a Poisson process at ``rate_rps / turns`` per second, each with
  ``turns`` turns, so requests arrive at ``rate_rps`` per second;
* the next message comes an answer's time (``answer_overhead_s`` + output / ``stream_tokens_per_s``)
  plus an exponential think time (mean ``think_s``) after the previous one: with the defaults a
  user writes every 0.5 + 10 + 29.5 = 40 s, the seed's figure;
* ``history=True`` (preset ``chat``): turn k's prompt is the team's system prompt
  (``system_tokens``, shared by all its conversations), the whole history (every earlier prompt
  and answer) and a new message of ``user_tokens`` (uniform within ``user_spread``); the defaults
  give prompts of 400, 800, 1,200, 1,600 and 2,000 tokens, 1,200 on average, and 300-token
  answers (uniform within ``output_spread``): the seed's 1,200 and 300;
* ``history=False`` (preset ``seed``): the seed's assumption as written, each prompt is the
  conversation's fixed opening of ``prefix_tokens`` (800) plus ``user_tokens`` (400) new tokens,
  so 4 requests in 5 can find an 800-token prefix;
* the replay starts in steady state: conversations begun before time 0 contribute their later
  turns (their earlier ones never ran, so the caches start cold: measure after a warm-up).
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass

from sim.traces.arrivals import DEFAULT_MIX, Arrival, TeamMix, block_base, runs_for


@dataclass(frozen=True)
class ChatWorkload:
    """Parameters of the synthetic workload; units in the names (tokens, seconds, per second)."""

    rate_rps: float = 100.0
    turns: int = 5
    think_s: float = 29.5
    answer_overhead_s: float = 0.5
    stream_tokens_per_s: float = 30.0
    system_tokens: int = 300
    user_tokens: int = 100
    user_spread: float = 0.5
    """Messages vary uniformly by this share of ``user_tokens`` either way."""
    output_tokens: int = 300
    output_spread: int = 100
    history: bool = True
    prefix_tokens: int = 800
    """With ``history=False``: the conversation's fixed opening, tokens."""
    max_tokens: int = 0
    """The client's ``max_tokens``; 0: exactly the answer's length."""
    model: str = "chat-7b"
    profile: tuple[tuple[float, float], ...] = ()
    """``(time_s, multiplier)`` points: new conversations start at ``rate_rps / turns`` times the
    multiplier, interpolated linearly between points (1 before the first, the last after it).
    Requests follow as the conversations progress, over one conversation's length."""

    def __post_init__(self) -> None:
        if self.rate_rps <= 0 or self.turns < 1 or self.think_s < 0:
            raise ValueError("need rate_rps > 0, turns >= 1 and think_s >= 0")
        if self.output_tokens - self.output_spread < 1 or self.user_tokens < 1:
            raise ValueError("every answer and message needs at least one token")

    def multiplier(self, t_s: float) -> float:
        """The rate multiplier at ``t_s`` seconds (see ``profile``)."""
        points = self.profile
        if not points or t_s <= points[0][0]:
            return points[0][1] if points else 1.0
        for (t0, m0), (t1, m1) in itertools.pairwise(points):
            if t_s <= t1:
                return m0 + (m1 - m0) * (t_s - t0) / (t1 - t0) if t1 > t0 else m1
        return points[-1][1]

    @property
    def mean_prompt_tokens(self) -> float:
        """Mean prompt tokens per request (1,200 for both presets)."""
        if not self.history:
            return float(self.prefix_tokens + self.user_tokens)
        return (self.system_tokens + self.user_tokens
                + (self.turns - 1) / 2 * (self.user_tokens + self.output_tokens))

    @property
    def mean_gap_s(self) -> float:
        """Mean seconds between two messages of one conversation."""
        return self.answer_overhead_s + self.output_tokens / self.stream_tokens_per_s + self.think_s


CHAT = ChatWorkload()
"""Growing history with a shared system prompt, at the seed's peak (100 requests/s)."""
SEED = ChatWorkload(system_tokens=0, user_tokens=400, user_spread=0.0, history=False)
"""The seed's request shape as written: an 800-token conversation prefix plus 400 new tokens."""
PRESETS = {"chat": CHAT, "seed": SEED}


def _uniform_int(rng: random.Random, spread: int) -> int:
    """A whole number uniform in ``[-spread, spread]`` (cheaper than ``randint``)."""
    return int(rng.random() * (2 * spread + 1)) - spread if spread else 0


def _conversation(w: ChatWorkload, index: int, start_s: float, rng: random.Random,
                  mix: TeamMix, seed: int, block_size: int, prefix: str) -> list[Arrival]:
    """Every turn of conversation ``index``, which starts at ``start_s`` seconds."""
    cid = f"{prefix}-{index}"
    team, tier = mix.assign(cid, seed)
    own = block_base("conversation", seed, prefix, index)
    system = ((block_base("system", seed, team), w.system_tokens // block_size),)
    out: list[Arrival] = []
    t, history = start_s, 0
    for k in range(w.turns):
        user = w.user_tokens + _uniform_int(rng, int(w.user_tokens * w.user_spread))
        answer = w.output_tokens + _uniform_int(rng, w.output_spread)
        if w.history:
            prompt = (w.system_tokens if k == 0 else history) + user
            runs = runs_for(system if w.system_tokens else (), own, prompt + answer, block_size)
            reused = history
            history = prompt + answer
        else:
            prompt = w.prefix_tokens + user
            opening = ((own, w.prefix_tokens // block_size),)
            runs = runs_for(opening, block_base("request", seed, prefix, index, k),
                            prompt + answer, block_size)
            reused = w.prefix_tokens if k else 0
        if t >= 0:
            out.append(Arrival(t, prompt, answer, cid, team, tier, runs, reused, w.max_tokens,
                               w.model))
        think = rng.expovariate(1 / w.think_s) if w.think_s else 0.0
        t += w.answer_overhead_s + answer / w.stream_tokens_per_s + think
    return out


def chat_arrivals(w: ChatWorkload, duration_s: float, seed: int, mix: TeamMix = DEFAULT_MIX,
                  block_size: int = 16, prefix: str = "conv") -> Iterator[Arrival]:
    """The workload's arrivals in ``[0, duration_s)`` seconds, in time order; the same ``seed``
    gives the same arrivals. Conversation ids are ``{prefix}-{n}``: two workloads replayed
    together need different prefixes."""
    rng = random.Random(seed)
    # Thinning: candidate starts at the highest rate, each kept with probability rate(t) / top.
    top = max([1.0] + [m for _, m in w.profile])
    conversation_rate = w.rate_rps / w.turns * top
    lead_s = 2 * (w.turns - 1) * w.mean_gap_s
    next_start = -lead_s + rng.expovariate(conversation_rate)
    heap: list[tuple[float, int, Arrival]] = []
    index = order = 0
    while True:
        while not heap or next_start <= heap[0][0]:
            if not w.profile or rng.random() * top < w.multiplier(next_start):
                for a in _conversation(w, index, next_start, rng, mix, seed, block_size, prefix):
                    heapq.heappush(heap, (a.time_s, order, a))
                    order += 1
                index += 1
            next_start += rng.expovariate(conversation_rate)
        t, _, arrival = heapq.heappop(heap)
        if t >= duration_s:
            return
        yield arrival

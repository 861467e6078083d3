"""Deterministic answers: what a simulated request generates, decided when it arrives (pure).

The text is a sequence of English words and punctuation drawn from a generator seeded by the
prompt's tokens and the seed (the request's ``seed``, else the replica's). At temperature 0
(greedy) the seed is ignored: the answer depends on the prompt alone. Same prompt, seed and
temperature: same answer, token for token.

Length: unless ``max_tokens`` or a stop string ends it first, an answer is 100 to 500 tokens
(uniform, mean 300, the seed's answer length), the last of which is the end-of-answer token
``<|im_end|>``, which counts as an output token but adds no text (as in vLLM). ``ignore_eos``
generates exactly ``max_tokens``; ``min_tokens`` delays the end token and the stop strings.

Stop strings end the answer at the first token whose text completes one; the stop string and
anything after it are cut from the text (``finish_reason`` "stop", ``stop_reason`` the string).
While stop strings are set, streamed text is held back by the longest one's length minus one
character, so a stop string is never half-sent, as vLLM's detokenizer does.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

from modelfleet.contract.tokens import EOS_TOKEN_ID, digest, token_id

MIN_NATURAL_TOKENS = 100
MAX_NATURAL_TOKENS = 500

_WORDS = ["the", "of", "and", "to", "in", "is", "that", "it", "for", "on", "with", "as", "was", "be", "by", "this", "are", "at", "from", "or", "have", "an", "they", "which", "one", "you", "were", "all", "we", "can", "there", "use", "each", "how", "their", "if", "will", "up", "other", "about", "out", "many", "then", "them", "these", "so", "some", "would", "make", "like", "into", "time", "has", "look", "two", "more", "write", "go", "see", "number", "way", "could", "people", "than", "first", "water", "been", "call", "who", "find", "long", "down", "day", "did", "get", "come", "made", "may", "part", "model", "token", "cache", "replica", "request", "stream", "batch", "memory", "prompt", "answer", "region", "version", "queue", "latency", "capacity", "team", "route", "scale", "load", "signal", "value", "system", "during", "before", "after", "under", "over", "between"]

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class OutputPlan:
    """One request's whole answer, fixed on arrival; the engine decides only when it appears."""

    token_ids: tuple[int, ...]
    """Every output token, the end token included."""
    deltas: tuple[str, ...]
    """Text released with each output token; their concatenation is ``text``."""
    text: str
    finish_reason: FinishReason
    stop_reason: str | None = None
    """The stop string that ended the answer, if one did."""

    @property
    def num_tokens(self) -> int:
        """Output tokens, counted as ``completion_tokens``."""
        return len(self.token_ids)


def natural_length(prompt_ids: Sequence[int], seed: int, temperature: float) -> int:
    """Output tokens the answer would have without limits (100..500, end token included)."""
    rng = random.Random(_seed_key(prompt_ids, seed, temperature) ^ 0x5EED)
    return rng.randint(MIN_NATURAL_TOKENS, MAX_NATURAL_TOKENS)


def plan_output(
    prompt_ids: Sequence[int],
    *,
    max_tokens: int,
    seed: int,
    temperature: float = 1.0,
    stop: Sequence[str] = (),
    ignore_eos: bool = False,
    min_tokens: int = 0,
) -> OutputPlan:
    """The answer to a prompt of ``prompt_ids`` token ids, at most ``max_tokens`` tokens."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
    stops = tuple(s for s in stop if s)
    eos_at: int | None = None
    if not ignore_eos:
        eos_at = max(natural_length(prompt_ids, seed, temperature), min_tokens + 1)
    words = _words(random.Random(_seed_key(prompt_ids, seed, temperature)))
    ids: list[int] = []
    texts: list[str] = []  # text so far after each token
    text = ""
    finish: FinishReason = "length"
    stop_reason: str | None = None
    for i in range(max_tokens):
        if eos_at is not None and i == eos_at - 1:
            ids.append(EOS_TOKEN_ID)
            texts.append(text)
            finish = "stop"
            break
        word = "." if eos_at is not None and i == eos_at - 2 else next(words)
        ids.append(token_id(word))
        before = len(text)
        text += word if (not text or not word[0].isalnum()) else " " + word
        texts.append(text)
        if stops and i + 1 >= min_tokens:
            cut = _first_stop(text, before, stops)
            if cut is not None:
                text, stop_reason = text[: cut[0]], cut[1]
                finish = "stop"
                break
    hold = max((len(s) for s in stops), default=1) - 1
    return OutputPlan(tuple(ids), _deltas(texts, text, hold), text, finish, stop_reason)


def _seed_key(prompt_ids: Sequence[int], seed: int, temperature: float) -> int:
    if temperature <= 0:
        return digest(prompt_ids, "greedy")
    return digest(prompt_ids, seed, round(temperature, 6))


def _words(rng: random.Random) -> Iterator[str]:
    """An endless run of sentences of 5 to 14 words."""
    while True:
        n = rng.randint(5, 14)
        for j in range(n):
            word = rng.choice(_WORDS)
            yield word.capitalize() if j == 0 else word
            if 0 < j < n - 1 and rng.random() < 0.08:
                yield ","
        yield "."


def _first_stop(text: str, before: int, stops: Sequence[str]) -> tuple[int, str] | None:
    """Earliest (position, stop string) completed by the text added after ``before``."""
    best: tuple[int, str] | None = None
    for s in stops:
        pos = text.find(s, max(0, before - len(s) + 1))
        if pos >= 0 and (best is None or pos < best[0]):
            best = (pos, s)
    return best


def _deltas(texts: list[str], final: str, hold: int) -> tuple[str, ...]:
    """Per-token text releases: all but the last hold back ``hold`` characters."""
    out: list[str] = []
    sent = 0
    for i, t in enumerate(texts):
        visible = final if i == len(texts) - 1 else t[: max(sent, len(t) - hold)]
        out.append(visible[sent:])
        sent = len(visible)
    return tuple(out)

"""The LLM judge of the gate (pure): its prompt, the parsing of its reply, scores per category.

With ``modelfleet gate --judge MODEL[@V]`` every answer of both versions is also shown to a
judge, itself a model served by the platform, with this prompt (system, then user)::

    [modelfleet-judge/1] You grade answers. Rate how well the ANSWER responds to the QUESTION,
    using the REFERENCE when one is given. Reply on one line in the form "SCORE: N" with N an
    integer from 1 (wrong or useless) to 10 (fully correct and complete), then at most one
    sentence of reasons.

    QUESTION:
    <the item's last user message>
    REFERENCE:
    <the item's expected text, or the item's "reference" field when set>
    ANSWER:
    <the version's answer>

The first line's marker lets the simulated replica answer it (:mod:`replica.judge`). The reply
is parsed by :func:`parse_score`; a reply without a score in range is counted as unparseable and
reported, never fatal. A judge score of N counts as the share ``(N - 1) / 9`` (0..1), so the same
drop rule as the task metrics (2 points = 0.02) applies per category.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from modelfleet.release.eval import SEED_CATEGORIES, EvalItem

JUDGE_MARKER = "[modelfleet-judge/1]"
JUDGE_SYSTEM = (
    f"{JUDGE_MARKER} You grade answers. Rate how well the ANSWER responds to the QUESTION, "
    "using the REFERENCE when one is given. Reply on one line in the form \"SCORE: N\" with N an "
    "integer from 1 (wrong or useless) to 10 (fully correct and complete), then at most one "
    "sentence of reasons."
)
SCORE_MIN, SCORE_MAX = 1, 10
JUDGE_MAX_TOKENS = 64
"""Tokens the judge may write: the score line and a sentence."""

_SCORE = re.compile(r"\bscore\b\**\s*(?:[:=]|is)?\s*\**\s*(-?\d+(?:\.\d+)?)\s*(?:/\s*(\d+))?",
                    re.IGNORECASE)
_FRACTION = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)\s*/\s*10\b")


def judge_messages(item: EvalItem, answer: str) -> list[dict[str, str]]:
    """The chat messages asking the judge to score ``answer`` to ``item``."""
    question = item.messages[-1]["content"] if item.messages else ""
    reference = item.reference if item.reference is not None else item.expected
    return [{"role": "system", "content": JUDGE_SYSTEM},
            {"role": "user", "content": f"QUESTION:\n{question}\nREFERENCE:\n{reference}\n"
                                        f"ANSWER:\n{answer}"}]


def _in_range(value: float, scale: float = SCORE_MAX) -> float | None:
    if scale <= 0:
        return None
    value = value * SCORE_MAX / scale
    return value if SCORE_MIN <= value <= SCORE_MAX else None


def parse_score(reply: str) -> float | None:
    """The judge's score 1..10 in ``reply``, or None when it has none in range.

    Accepted, first match wins: ``SCORE: N`` (any case, ``=``/``is``/markdown bold allowed,
    ``N/10`` or ``N/5`` rescaled to 10), a JSON object with ``score``, a bare ``N/10``, or a
    reply that is only a number."""
    text = reply.strip()
    m = _SCORE.search(text)
    if m:
        return _in_range(float(m.group(1)), float(m.group(2) or SCORE_MAX))
    start, end = text.find("{"), text.rfind("}")
    if 0 <= start < end:
        try:
            data = json.loads(text[start:end + 1])
        except ValueError:
            data = None
        if isinstance(data, dict) and isinstance(data.get("score"), int | float):
            return _in_range(float(data["score"]))
    if m := _FRACTION.search(text):
        return _in_range(float(m.group(1)))
    try:
        return _in_range(float(text.rstrip(".")))
    except ValueError:
        return None


def as_share(score: float) -> float:
    """A 1..10 judge score as a share 0..1."""
    return (score - SCORE_MIN) / (SCORE_MAX - SCORE_MIN)


@dataclass(frozen=True)
class JudgeScore:
    """Judge scores of one category: the mean share 0..1 of the parsed ones (``score``), how
    many were parsed, and how many replies had no score."""

    category: str
    total: float
    parsed: int
    unparseable: int

    @property
    def score(self) -> float | None:
        """Mean share 0..1 over parsed replies, None when none parsed."""
        return self.total / self.parsed if self.parsed else None

    @property
    def mean_1_to_10(self) -> float | None:
        """The mean score on the judge's own 1..10 scale."""
        return None if self.score is None else SCORE_MIN + self.score * (SCORE_MAX - SCORE_MIN)


def judge_scores(items: Sequence[EvalItem], replies: Mapping[str, str]) -> dict[str, JudgeScore]:
    """Per category (the seed's three always listed) and ``all``: judge replies by item id
    scored; an item without a reply is left out, one without a score counts as unparseable."""
    cats = list(dict.fromkeys([*SEED_CATEGORIES, *(i.category for i in items)]))
    parsed = {i.id: parse_score(replies[i.id]) for i in items if i.id in replies}

    def tally(name: str, members: Sequence[EvalItem]) -> JudgeScore:
        got = [parsed[i.id] for i in members if i.id in parsed]
        ok = [as_share(s) for s in got if s is not None]
        return JudgeScore(name, sum(ok), len(ok), len(got) - len(ok))

    out = {c: tally(c, [i for i in items if i.category == c]) for c in cats}
    out["all"] = tally("all", items)
    return out

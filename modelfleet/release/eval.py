"""The quality half of the gate (pure): an eval set, its task-metric scorers, scores per
category, and the comparison of a new version with the live one.

An eval set is JSONL, one item a line::

    {"id": "m-001", "category": "maths", "prompt": "What is 17 x 23?", "expected": "391",
     "scorer": "contains", "max_tokens": 64}

``messages`` (chat messages) may replace ``prompt``; ``reference`` (optional) is the answer
shown to the LLM judge instead of ``expected`` (:mod:`modelfleet.release.judge`). ``category`` is free text; the seed asks for
separate scores for ``reasoning``, ``maths`` and ``long`` (long outputs), reported even when
the set has none. Scorers: ``exact`` (equal after trimming, case folding and collapsing
whitespace), ``contains`` (the expected text appears, same normalisation), ``regex``
(``re.search`` of the expected pattern, dot matches newlines).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

Scorer = Literal["exact", "contains", "regex"]
SCORERS: tuple[Scorer, ...] = ("exact", "contains", "regex")
SEED_CATEGORIES = ("reasoning", "maths", "long")


@dataclass(frozen=True)
class EvalItem:
    """One prompt of the eval set and how its answer is scored."""

    id: str
    category: str
    messages: tuple[Mapping[str, str], ...]
    expected: str
    scorer: Scorer = "contains"
    max_tokens: int = 512
    reference: str | None = None
    """A reference answer shown to the LLM judge (default: ``expected``; set it for regex items)."""


class EvalSetError(ValueError):
    """The eval set file is malformed; the message names the line."""


def _norm(text: str) -> str:
    return " ".join(text.casefold().split())


def score(item: EvalItem, answer: str) -> bool:
    """Does ``answer`` pass ``item``'s scorer?"""
    if item.scorer == "exact":
        return _norm(answer) == _norm(item.expected)
    if item.scorer == "contains":
        return _norm(item.expected) in _norm(answer)
    return re.search(item.expected, answer, re.DOTALL) is not None


def parse_item(data: Mapping[str, Any], where: str) -> EvalItem:
    """One item from its JSON object; raises :class:`EvalSetError`."""
    try:
        if "messages" in data:
            messages = tuple({"role": str(m["role"]), "content": str(m["content"])}
                             for m in data["messages"])
        else:
            messages = ({"role": "user", "content": str(data["prompt"])},)
        scorer = data.get("scorer", "contains")
        if scorer not in SCORERS:
            raise EvalSetError(f"{where}: scorer must be one of {', '.join(SCORERS)}, not {scorer!r}")
        if scorer == "regex":
            re.compile(str(data["expected"]))
        return EvalItem(str(data["id"]), str(data.get("category", "general")), messages,
                        str(data["expected"]), scorer, int(data.get("max_tokens", 512)),
                        None if data.get("reference") is None else str(data["reference"]))
    except (KeyError, TypeError, ValueError, re.error) as exc:
        if isinstance(exc, EvalSetError):
            raise
        raise EvalSetError(f"{where}: {exc.__class__.__name__}: {exc}") from None


def load_eval_set(path: Path) -> list[EvalItem]:
    """Every item of the JSONL file at ``path`` (blank lines skipped); ids must be unique."""
    items: list[EvalItem] = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            raise EvalSetError(f"{path}:{n}: not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise EvalSetError(f"{path}:{n}: each line must be a JSON object")
        items.append(parse_item(data, f"{path}:{n}"))
    ids = [i.id for i in items]
    if len(set(ids)) != len(ids):
        raise EvalSetError(f"{path}: duplicate ids")
    if not items:
        raise EvalSetError(f"{path}: empty eval set")
    return items


@dataclass(frozen=True)
class CategoryScore:
    """Passed items over scored items of one category (``score`` None when it has none)."""

    category: str
    passed: int
    total: int

    @property
    def score(self) -> float | None:
        """Share 0..1 of items passed."""
        return self.passed / self.total if self.total else None


def scores(items: Sequence[EvalItem], passed: Mapping[str, bool]) -> dict[str, CategoryScore]:
    """Per category (the seed's three always listed) and ``all``: items passed of those scored
    (an item missing from ``passed`` was not answered and counts as failed)."""
    cats = list(dict.fromkeys([*SEED_CATEGORIES, *(i.category for i in items)]))
    out = {c: CategoryScore(c, sum(passed.get(i.id, False) for i in items if i.category == c),
                            sum(i.category == c for i in items)) for c in cats}
    out["all"] = CategoryScore("all", sum(passed.get(i.id, False) for i in items), len(items))
    return out


@dataclass(frozen=True)
class QualityVerdict:
    """The new version against the reference, per category; ``drops`` name the failures."""

    passed: bool
    new: dict[str, float | None]
    reference: dict[str, float | None]
    drops: tuple[str, ...] = field(default=())

    def as_dict(self) -> dict[str, Any]:
        """Plain data (saved with the version)."""
        return asdict(self)


class Scored(Protocol):
    """A category's score as a share 0..1 (None: nothing scored)."""

    @property
    def score(self) -> float | None: ...


def compare(new: Mapping[str, Scored], reference: Mapping[str, Scored],
            max_drop: float = 0.02) -> QualityVerdict:
    """Fail when any category's score drops by more than ``max_drop`` (share, 0.02 = 2 points)
    against the reference version on the same prompts."""
    drops = []
    for cat, mine in new.items():
        ref = reference.get(cat)
        if mine.score is None or ref is None or ref.score is None:
            continue
        if ref.score - mine.score > max_drop + 1e-12:
            drops.append(f"{cat}: {mine.score:.1%} vs {ref.score:.1%} "
                         f"({(mine.score - ref.score) * 100:+.1f} points, limit -{max_drop * 100:g})")
    return QualityVerdict(not drops, {c: s.score for c, s in new.items()},
                          {c: s.score for c, s in reference.items()}, tuple(drops))


def passed_map(items: Iterable[EvalItem], answers: Mapping[str, str]) -> dict[str, bool]:
    """Item id -> passed, for the items answered."""
    return {i.id: score(i, answers[i.id]) for i in items if i.id in answers}

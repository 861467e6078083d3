"""The simulated replica as an LLM judge (pure): a deterministic score for a judge prompt.

A simulated model writes random words (:mod:`replica.generation`), so on its own it cannot act
as the judge of ``modelfleet gate --judge``. A real instruction-following model given the
gate's judge prompt answers ``SCORE: N`` (N from 1 to 10) and a sentence of reasons; this module
makes the simulated replica answer in that same form, so the gate cannot tell them apart.

The judge prompt is recognised by :data:`JUDGE_MARKER` in a system message (the gate's prompt,
``modelfleet.release.judge.JUDGE_SYSTEM``, carries it). The user message holds the sections
``QUESTION:``, ``REFERENCE:`` and ``ANSWER:``, each running to the next section. The score:

* with a reference: ``1 + round(9 x coverage)``, coverage being the share of the reference's
  distinct words (lower-cased runs of word characters) that appear in the answer;
* without one: 1 for an empty answer, else 7.

The reply is ``SCORE: N. The answer covers K of M reference words.`` (one token per word or
punctuation mark, then the end token), cut at ``max_tokens`` like any answer (finish reason
``length``). Stop strings are not applied to it. Any other prompt gets None: the normal answer.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from modelfleet.contract.tokens import EOS_TOKEN_ID, pieces, token_id
from replica.generation import OutputPlan

JUDGE_MARKER = "[modelfleet-judge/1]"
"""Present in the system message of a judge prompt."""

_SECTION = re.compile(r"^(QUESTION|REFERENCE|ANSWER):[ \t]*", re.MULTILINE)
_WORD = re.compile(r"\w+")


def is_judge_prompt(messages: Iterable[tuple[str, str]]) -> bool:
    """Whether a system message of ``(role, text)`` messages carries :data:`JUDGE_MARKER`."""
    return any(role == "system" and JUDGE_MARKER in text for role, text in messages)


def sections(text: str) -> dict[str, str]:
    """``QUESTION``/``REFERENCE``/``ANSWER`` -> their text (stripped); absent ones missing."""
    found = list(_SECTION.finditer(text))
    return {m.group(1): text[m.end(): found[i + 1].start() if i + 1 < len(found) else len(text)].strip()
            for i, m in enumerate(found)}


def judge_score(reference: str, answer: str) -> tuple[int, int, int]:
    """(score 1..10, reference words covered, reference words) for ``answer``."""
    ref = {w.casefold() for w in _WORD.findall(reference)}
    if not ref:
        return (7 if answer.strip() else 1), 0, 0
    covered = len(ref & {w.casefold() for w in _WORD.findall(answer)})
    return 1 + round(9 * covered / len(ref)), covered, len(ref)


def judge_plan(messages: Iterable[tuple[str, str]], max_tokens: int) -> OutputPlan | None:
    """The judge's reply to ``(role, text)`` messages, at most ``max_tokens`` tokens (end token
    included), or None when they are not a judge prompt."""
    msgs = list(messages)
    if not is_judge_prompt(msgs):
        return None
    user = next((text for role, text in reversed(msgs) if role == "user"), "")
    parts = sections(user)
    score, covered, total = judge_score(parts.get("REFERENCE", ""), parts.get("ANSWER", ""))
    reply = f"SCORE: {score}. The answer covers {covered} of {total} reference words."
    ids: list[int] = []
    deltas: list[str] = []
    text = ""
    for piece in pieces(reply)[:max_tokens]:
        delta = piece if (not text or not piece[0].isalnum()) else " " + piece
        ids.append(token_id(piece))
        deltas.append(delta)
        text += delta
    if len(ids) < max_tokens:
        ids.append(EOS_TOKEN_ID)
        deltas.append("")
        return OutputPlan(tuple(ids), tuple(deltas), text, "stop")
    return OutputPlan(tuple(ids), tuple(deltas), text, "length")

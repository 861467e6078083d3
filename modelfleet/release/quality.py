"""The gate's quality eval through the platform: both versions answer every prompt of the eval
set, the task metrics score them, and optionally an LLM judge served by the platform scores
them too (:mod:`modelfleet.release.judge`). Talking to the platform is one injected ``chat``
function, so the comparison runs the same against a stand-in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx

from modelfleet.release.eval import EvalItem, compare, passed_map, scores
from modelfleet.release.judge import JUDGE_MAX_TOKENS, judge_messages, judge_scores

Chat = Callable[[str, Sequence[Mapping[str, str]], int], str]
"""``chat(model, messages, max_tokens) -> answer text``; raises ``httpx.HTTPError``."""


def http_chat(api: str, key: str, timeout_s: float = 120.0) -> Chat:
    """One non-streamed chat completion at temperature 0 through the platform's OpenAI API
    (``api`` ends in ``/v1``) with a team ``key``."""
    client = httpx.Client(timeout=timeout_s, headers={"Authorization": f"Bearer {key}"})

    def chat(model: str, messages: Sequence[Mapping[str, str]], max_tokens: int) -> str:
        body = {"model": model, "messages": list(messages), "max_tokens": max_tokens,
                "temperature": 0}
        r = client.post(f"{api.rstrip('/')}/chat/completions", json=body)
        r.raise_for_status()
        return str(r.json()["choices"][0]["message"]["content"] or "")

    return chat


def ask_judge(chat: Chat, judge: str, item: EvalItem, answer: str) -> str:
    """The judge's reply; a refused or failed call is an empty (unparseable) reply."""
    try:
        return chat(judge, judge_messages(item, answer), JUDGE_MAX_TOKENS)
    except httpx.HTTPError:
        return ""


def quality(items: Sequence[EvalItem], chat: Chat, new: str, reference: str, max_drop: float,
            judge: str | None = None, precisions: tuple[str, str] | None = None) -> dict[str, Any]:
    """Answers of ``new`` and ``reference`` (``model@version``) scored per category by the task
    metrics and, with ``judge`` (a served model), by the judge; compared with ``max_drop``
    (share). ``precisions`` (new, reference) marks a precision change. Plain data."""
    answers = {v: {i.id: chat(v, i.messages, i.max_tokens) for i in items} for v in (new, reference)}
    got = {v: scores(items, passed_map(items, answers[v])) for v in (new, reference)}
    verdict = compare(got[new], got[reference], max_drop)
    report: dict[str, Any] = {
        "new_version": new, "reference_version": reference, "items": len(items),
        **verdict.as_dict(),
        "counts": {v: {c: [s.passed, s.total] for c, s in got[v].items()} for v in got},
        "precision_change": None if precisions is None or precisions[0] == precisions[1] else
        {"new": precisions[0], "reference": precisions[1]},
    }
    if judge is not None:
        replies = {v: {i.id: ask_judge(chat, judge, i, answers[v][i.id]) for i in items}
                   for v in (new, reference)}
        judged = {v: judge_scores(items, replies[v]) for v in (new, reference)}
        jv = compare(judged[new], judged[reference], max_drop)
        report["judge"] = {
            "model": judge, "passed": jv.passed, "new": jv.new, "reference": jv.reference,
            "drops": list(jv.drops),
            "mean_1_to_10": {v: {c: s.mean_1_to_10 for c, s in judged[v].items()} for v in judged},
            "parsed": {v: {c: s.parsed for c, s in judged[v].items()} for v in judged},
            "unparseable": {v: judged[v]["all"].unparseable for v in judged},
        }
        report["passed"] = verdict.passed and jv.passed
    return report

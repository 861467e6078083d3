"""The gate's quality eval with a judge, against a stand-in chat function: task metrics and
judge scores per category for both versions, unparseable and failed judge replies counted
(never fatal), a judge drop failing the gate, a precision change named in the report."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import httpx

from modelfleet.release.eval import EvalItem
from modelfleet.release.judge import JUDGE_MARKER
from modelfleet.release.quality import quality
from modelfleet.release.report import render

ITEMS = [
    EvalItem("r1", "reasoning", ({"role": "user", "content": "Does Tom purr?"},), "yes"),
    EvalItem("m1", "maths", ({"role": "user", "content": "17 x 23?"},), "391", "exact"),
    EvalItem("l1", "long", ({"role": "user", "content": "A story."},), "the end"),
]
ANSWERS = {"Does Tom purr?": "yes", "17 x 23?": "391", "A story.": "... the end"}


def chat(model: str, messages: Sequence[Mapping[str, str]], max_tokens: int) -> str:
    if JUDGE_MARKER not in messages[0]["content"]:
        return ANSWERS[messages[-1]["content"]]
    user = messages[-1]["content"]
    if "17 x 23?" in user:
        return "Score: 9/10"
    if "A story." in user and not seen_story:
        seen_story.append(True)
        return "I cannot grade this."  # unparseable, the first time only
    return "SCORE: 10"


seen_story: list[bool] = []


def test_judge_scores_per_category_with_unparseable_replies_counted() -> None:
    seen_story.clear()
    q = quality(ITEMS, chat, "m@v2", "m@v1", 0.02, judge="judge", precisions=("int8", "fp16"))
    assert q["passed"] is True and q["new"] == q["reference"]
    assert q["precision_change"] == {"new": "int8", "reference": "fp16"}
    j = q["judge"]
    assert j["unparseable"] == {"m@v2": 1, "m@v1": 0}  # the new version's story was judged first
    assert j["parsed"]["m@v2"] == {"reasoning": 1, "maths": 1, "long": 0, "all": 2}
    assert j["mean_1_to_10"]["m@v1"]["maths"] == 9.0 and j["new"]["long"] is None
    text = render({"quality": q, "passed": q["passed"]})
    assert "precision change: fp16 -> int8 (same model)" in text
    assert "unparseable judge replies: 1 new, 0 reference" in text


def test_a_judge_drop_fails_the_gate_and_a_refused_judge_call_is_unparseable() -> None:
    def harsh(model: str, messages: Sequence[Mapping[str, str]], max_tokens: int) -> str:
        if JUDGE_MARKER not in messages[0]["content"]:
            return ANSWERS[messages[-1]["content"]]
        if "Does Tom purr?" in messages[-1]["content"]:
            raise httpx.HTTPStatusError("429", request=httpx.Request("POST", "http://x"),
                                        response=httpx.Response(429))
        calls.append(1)
        return "SCORE: 6" if len(calls) <= 2 else "SCORE: 10"  # the new version's maths and story

    calls: list[int] = []
    q = quality(ITEMS, harsh, "m@v2", "m@v1", 0.02, judge="judge")
    assert q["precision_change"] is None
    assert q["judge"]["unparseable"] == {"m@v2": 1, "m@v1": 1}
    assert not q["judge"]["passed"] and not q["passed"]
    assert q["judge"]["drops"][0].startswith("maths: 55.6% vs 100.0%")

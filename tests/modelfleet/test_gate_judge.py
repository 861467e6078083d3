"""The gate's LLM judge: reading a score out of a judge's reply (never a crash), scores per
category with unparseable replies counted, and the simulated replica answering the gate's judge
prompt in the documented form (what lets a local stack serve as the judge)."""

from __future__ import annotations

import pytest

from modelfleet.release.eval import EvalItem, compare
from modelfleet.release.judge import JUDGE_MAX_TOKENS, judge_messages, judge_scores, parse_score
from replica.chat import ReplicaConfig, prepare
from replica.judge import JUDGE_MARKER, judge_plan, judge_score
from replica.protocol import ChatCompletionRequest


@pytest.mark.parametrize(("reply", "score"), [
    ("SCORE: 7. The answer covers 2 of 3 reference words.", 7.0),
    ("score=9", 9.0),
    ("**Score:** 8/10 — mostly right", 8.0),
    ("The score is 6.", 6.0),
    ("Score: 4/5", 8.0),
    ('{"score": 3, "reason": "wrong unit"}', 3.0),
    ("I would give it 9/10.", 9.0),
    ("10", 10.0),
    ("5.5", 5.5),
    ("SCORE: 11", None),
    ("SCORE: 0", None),
    ("Score: -3", None),
    ("The answer is good.", None),
    ("", None),
    ('{"score": "high"}', None),
    ("{not json", None),
    ("SCORE:", None),
])
def test_parse_score_reads_the_common_forms_and_rejects_the_rest(reply: str, score: float | None) -> None:
    assert parse_score(reply) == score


def item(i: str, cat: str, expected: str = "391") -> EvalItem:
    return EvalItem(i, cat, ({"role": "user", "content": f"question {i}"},), expected)


def test_judge_scores_per_category_count_unparseable_replies() -> None:
    items = [item("m1", "maths"), item("m2", "maths"), item("r1", "reasoning"), item("x", "style")]
    live = judge_scores(items, {"m1": "SCORE: 10", "m2": "SCORE: 10", "r1": "SCORE: 7", "x": "SCORE: 1"})
    new = judge_scores(items, {"m1": "SCORE: 10", "m2": "no idea", "r1": "SCORE: 4", "x": "SCORE: 1"})
    assert list(new) == ["reasoning", "maths", "long", "style", "all"]
    assert (new["maths"].parsed, new["maths"].unparseable, new["maths"].score) == (1, 1, 1.0)
    assert new["long"].score is None and new["all"].unparseable == 1
    assert new["reasoning"].mean_1_to_10 == pytest.approx(4.0)
    verdict = compare(new, live, max_drop=0.02)
    assert not verdict.passed and verdict.drops[0].startswith("reasoning: 33.3% vs 66.7%")


def test_the_simulated_replica_judges_the_gates_prompt() -> None:
    q = EvalItem("m1", "maths", ({"role": "user", "content": "17 x 23?"},), "391", "contains",
                 reference="It is 391 exactly")
    messages = judge_messages(q, "391, it is.")
    assert JUDGE_MARKER in messages[0]["content"]
    body = ChatCompletionRequest.model_validate(
        {"model": "reason-70b", "messages": messages, "max_tokens": JUDGE_MAX_TOKENS, "temperature": 0})
    plan = prepare(body, ReplicaConfig(("reason-70b",))).plan
    # reference words {it, is, 391, exactly}: 3 covered -> 1 + round(9 x 3/4) = 8
    assert plan.text == "SCORE: 8. The answer covers 3 of 4 reference words."
    assert plan.finish_reason == "stop" and "".join(plan.deltas) == plan.text
    assert parse_score(plan.text) == 8.0
    assert judge_score("", "") == (1, 0, 0) and judge_score("", "anything")[0] == 7
    cut = judge_plan([(m["role"], m["content"]) for m in messages], 3)
    assert cut is not None and (cut.text, cut.finish_reason) == ("SCORE: 8", "length")
    assert parse_score(cut.text) == 8.0
    plain = ChatCompletionRequest.model_validate({"model": "reason-70b", "messages": messages[1:]})
    assert "SCORE" not in prepare(plain, ReplicaConfig(("reason-70b",))).plan.text

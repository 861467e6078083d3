"""``modelfleet gate``: the eval set's scorers, scores per category and the comparison, the
capacity search, and the command end to end against a stand-in OpenAI API (canned answers per
version) and a control plane whose registry keeps the results."""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from envoy_control.api.http import create_app
from envoy_control.registry.store import Registry
from envoy_control.resources.build import ListenerSpec
from envoy_control.state.plane import ControlPlane
from envoy_control.xds.cache import SnapshotCache
from fastapi import FastAPI

from modelfleet.cli import gate
from modelfleet.release.eval import (
    EvalItem,
    EvalSetError,
    compare,
    load_eval_set,
    passed_map,
    score,
    scores,
)
from modelfleet.release.load import find_capacity
from replica.testing import serve_in_thread
from replica.workload import LoadResult

REPO = Path(__file__).resolve().parents[2]
TOKEN = "admin-token-for-gate-tests-00001"
ITEMS: list[dict[str, Any]] = [
    {"id": "r1", "category": "reasoning", "prompt": "All cats purr. Tom is a cat. Does Tom purr?",
     "expected": "yes", "scorer": "contains"},
    {"id": "m1", "category": "maths", "prompt": "17 x 23?", "expected": "391", "scorer": "exact"},
    {"id": "m2", "category": "maths", "prompt": "2^10?", "expected": r"\b1024\b", "scorer": "regex"},
    {"id": "l1", "category": "long", "messages": [{"role": "user", "content": "Tell a story."}],
     "expected": "the end", "scorer": "contains", "max_tokens": 2048},
]
RIGHT = {"r1": "Yes, Tom purrs.", "m1": " 391 ", "m2": "It is 1024.", "l1": "... and that was The End."}


def item(scorer: str, expected: str) -> EvalItem:
    return EvalItem("x", "general", ({"role": "user", "content": "q"},), expected, scorer)  # type: ignore[arg-type]


@pytest.mark.parametrize(("scorer", "expected", "answer", "ok"), [
    ("exact", "391", "  391\n", True),
    ("exact", "Paris", "paris", True),
    ("exact", "391", "391.", False),
    ("contains", "the end", "And so: THE   END.", True),
    ("contains", "yes", "no", False),
    ("regex", r"\b1024\b", "2^10 = 1024", True),
    ("regex", r"^\d+$", "10 24", False),
    ("regex", r"start.*end", "start\nmiddle\nend", True),
])
def test_scorers(scorer: str, expected: str, answer: str, ok: bool) -> None:
    assert score(item(scorer, expected), answer) is ok


def test_eval_set_scores_per_category_and_a_maths_drop_fails(tmp_path: Path) -> None:
    path = tmp_path / "eval.jsonl"
    path.write_text("\n".join(json.dumps(i) for i in ITEMS) + "\n\n")
    items = load_eval_set(path)
    assert [i.category for i in items] == ["reasoning", "maths", "maths", "long"]
    live = scores(items, passed_map(items, RIGHT))
    new = scores(items, passed_map(items, {**RIGHT, "m1": "392"}))
    assert (new["maths"].passed, new["maths"].total, new["all"].score) == (1, 2, 0.75)
    verdict = compare(new, live, max_drop=0.02)
    assert not verdict.passed and verdict.drops == ("maths: 50.0% vs 100.0% (-50.0 points, limit -2)",
                                                    "all: 75.0% vs 100.0% (-25.0 points, limit -2)")
    assert compare(live, live).passed
    bad = tmp_path / "bad.jsonl"
    for line, message in (('{"id": "a"}', "KeyError"), ("[1]", "JSON object"), ("{", "not JSON"),
                          ('{"id": "a", "prompt": "p", "expected": "(", "scorer": "regex"}', "error"),
                          ('{"id": "a", "prompt": "p", "expected": "x", "scorer": "bleu"}', "scorer")):
        bad.write_text(line + "\n")
        with pytest.raises(EvalSetError, match=message):
            load_eval_set(bad)


def test_capacity_is_the_highest_load_meeting_both_targets() -> None:
    def run(streams: int) -> LoadResult:  # 30 tokens/s per stream up to 2,500 in all; queueing past 90
        tokens = min(streams * 30.0, 2500.0)
        ttft = 0.3 if streams <= 90 else 4.0
        return LoadResult(tokens, 0.1, ttft, streams / tokens, 0.05, 0.8, 100)

    found = find_capacity(run, start=8)
    assert found.capacity is not None and found.capacity.streams == 83  # 2,500 / 30 = 83.3
    assert found.capacity.output_tokens_per_s == 2490.0
    assert found.capacity.tokens_in_flight == 83 * (1200 + 150)
    assert [s.passed for s in found.steps][-2:] == [False, False]


@pytest.fixture
def platform() -> Iterator[str]:
    """A stand-in OpenAI API: v13 and v14 answer every item right, v15 gets m1 wrong."""
    app = FastAPI()
    by_prompt = {(i.get("prompt") or i["messages"][0]["content"]): i["id"] for i in ITEMS}

    @app.post("/v1/chat/completions")
    async def chat(body: dict[str, Any]) -> dict[str, Any]:
        item_id = by_prompt[body["messages"][-1]["content"]]
        answer = "392" if body["model"] == "chat-7b@v15" and item_id == "m1" else RIGHT[item_id]
        return {"choices": [{"index": 0, "message": {"role": "assistant", "content": answer}}]}

    with serve_in_thread(app) as url:
        yield url + "/v1"


@pytest.fixture
def control_plane(tmp_path: Path) -> Iterator[tuple[str, Registry]]:
    registry = Registry("sqlite://")
    registry.create_tables()
    plane = ControlPlane(Path(shutil.copytree(REPO / "config", tmp_path / "config")),
                         SnapshotCache(), ListenerSpec("127.0.0.1", 18080), store=registry)
    plane.load()
    with serve_in_thread(create_app(plane, admin_token=TOKEN, registry=registry)) as url:
        yield url, registry
    registry.dispose()


def cli(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="modelfleet")
    gate.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(list(argv))
    code: int = args.run(args)
    return code


def test_gate_scores_versions_through_the_platform_and_saves_with_the_version(
        platform: str, control_plane: tuple[str, Registry], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    url, registry = control_plane
    eval_set, token = tmp_path / "eval.jsonl", tmp_path / "token"
    eval_set.write_text("\n".join(json.dumps(i) for i in ITEMS))
    token.write_text(TOKEN)
    common = ["--eval", str(eval_set), "--api", platform, "--key", "mf-team-key",
              "--config", str(REPO / "config"), "--url", url, "--token-file", str(token)]

    assert cli(["gate", "chat-7b@v15", *common]) == 1
    out = capsys.readouterr().out
    assert "chat-7b@v15 vs chat-7b@v13 on 4 prompts" in out and "maths: 50.0% vs 100.0%" in out
    assert out.rstrip().endswith("gate: FAILED")

    fake = LoadResult(2400.0, 0.1, 0.4, 1 / 40, 0.05, 0.8, 100)
    monkeypatch.setattr(gate, "engine_runner", lambda version: lambda streams: fake)
    assert cli(["gate", "chat-7b@v14", *common, "--load-test", "--engine", "--save", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] and report["quality"]["new"]["maths"] == 1.0
    assert report["quality"]["counts"]["chat-7b@v14"]["long"] == [1, 1]
    row = registry.version("chat-7b", "v14")
    assert row is not None and row["capacity_measured"] and row["load_test_tokens_per_s"] == 2400.0
    assert row["eval_report"]["reference"]["all"] == 1.0
    assert report["saved"] == {"eval_report": True, "capacity": True}
    assert report["config_patch"]["capacity_line"] == (
        "capacity: {output_tokens_per_s: 2400, tokens_in_flight: 10800, streams: 8, measured: true}")
    assert report["config_patch"]["thresholds"]["tokens_in_flight"] == 7560  # 70% of 10,800
    assert cli(["gate", "chat-7b@v99", *common, "--save"]) == 2  # not registered: not saved
    assert "404" in capsys.readouterr().err

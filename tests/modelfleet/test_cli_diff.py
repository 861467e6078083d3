"""``modelfleet diff`` and ``modelfleet apply`` on a sample pull request (a copy of config/ with
the canary raised and a limit changed), against another config directory and against a
running control plane (its HTTP API served in a thread) holding a controller's rollback."""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from envoy_control.api.http import create_app
from envoy_control.resources.build import ListenerSpec
from envoy_control.state.changes import rollout_changes
from envoy_control.state.plane import ControlPlane
from envoy_control.xds.cache import SnapshotCache

from modelfleet.cli import apply, diff
from replica.testing import serve_in_thread

REPO = Path(__file__).resolve().parents[2]
TOKEN = "admin-token-for-cli-tests-000001"


def cli(argv: Sequence[str]) -> int:
    """The ``diff`` and ``apply`` commands on a parser of their own (as modelfleet.cli.main does)."""
    parser = argparse.ArgumentParser(prog="modelfleet")
    sub = parser.add_subparsers(dest="command", required=True)
    diff.register(sub)
    apply.register(sub)
    args = parser.parse_args(list(argv))
    code: int = args.run(args)
    return code


@pytest.fixture
def pr_dir(tmp_path: Path) -> Path:
    """The sample PR: chat-7b's canary v14 10% -> 25%, search's chat-7b limit 6M -> 8M."""
    pr = Path(shutil.copytree(REPO / "config", tmp_path / "pr"))
    models = pr / "models.yaml"
    models.write_text(models.read_text().replace("percent: 10 ", "percent: 25 "))
    teams = pr / "teams.yaml"
    teams.write_text(teams.read_text().replace("tokens_per_minute: 6000000",
                                               "tokens_per_minute: 8000000"))
    return pr


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[str, ControlPlane]]:
    """A control plane on a copy of config/ with its HTTP API served on a free port."""
    config_dir = Path(shutil.copytree(REPO / "config", tmp_path / "running"))
    plane = ControlPlane(config_dir, SnapshotCache(), ListenerSpec("127.0.0.1", 18080))
    plane.load()
    with serve_in_thread(create_app(plane, admin_token=TOKEN)) as url:
        yield url, plane


def test_diff_against_a_config_dir_shows_the_pr_in_a_table(
        pr_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["diff", "--against", str(REPO / "config"), str(pr_dir)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].endswith("2 difference(s)")
    header = lines[2].split()
    assert header == ["SECTION", "KEY", "FIELD", "AGAINST", "THIS", "CONFIG", "NOTE"]
    routes = next(line for line in lines if line.startswith("routes"))
    assert routes.split() == ["routes", "chat-7b", "weights", "v13", "90%", "·", "v14", "10%",
                              "v13", "75%", "·", "v14", "25%"]
    limits = next(line for line in lines if line.startswith("limits"))
    assert limits.split() == ["limits", "search/chat-7b", "tokens_per_minute", "6,000,000",
                              "8,000,000"]
    assert cli(["diff", "--exit-code", "--against", str(REPO / "config"), str(pr_dir)]) == 1
    assert cli(["diff", "--exit-code", "--against", str(pr_dir), str(pr_dir)]) == 0


def test_diff_against_a_running_control_plane_marks_a_controller_rollback(
        running: tuple[str, ControlPlane], pr_dir: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    url, plane = running
    monkeypatch.setenv("MODELFLEET_ADMIN_TOKEN", TOKEN)
    rollback = rollout_changes(plane.config, plane.desired.declared, "chat-7b", "v14", "canary", 0,
                               source="controller", reason="rollback of chat-7b@v14: p95 TTFT +650%")
    plane.change(rollback, "controller")

    assert cli(["diff", "--json", "--against", url, str(REPO / "config")]) == 0
    rows = json.loads(capsys.readouterr().out)["differences"]
    assert rows == [{"section": "routes", "key": "chat-7b", "field": "weights",
                     "running": "v13 100%", "proposed": "v13 90% · v14 10%",
                     "note": "override by controller: rollback of chat-7b@v14: p95 TTFT +650%"}]
    cli(["diff", "--against", url, str(REPO / "config")])
    table = capsys.readouterr().out
    assert "RUNNING" in table and "override by controller: rollback" in table

    acknowledged = Path(shutil.copytree(REPO / "config", pr_dir.parent / "ack"))
    models = acknowledged / "models.yaml"
    text = models.read_text()
    models.write_text(text.replace("    canary:\n      version: v14\n      percent: 10"
                                   "          # share of conversations pinned to v14\n", ""))
    assert "canary" not in models.read_text().split("versions:")[0]
    assert cli(["diff", "--exit-code", "--against", url, str(acknowledged)]) == 0


def test_apply_pushes_the_pr_through_the_admin_api(
        running: tuple[str, ControlPlane], pr_dir: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    url, plane = running
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    assert cli(["apply", str(pr_dir), "--url", url, "--token-file", str(token_file),
                "--dry-run"]) == 0
    planned = capsys.readouterr().out
    assert "[plan] PUT /admin/models/chat-7b/rollout  chat-7b: canary v14 25%" in planned
    assert plane.config.model("chat-7b").canary.percent == 10  # type: ignore[union-attr]

    (tmp_path / "bad").write_text("not-the-token-at-all\n")
    assert cli(["apply", str(pr_dir), "--url", url, "--token-file", str(tmp_path / "bad")]) == 2
    assert "401 invalid admin credential" in capsys.readouterr().err

    assert cli(["apply", str(pr_dir), "--url", url, "--token-file", str(token_file)]) == 0
    out = capsys.readouterr().out
    assert "[200] PUT /admin/teams/search/limits" in out
    assert plane.config.model("chat-7b").canary.percent == 25  # type: ignore[union-attr]
    limit = next(x for t in plane.config.teams if t.name == "search" for x in t.limits
                 if x.model == "chat-7b")
    assert limit.tokens_per_minute == 8_000_000
    assert cli(["diff", "--exit-code", "--token-file", str(token_file), "--against", url,
                str(pr_dir)]) == 0
    assert cli(["apply", str(pr_dir), "--url", url, "--token-file", str(token_file)]) == 0
    assert "nothing to apply" in capsys.readouterr().out

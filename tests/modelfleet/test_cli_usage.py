"""`modelfleet usage` prints what metering wrote (SQLite here; Postgres in tests/gateway_ext)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway_ext.metering.meter import UsageCounts, UsageKey, UsageRow
from gateway_ext.metering.store import UsageStore
from modelfleet.cli.main import main
from modelfleet.cli.usage import parse_since

MINUTE = 1_795_000_020 // 60 * 60


@pytest.fixture
def db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'usage.db'}"
    store = UsageStore(url)
    store.create_tables()
    rows = [
        UsageRow(UsageKey("search", "chat-7b", "v13", "us-east-1", MINUTE), UsageCounts(1200, 640, 300, 1, 0, 0)),
        UsageRow(UsageKey("search", "chat-7b", "v13", "us-east-1", MINUTE + 60), UsageCounts(2400, 1280, 600, 2, 1, 0)),
        UsageRow(UsageKey("support", "chat-7b", "v14", "us-east-1", MINUTE), UsageCounts(100, 0, 50, 1, 0, 3)),
    ]
    assert store.write_batch("b1", rows, now=MINUTE + 120)
    store.dispose()
    return url


def test_totals_per_team_model_version(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["usage", "--db", db, "--json"]) == 0
    entries = json.loads(capsys.readouterr().out)
    search = next(e for e in entries if e["team"] == "search")
    assert (search["prompt_tokens"], search["output_tokens"], search["requests"], search["rejected_429"]) == (3600, 900, 3, 1)
    assert main(["usage", "--db", db, "--team", "support"]) == 0
    table = capsys.readouterr().out
    assert "support" in table and "search" not in table and "SHED_503" in table


def test_since_and_by_minute(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["usage", "--db", db, "--by-minute", "--json", "--since", "2026-11-19T00:00:00+00:00"]) == 0
    assert json.loads(capsys.readouterr().out) == []
    assert parse_since("2h", 10_000.0) == 10_000.0 - 7200


def test_missing_database_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MODELFLEET_USAGE_DB_URL", raising=False)
    assert main(["usage"]) == 1
    assert "no database" in capsys.readouterr().err

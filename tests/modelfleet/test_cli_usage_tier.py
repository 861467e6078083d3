"""`modelfleet usage --tier`: rows per tier in the table and the JSON, and the filter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway_ext.metering.meter import UsageCounts, UsageKey, UsageRow
from gateway_ext.metering.store import UsageStore
from modelfleet.cli.main import main

MINUTE = 1_795_000_020 // 60 * 60


@pytest.fixture
def db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'usage.db'}"
    store = UsageStore(url)
    store.create_tables()
    rows = [UsageRow(UsageKey("search", "chat-7b", "v13", "local", MINUTE, tier),
                     UsageCounts(100 * n, 0, 10 * n, n, 0, 0))
            for n, tier in enumerate(("interactive", "standard", "batch"), 1)]
    assert store.write_batch("b1", rows, now=MINUTE + 60)
    store.dispose()
    return url


def test_usage_shows_and_filters_by_tier(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["usage", "--db", db, "--json"]) == 0
    entries = json.loads(capsys.readouterr().out)
    assert {e["tier"]: e["requests"] for e in entries} == {"interactive": 1, "standard": 2,
                                                           "batch": 3}
    assert main(["usage", "--db", db, "--tier", "batch", "--json"]) == 0
    [batch] = json.loads(capsys.readouterr().out)
    assert (batch["tier"], batch["prompt_tokens"], batch["output_tokens"]) == ("batch", 300, 30)
    assert main(["usage", "--db", db, "--tier", "batch"]) == 0
    table = capsys.readouterr().out
    assert "TIER" in table.splitlines()[0] and "batch" in table and "interactive" not in table

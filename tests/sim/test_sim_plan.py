"""`modelfleet plan` reproduces every figure of the seed from its inputs."""

from __future__ import annotations

import dataclasses
import json

import pytest

from modelfleet.cli.main import main
from sim.plan import ModelLoad, PlanInputs, plan


def test_seed_inputs_give_the_seed_figures() -> None:
    r = plan(PlanInputs())
    assert (r.chat_replicas_per_region, r.reasoning_replicas_per_region) == (12, 3)
    assert r.gpus_total == 36
    assert r.usd_per_month == 64_800
    assert round(r.usd_per_million_tokens_full, 2) == 0.28
    assert round(r.usd_per_million_tokens_half, 2) == 0.56
    assert (r.prefill_tokens_per_s_no_cache, r.prefill_tokens_per_s_with_cache) == (120_000, 56_000)
    assert r.prefill_gpus_with_cache == pytest.approx(5.6)
    assert r.kv_bytes_per_token == 131_072
    assert r.chat_replicas_at == {"800": 38}
    assert r.cold_start_plan_min == 6
    assert round(r.load_growth_during_cold_start, 2) == 1.34
    assert round(r.utilisation_when_capacity_arrives, 2) == 0.94
    assert r.requests_per_s == 100 and r.answer_s == 10.5
    assert round(r.streaming_share_of_users, 2) == 0.26
    assert round(r.kv_gb_per_replica_at_capacity) == 16  # "83 streams of 1,500 tokens hold 16 GB"


def test_inputs_move_the_figures() -> None:
    slow = dataclasses.replace(PlanInputs(), chat=ModelLoad("chat-7b", 1000, 30.0, 800.0, 1))
    r = plan(slow)
    assert r.chat_replicas_per_region == 38
    assert r.gpus_total == 2 * (38 + 3 * 2)
    one_region = plan(dataclasses.replace(PlanInputs(), regions=1))
    assert one_region.gpus_total == 18 and one_region.usd_per_month == 32_400


def test_cli_prints_table_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan"]) == 0
    table = capsys.readouterr().out
    assert "64,800 USD per month" in table and "120,000 -> 56,000" in table and "1.34x" in table
    assert main(["plan", "--json", "--replica-tokens-per-s", "800", "--regions", "1"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["chat_replicas_per_region"] == 38 and data["gpus_total"] == 38 + 6

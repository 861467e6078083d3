"""Short drills on a small workload and their qualitative results: affinity beats round-robin on
prefix hits and prefill; the bound holds the picker's view of the load within 125% of the
average; the capacity gate finds a figure near the configured capacity; only the noisy team
sees 429s; the command prints JSON and writes a plot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from modelfleet.config import PlatformConfig, load_config
from sim.drills.capacity import GateSettings, run_capacity
from sim.drills.capacity import render as render_capacity
from sim.drills.common import RunOptions
from sim.drills.isolation import render as render_isolation
from sim.drills.isolation import run_isolation
from sim.drills.routing import RoutingReport, run_routing
from sim.drills.routing import render as render_routing

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def config() -> PlatformConfig:
    return load_config(REPO / "config").config


@pytest.fixture(scope="module")
def routing(config: PlatformConfig) -> RoutingReport:
    opts = RunOptions(trace="chat", rate_rps=9.0, seed=3, duration_s=45.0, warmup_s=60.0)
    return run_routing(config, opts, replicas=3)


def test_affinity_beats_round_robin_on_prefix_hits_and_prefill(routing: RoutingReport) -> None:
    rr, least, affinity = routing.rows
    assert affinity.token_hit_rate > rr.token_hit_rate + 0.2
    assert affinity.history_hit_rate > 0.7 > 0.5 > rr.history_hit_rate
    assert affinity.prefill_tokens_per_s < 0.7 * rr.prefill_tokens_per_s
    assert affinity.ttft_p95_s <= rr.ttft_p95_s
    assert least.imbalance_mean < rr.imbalance_mean
    text = render_routing(routing)
    assert "affinity (bound 1.25)" in text and "120,000 -> 56,000" in text


def test_the_bound_keeps_the_pickers_view_within_125_percent(routing: RoutingReport) -> None:
    affinity = routing.rows[-1]
    assert affinity.view_imbalance_mean <= 1.25
    assert affinity.imbalance_mean < 1.6


def test_capacity_gate_finds_a_figure_near_the_configured_capacity(config: PlatformConfig) -> None:
    gate = GateSettings(start=0.4, stop=1.2, step=0.4, refine=1)
    report = run_capacity(config, RunOptions(trace="seed", duration_s=45.0, warmup_s=90.0), gate)
    assert report.capacity is not None
    assert 0.5 * report.configured_tokens_per_s < report.capacity.output_tokens_per_s \
        <= report.configured_tokens_per_s
    assert 0 < report.capacity.tokens_in_flight < report.configured_tokens_in_flight * 1.2
    assert not report.steps[-1].passed and report.steps[0].passed
    assert "capacity:" in render_capacity(report)


def test_only_the_noisy_team_sees_429s(config: PlatformConfig) -> None:
    opts = RunOptions(trace="chat", rate_rps=8.0, seed=2, duration_s=30.0, warmup_s=30.0)
    report = run_isolation(config, opts, replicas=3, noisy_team="research", factor=10)
    assert report.saw_429 == ("research",)
    noisy = next(t for t in report.teams if t.team == "research")
    assert noisy.rejected_429 > noisy.requests / 2
    assert all(t.ttft_p95_noisy_s < 1.0 for t in report.teams if t.team != "research")
    assert "teams that saw 429s during the surge: research" in render_isolation(report)


def test_the_drill_command_prints_json_and_writes_a_plot(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    import argparse

    from modelfleet.cli import drill

    parser = argparse.ArgumentParser()
    drill.register(parser.add_subparsers(dest="command"))
    out = tmp_path / "iso.png"
    args = parser.parse_args(["drill", "isolation", "--rate", "4", "--replicas", "2", "--duration",
                              "20", "--warmup", "10", "--json", "--quiet", "--plot", str(out),
                              "--config", str(REPO / "config")])
    assert args.run(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["noisy_team"] == "research" and len(report["teams"]) == 3
    assert out.stat().st_size > 1000
    bad = parser.parse_args(["drill", "routing", "--trace", "nope.txt", "--quiet",
                             "--config", str(REPO / "config")])
    assert bad.run(bad) == 2
    assert "unknown trace" in capsys.readouterr().err

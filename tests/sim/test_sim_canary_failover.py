"""The canary and failover drills on small workloads: a bad canary is rolled back by the
production guard rule and a healthy one reaches the alias; losing a region, errors stop within
health checks plus one DNS TTL, interactive work is served and batch work is delayed. Also the
pure parts: the clients' retry rule (the openai SDK's), the guard's window metrics, and the
health-check and DNS arithmetic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from modelfleet.config import PlatformConfig, load_config
from sim.drills.canary import CanaryReport, CanarySettings, run_canary
from sim.drills.canary import render as render_canary
from sim.drills.common import RunOptions
from sim.drills.failover import FailoverReport, run_failover
from sim.drills.failover import render as render_failover
from sim.fleet.canary import window_metrics
from sim.fleet.clients import RetryPolicy, retry_after_s, retry_delay
from sim.fleet.global_dns import GlobalRouting, Router
from sim.traces.arrivals import Arrival

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def config() -> PlatformConfig:
    return load_config(REPO / "config").config


def small_canary(config: PlatformConfig, fault: str) -> CanaryReport:
    settings = CanarySettings(fault=fault, stages=(10.0, 50.0), hold_s=90.0, window_s=90.0,
                              min_requests=40)
    opts = RunOptions(trace="chat", rate_rps=10.0, seed=1, warmup_s=40.0)
    return run_canary(config, opts, settings, replicas=2)


@pytest.mark.parametrize(("fault", "metric"), [("slow", "p95 TTFT"), ("errors", "error rate")])
def test_a_bad_canary_is_rolled_back_by_the_guard(config: PlatformConfig, fault: str,
                                                  metric: str) -> None:
    report = small_canary(config, fault)
    assert report.outcome == "rolled_back"
    assert report.decided_stage == "canary-10"
    assert any(r.startswith(metric) for r in report.reasons)
    assert 0 < report.canary_requests < 100
    assert "rolled back at" in render_canary(report)


def test_a_healthy_canary_reaches_the_alias(config: PlatformConfig) -> None:
    report = small_canary(config, "none")
    assert report.outcome == "promoted"
    assert [d["decision"] for d in report.decisions] == ["start", "advance", "promote"]


@pytest.fixture(scope="module")
def failover(config: PlatformConfig) -> FailoverReport:
    opts = RunOptions(trace="chat", rate_rps=12.0, seed=1, warmup_s=40.0, duration_s=150.0)
    return run_failover(config, opts, replicas=2, lose_after_s=30.0)


def test_failover_errors_stop_within_the_bound_interactive_is_served_batch_waits(
        failover: FailoverReport) -> None:
    report = failover
    assert report.errors > 0 and report.errors_stop_after_s is not None
    assert report.errors_stop_after_s <= report.bound_s == 80.0
    # the lost region's clients fail until their DNS moves; everything else is served, fast
    assert report.interactive_ok_share_after > 0.7
    assert all(m.interactive_p95_s < 1.0 for m in report.minutes)
    assert report.batch_delayed_after > 0
    assert "errors stop after" in render_failover(report)


def test_longer_answers_are_rolled_back_and_the_new_drills_plot(config: PlatformConfig, failover: FailoverReport,
                             tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from sim.drills.plots import plot

    plot(failover, tmp_path / "failover.png")
    long = small_canary(config, "long")
    assert long.outcome == "rolled_back" and long.reasons[0].startswith("output length")
    plot(long, tmp_path / "canary.png")
    assert (tmp_path / "failover.png").stat().st_size > 0 < (tmp_path / "canary.png").stat().st_size


def test_clients_retry_as_the_openai_sdk() -> None:
    policy = RetryPolicy()
    assert retry_delay(policy, 0, 3.0, 0.5) == 3.0  # Retry-After within (0, 60] is obeyed
    assert retry_delay(policy, 1, 120.0, 0.0) == 1.0  # too long: backoff 0.5 x 2^1
    assert retry_delay(policy, 5, None, 1.0) == pytest.approx(8.0 * 0.75)  # capped at 8 s, jitter
    assert policy.limit("interactive") == 2 and policy.limit("batch") == 10
    assert retry_after_s({"retry-after": "2", "retry-after-ms": "1500"}) == 1.5


def test_window_metrics_per_version() -> None:
    done = [(1.0, "m@a", 0.1, 100, True), (2.0, "m@b", 0.4, 300, True), (3.0, "m@a", float("nan"), 0, False),
            (4.0, "m@a", 0.3, 200, True), (9.0, "m@a", 5.0, 1, True)]
    m = window_metrics(done, "m@a", 0.0, 5.0)
    assert (m.requests, m.error_rate, m.ttft_p95_s, m.output_tokens_mean) == (3, 1 / 3, 0.3, 150)
    assert window_metrics(done, "m@c", 0.0, 5.0).error_rate is None


def test_health_checks_and_dns_ttl_move_a_client_after_its_next_refresh() -> None:
    g = GlobalRouting()
    assert g.unhealthy_at(95.0) == 120.0 and g.worst_case_s(95.0) == 85.0
    router = Router(("east", "west"), g)
    a = Arrival(0.0, 100, 10, "conversation-1")
    home, phase = router.home(a)
    other = "west" if home == "east" else "east"
    router.unhealthy[home] = 120.0
    refresh = g.last_refresh(phase, 120.0) + g.ttl_s  # first refresh at or after 120 s
    assert router.route(a, 119.0) == home
    assert router.route(a, refresh - 0.01) == home and router.route(a, refresh) == other


def test_the_drill_command_runs_the_canary(capsys: pytest.CaptureFixture[str]) -> None:
    from modelfleet.cli.main import main

    code = main(["drill", "canary", "--config", str(REPO / "config"), "--fault", "errors",
                 "--rate", "10", "--replicas", "2", "--warmup", "40", "--stages", "10,50",
                 "--hold", "90", "--window", "90", "--min-requests", "40", "--json", "--quiet"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["outcome"] == "rolled_back" and report["fault"] == "errors"
    assert report["reasons"][0].startswith("error rate")

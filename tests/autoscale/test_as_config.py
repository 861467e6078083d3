"""The ``autoscaling:`` config section: loaded into PlatformConfig, checked by `modelfleet validate`
with file:line errors, and read by the ScaledObjects, the simulator and the local loop; plus the
local loop's edges that need no stack (gateway queue parsing, status lines, replica env)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from autoscale.local_loop import local_pool
from autoscale.scaledobject import scaled_objects
from gateway_ext.metrics import make_metrics
from modelfleet.cli.main import main
from modelfleet.config.autoscaling import AutoscalePolicy
from modelfleet.config.load import ConfigError, load_config
from modelfleet.local.autoscaler_env import replica_env
from modelfleet.local.autoscaler_readings import gateway_queue_depths
from modelfleet.local.autoscaler_view import render_autoscale
from sim.fleet.scaling import scaler_setup

REPO = Path(__file__).resolve().parents[2]


def _config_with(tmp_path: Path, text: str) -> Path:
    dest = tmp_path / "config"
    shutil.copytree(REPO / "config", dest)
    (dest / "autoscaling.yaml").write_text(text)
    return dest


def test_the_example_config_takes_the_seed_defaults() -> None:
    assert load_config(REPO / "config").config.autoscaling == AutoscalePolicy()


def test_the_section_reaches_scaled_objects_the_simulator_and_the_local_loop(tmp_path: Path) -> None:
    cfg = load_config(_config_with(tmp_path, """\
autoscaling:
  target_utilization: 0.5
  scale_down: {stabilization_s: 300}
  cold_start: {node_start_s: 0}
""")).config
    so = next(o for o in scaled_objects(cfg, region="us-east-1") if o["metadata"]["name"] == "vllm-chat-7b-v13")
    triggers = {t["name"]: t for t in so["spec"]["triggers"]}
    assert triggers["tokens-in-flight"]["metadata"]["threshold"] == "56000"   # 0.5 x 112,000
    assert so["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"][
        "stabilizationWindowSeconds"] == 300
    pool = next(p for p in cfg.pools if p.key == "chat-7b@v13")
    version = cfg.version("chat-7b", "v13")
    assert version is not None
    assert scaler_setup(pool, version, cfg.autoscaling).tokens_target == 56_000
    loop = local_pool(cfg, "chat-7b@v13", cfg.local.region)
    assert loop is not None and loop.cold_start_s == 72.0                      # 28 + 14 + 30
    assert loop.triggers[0].target == 56_000


@pytest.mark.parametrize(("text", "expected"), [
    ("autoscaling:\n  target_utilization: 1.5\n",
     "autoscaling.yaml:2: autoscaling.target_utilization: error: Input should be less than or equal to 1"),
    ("autoscaling:\n  scale_down:\n    pods: 0\n",
     "autoscaling.yaml:3: autoscaling.scale_down.pods: error: Input should be greater than or equal to 1"),
    ("autoscaling:\n  surge: 3\n",
     "autoscaling.yaml:2: autoscaling.surge: error: Extra inputs are not permitted"),
    ("autoscaling:\n  peaks:\n    - {name: am, timezone: UTC, start: '0 8 * * *', end: '0 9 * * *',\n"
     "       desired_replicas: 8, model: chat-70b}\n",
     "autoscaling.yaml:4: autoscaling.peaks[0].model: error: model 'chat-70b' is not declared"),
])
def test_validate_locates_autoscaling_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             text: str, expected: str) -> None:
    config = _config_with(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_config(config)
    assert f"{config}/{expected}" in [str(p) for p in caught.value.problems]
    assert main(["validate", str(config)]) == 1
    out = capsys.readouterr()
    assert f"{config}/{expected}" in out.out + out.err


def test_gateway_queue_depths_sum_every_tier_per_pool() -> None:
    registry = CollectorRegistry(auto_describe=False)
    metrics = make_metrics(registry)
    metrics.pool_queue_depth.labels(pool="chat-7b@v13", tier="interactive").set(3)
    metrics.pool_queue_depth.labels(pool="chat-7b@v13", tier="batch").set(4)
    metrics.pool_queue_depth.labels(pool="chat-7b@v14", tier="standard").set(1)
    metrics.pool_tokens_in_flight.labels(pool="chat-7b@v13").set(9_999)
    assert gateway_queue_depths(generate_latest(registry).decode()) == {"chat-7b@v13": 7.0,
                                                                         "chat-7b@v14": 1.0}


def test_replicas_get_the_scaled_drain_grace() -> None:
    cfg = load_config(REPO / "config").config
    # the preStop, then the slowest version's stream bound (reason-70b: 410.6 s) for open streams
    assert replica_env(cfg, 1.0) == {"MODELFLEET_DRAIN_GRACE_S": "12.000",
                                     "MODELFLEET_SHUTDOWN_TIMEOUT_S": "410.600"}
    assert replica_env(cfg, 100.0) == {"MODELFLEET_DRAIN_GRACE_S": "1.500",   # floored
                                       "MODELFLEET_SHUTDOWN_TIMEOUT_S": "4.106"}


def test_status_lines_show_counts_desired_and_why() -> None:
    lines = render_autoscale({
        "time_scale": 100, "sync_period_s": 0.5, "model_time_s": 1234,
        "pools": [{"pool": "chat-7b@v13", "current": 2, "starting": 1, "draining": 0, "desired": 3,
                   "min": 1, "max": 4, "why": "queue-depth 20 vs target 8/replica x 2 -> 3",
                   "triggers": [{"trigger": "tokens-in-flight", "value": None, "target": 78400,
                                 "proposal": None},
                                {"trigger": "queue-depth", "value": 20.0, "target": 8, "proposal": 3}]}],
        "not_autoscaled": {"chat-7b@v14": "no pool declares chat-7b@v14: fixed at 1"}})
    text = "\n".join(lines)
    assert "chat-7b@v13        2        1         0         3        1..4" in text
    assert "queue-depth 20 vs target 8/replica x 2 -> 3" in text
    assert "tokens-in-flight  value failed" in text
    assert "chat-7b@v14" in text and "not autoscaled" in text

"""The ``rollout:`` config section: defaults equal to the controller's seed values, checked by
``modelfleet validate`` with the file and field named, and read by the rollout controller."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from envoy_control.rollouts.controller import RolloutPolicy, policy_from_config

from modelfleet.cli.main import main
from modelfleet.config import load_config
from modelfleet.config.rollout import RolloutSettings

REPO = Path(__file__).resolve().parents[2]


def with_rollout(tmp_path: Path, text: str) -> Path:
    cfg = tmp_path / "config"
    shutil.copytree(REPO / "config", cfg)
    (cfg / "rollout.yaml").write_text(text)
    return cfg


def test_the_defaults_are_the_seed_values() -> None:
    config = load_config(REPO / "config").config
    assert config.rollout == RolloutSettings()
    assert policy_from_config(config.rollout) == RolloutPolicy()
    t = policy_from_config(config.rollout).thresholds
    assert (t.max_error_rate_rise, t.max_ttft_p95_rise, t.max_output_length_shift,
            t.max_refusal_rate_rise, t.min_requests) == (0.005, 0.20, 0.15, 0.01, 200)
    assert [(s.name, s.kind, s.percent, s.hold_s) for s in config.rollout.stages] == [
        ("shadow", "shadow", 1, 1800), ("canary-1", "canary", 1, 1800),
        ("canary-10", "canary", 10, 1800), ("canary-50", "canary", 50, 1800)]


def test_a_rollout_section_is_read(tmp_path: Path) -> None:
    cfg = with_rollout(tmp_path, "rollout:\n  error_rate_points: 1.0\n  p95_ttft_ratio: 0.3\n"
                                 "  stages:\n    - {name: canary-5, kind: canary, percent: 5,"
                                 " hold_s: 60}\n")
    policy = policy_from_config(load_config(cfg).config.rollout)
    assert policy.thresholds.max_error_rate_rise == pytest.approx(0.01)
    assert policy.thresholds.max_ttft_p95_rise == 0.3
    assert [(s.name, s.percent, s.hold_s) for s in policy.stages] == [("canary-5", 5, 60)]
    assert policy.thresholds.max_output_length_shift == 0.15  # unchanged default


@pytest.mark.parametrize(("section", "path", "message"), [
    ("rollout:\n  p95_ttft_ratio: -0.1\n", "rollout.p95_ttft_ratio", "greater than or equal"),
    ("rollout:\n  stages: []\n", "rollout", "at least one stage"),
    ("rollout:\n  stages:\n    - {name: c, kind: canary, percent: 10}\n"
     "    - {name: s, kind: shadow, percent: 1}\n", "rollout", "shadow stage comes before"),
    ("rollout:\n  stages:\n    - {name: a, kind: canary, percent: 10}\n"
     "    - {name: b, kind: canary, percent: 5}\n", "rollout", "must not fall"),
    ("rollout:\n  stages:\n    - {name: a, kind: canary, percent: 10, hold: 5}\n",
     "rollout.stages[0].hold", "Extra inputs"),
])
def test_validate_names_the_bad_field(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                      section: str, path: str, message: str) -> None:
    cfg = with_rollout(tmp_path, section)
    assert main(["validate", str(cfg)]) == 1
    err = capsys.readouterr().err
    assert "rollout.yaml" in err and path in err and message in err

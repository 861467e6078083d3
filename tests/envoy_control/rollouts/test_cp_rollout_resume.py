"""A rollout in progress survives a control-plane restart: the registry on a real Postgres, the
controller on a fake clock, a restart being a new control plane and controller over the same
registry. The stages and thresholds come from the config's ``rollout:`` section.

Postgres is the machine's (``MODELFLEET_TEST_POSTGRES_URL`` overrides the default); when it is
missing the test fails under ``CI=true`` and skips otherwise. Each test has its own table prefix
and drops its tables.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import sqlalchemy
from envoy_control.registry.store import Registry
from envoy_control.resources.build import ListenerSpec
from envoy_control.rollouts.controller import Phase, RolloutPolicy, default_stages
from envoy_control.rollouts.driver import RolloutDriver
from envoy_control.rollouts.guard import VersionMetrics
from envoy_control.rollouts.resume import Unresumable, resume
from envoy_control.state.plane import ControlPlane
from envoy_control.xds.cache import SnapshotCache

CONFIG_DIR = Path(__file__).resolve().parents[3] / "config"
ROLLOUT_YAML = """\
rollout:
  min_requests: 100
  window_s: 60
  keep_old_s: 3600
  stages:
    - {name: shadow, kind: shadow, percent: 1, hold_s: 600}
    - {name: canary-1, kind: canary, percent: 1, hold_s: 600}
    - {name: canary-10, kind: canary, percent: 10, hold_s: 600}
"""
GOOD = VersionMetrics(requests=500, error_rate=0.0, ttft_p95_s=0.5, output_tokens_mean=300,
                      refusal_rate=0.0)
SLOW = VersionMetrics(requests=500, error_rate=0.0, ttft_p95_s=0.9, output_tokens_mean=300,
                      refusal_rate=0.0)


@pytest.fixture
def config_dir(tmp_path: Path) -> Path:
    path = Path(shutil.copytree(CONFIG_DIR, tmp_path / "config"))
    (path / "rollout.yaml").write_text(ROLLOUT_YAML)
    return path


class Reader:
    """Guard metrics per version, as the test sets them."""

    def __init__(self) -> None:
        self.metrics = {"v13": GOOD, "v14": GOOD}

    async def read(self, model: str, version: str, window_s: float) -> VersionMetrics:
        return self.metrics[version]


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def restart(config_dir: Path, registry: Registry, reader: Reader, clock: Clock
            ) -> tuple[ControlPlane, RolloutDriver]:
    """A new control plane and controller over the same config directory and registry."""
    plane = ControlPlane(config_dir, SnapshotCache(), ListenerSpec("127.0.0.1", 18080),
                         store=registry, wall_clock=clock)
    plane.load()
    return plane, RolloutDriver(plane, reader, registry=registry, clock=clock)


def canary(plane: ControlPlane) -> tuple[str, float] | None:
    m = plane.config.model("chat-7b")
    assert m is not None
    return (m.canary.version, m.canary.percent) if m.canary else None


async def test_a_running_rollout_resumes_at_its_stage_with_its_hold_counted_from_the_record(
        config_dir: Path, registry: Registry) -> None:
    clock, reader = Clock(1_000.0), Reader()
    plane, driver = restart(config_dir, registry, reader, clock)
    assert [s.hold_s for s in driver.policy.stages] == [600, 600, 600]  # the config's
    assert driver.policy.thresholds.min_requests == 100
    driver.start("chat-7b", "v14")
    clock.now = 1_700.0
    assert [d.decision for d in await driver.tick()] == ["advance"]
    assert canary(plane) == ("v14", 1.0)

    clock.now = 1_900.0  # the control plane restarts 200 s into canary-1
    plane, driver = restart(config_dir, registry, reader, clock)
    [r] = driver.resume()
    assert (r.phase, r.stage.name, r.stage_started_s, r.previous) == (
        Phase.RUNNING, "canary-1", 1_700.0, "v13")
    assert canary(plane) == ("v14", 1.0)  # the override was kept in the registry
    clock.now = 2_250.0
    assert await driver.tick() == []  # 550 s of a 600 s hold
    clock.now = 2_300.0
    [d] = await driver.tick()
    assert (d.decision, d.stage, d.started_s) == ("advance", "canary-1", 1_700.0)
    assert canary(plane) == ("v14", 10.0)

    clock.now = 2_400.0
    plane, driver = restart(config_dir, registry, reader, clock)
    [r] = driver.resume()
    assert r.stage.name == "canary-10" and r.stage_started_s == 2_300.0
    reader.metrics["v14"] = SLOW
    clock.now = 2_410.0
    [d] = await driver.tick()
    assert d.decision == "rollback" and "p95 TTFT" in d.reasons[0]
    assert canary(plane) is None

    plane, driver = restart(config_dir, registry, reader, clock)
    assert driver.resume() == []  # rolled back: over
    decisions = [(row["decision"], row["stage"], row["previous"])
                 for row in registry.decisions("chat-7b")]
    assert decisions == [("start", "shadow", "v13"), ("advance", "shadow", "v13"),
                         ("advance", "canary-1", "v13"), ("rollback", "canary-10", "v13")]


def test_a_promoted_rollout_resumes_until_the_old_version_is_released() -> None:
    policy = RolloutPolicy(stages=default_stages(60), keep_old_s=3600)
    row = {"model": "chat-7b", "version": "v14", "previous": "v13", "stage": "alias",
           "decision": "promote", "started_at": 100.0, "decided_at": 160.0}
    r = resume(row, policy, live="v14")
    assert r is not None and not isinstance(r, Unresumable)
    assert (r.phase, r.promoted_s, r.previous) == (Phase.PROMOTED, 160.0, "v13")
    assert resume({**row, "decision": "release"}, policy, "v14") is None
    old = {**row, "decision": "advance", "stage": "canary-1", "previous": None}
    r = resume(old, policy, live="v13")  # a row written before the previous column
    assert r is not None and not isinstance(r, Unresumable)
    assert (r.stage.name, r.previous) == ("canary-10", "v13")
    gone = resume({**old, "stage": "canary-5"}, policy, live="v13")
    assert isinstance(gone, Unresumable) and "canary-5" in gone.reason


def test_an_older_rollouts_table_gets_the_previous_column(registry: Registry) -> None:
    table = registry.t.rollouts.name
    with registry.engine.begin() as conn:
        conn.execute(sqlalchemy.text(f'ALTER TABLE "{table}" DROP COLUMN "previous"'))
    registry.create_tables()
    registry.create_tables()  # twice: nothing left to add
    columns = {c["name"] for c in sqlalchemy.inspect(registry.engine).get_columns(table)}
    assert "previous" in columns

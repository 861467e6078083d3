"""``modelfleet validate`` as a pull request's CI runs it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from modelfleet.cli.main import main

REPO = Path(__file__).resolve().parents[2]


def test_example_config_validates(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(REPO / "config")]) == 0
    assert "ok: 2 models, 3 versions" in capsys.readouterr().out


def test_errors_exit_non_zero_and_name_file_and_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "config"
    shutil.copytree(REPO / "config", cfg)
    text = (cfg / "models.yaml").read_text().replace("precision: int8", "precision: fp16")
    (cfg / "models.yaml").write_text(text)
    assert main(["validate", str(cfg)]) == 1
    err = capsys.readouterr().err
    assert "models.yaml:" in err and "versions[2].gpus_per_replica" in err
    assert "1 error(s)" in err


def test_json_output_lists_problems(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "config"
    shutil.copytree(REPO / "config", cfg)
    (cfg / "pools.yaml").write_text((cfg / "pools.yaml").read_text().replace("min_replicas: 6", "min_replicas: 60"))
    assert main(["validate", "--json", str(cfg)]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False
    assert {p["path"] for p in report["problems"]} == {"pools[0].min_replicas", "pools[3].min_replicas"}
    assert all(p["file"].endswith("pools.yaml") and p["line"] for p in report["problems"])


def test_console_script_runs_outside_the_checkout(tmp_path: Path) -> None:
    """The installed command works from any directory (the envoy/ folder shadows nothing)."""
    exe = Path(sys.executable).parent / "modelfleet"
    out = subprocess.run([str(exe), "validate", str(REPO / "config")], cwd=tmp_path,
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr

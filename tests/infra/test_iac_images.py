"""The Dockerfiles: pinned bases; each image installs only its own extra, from the lock; the vLLM
image copies only what the middleware imports; the commands the IaC runs are the images'."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from components.k8s.engine_args import MIDDLEWARE, sglang_command
from components.mocking import RecordingMocks
from components.settings import Images
from components.testing import REPO
from modelfleet.config import load_config

DOCKERFILES = ["platform", "vllm", "sglang"]
LOCK = "requirements/constraints.txt"

EXTRAS = {"platform": {"gateway", "control-plane", "batch"}, "vllm": {"middleware"}, "sglang": set()}
"""The extras each image installs, and nothing else."""
PLATFORM_COMMANDS = {"envoy_control": "control-plane", "gateway_ext": "gateway", "batch": "batch"}
"""``python -m X`` that the IaC runs on the platform image -> the extra ``X`` needs."""
FIRST_PARTY = {"modelfleet", "envoy_control", "gateway_ext", "batch", "replica", "replica_middleware",
               "autoscale", "sim", "components"}


def _text(name: str) -> str:
    return (REPO / "images" / f"{name}.Dockerfile").read_text()


def _instructions(text: str, keyword: str) -> list[str]:
    """Every ``keyword`` instruction (RUN, COPY, ...) with its continuation lines joined."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return [line[len(keyword) + 1:].strip() for line in joined.splitlines()
            if line.startswith(keyword + " ")]


def _header(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if line.startswith("#"))


def _copied(name: str) -> list[str]:
    """The repository paths an image copies (sources of every COPY, without a trailing /)."""
    return [src.rstrip("/") for args in _instructions(_text(name), "COPY")
            for src in args.split()[:-1] if not src.startswith("--")]


def _pip_installs(text: str) -> list[str]:
    return [cmd.strip() for run in _instructions(text, "RUN") for cmd in run.split("&&")
            if re.search(r"\bpip install\b", cmd)]


@pytest.mark.parametrize("name", DOCKERFILES)
def test_bases_are_pinned(name: str) -> None:
    bases = re.findall(r"^(?:ARG \w+_IMAGE=|FROM )(\S+)", _text(name), flags=re.M)
    assert bases and all(":" in b and not b.endswith(":latest") for b in bases if not b.startswith("$"))


@pytest.mark.parametrize("name", DOCKERFILES)
def test_each_image_installs_only_its_extra_from_the_lock(name: str) -> None:
    text = _text(name)
    optional = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert EXTRAS[name] <= set(optional)
    installs = _pip_installs(text)
    if not EXTRAS[name]:
        assert installs == [] and _copied(name) == []
        return
    assert installs
    # Every pip install is constrained by the lock (directly, or through extras.py constraints,
    # which keeps a base image's own pins and takes the rest from the lock).
    derived = {m for m in re.findall(rf"extras\.py constraints {re.escape(LOCK)} > (\S+)", text)}
    for cmd in installs:
        constraint = re.search(r"(?:-c|--constraint)\s+(\S+)", cmd)
        assert constraint and constraint.group(1) in {LOCK, *derived}, cmd
        assert "--no-deps" not in cmd, cmd
    # ... and asks only for the image's extras.
    for cmd in installs:
        for spec in re.findall(r"\"?\.\[([^\]]*)\]\"?", cmd):
            assert set(spec.split(",")) == EXTRAS[name], cmd
        for req_file in re.findall(r"-r\s+(\S+)", cmd):
            (listed,) = re.findall(rf"extras\.py requirements ([\w -]+?) > {re.escape(req_file)}", text)
            assert set(listed.split()) == EXTRAS[name], cmd
        assert re.search(r"\.\[|-r\s", cmd), f"{cmd}: installs something that is not an extra"


def test_the_platform_image_has_every_package_folder_for_the_build() -> None:
    packages = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    folders = {"envoy" if top == "envoy_control" else top for top in (p.split(".")[0] for p in packages)}
    copied = set(_copied("platform"))
    assert folders <= copied, f"platform.Dockerfile misses {sorted(folders - copied)}"


def _module_file(module: str) -> Path | None:
    parts = module.split(".")
    base = REPO / ("envoy" if parts[0] == "envoy_control" else parts[0])
    path = base.joinpath(*parts[1:])
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    return path.with_suffix(".py") if path.with_suffix(".py").is_file() else None


def _first_party_closure(package: str) -> set[Path]:
    """Files of every first-party module ``package`` imports, transitively (any import statement,
    also inside functions), with the ``__init__.py`` of each package on the way."""
    todo = [str(p.relative_to(REPO).with_suffix("")).replace("/", ".")
            for p in (REPO / package).rglob("*.py")]
    seen: set[str] = set()
    files: set[Path] = set()
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        parts = module.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]
        file = _module_file(module)
        if file is None:
            continue
        files.add(file)
        is_package = file.name == "__init__.py"
        for node in ast.walk(ast.parse(file.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = parts if is_package else parts[:-1]
                    anchor = anchor[: len(anchor) - node.level + 1]
                    base = ".".join([*anchor, *([node.module] if node.module else [])])
                names = [base, *(f"{base}.{a.name}" for a in node.names)]
            todo += [n for n in names if n.split(".")[0] in FIRST_PARTY]
    return files


def test_the_vllm_image_copies_only_what_the_middleware_imports() -> None:
    module = MIDDLEWARE.rsplit(".", 2)[0]
    needed = _first_party_closure(module)
    assert {f.relative_to(REPO).parts[0] for f in needed} == {"modelfleet", "replica_middleware"}
    copied = [REPO / src for src in _copied("vllm") if src not in {"pyproject.toml"}
              and not src.startswith("requirements/")]
    for path in copied:
        assert path.exists(), path
        if path.is_dir():
            # a copied folder is a package the middleware imports from
            assert any(f.parent == path for f in needed), f"vllm.Dockerfile copies {path.name}/, unused"
        else:
            assert path in needed or path.name == "py.typed", f"vllm.Dockerfile copies {path}, unused"
    covered = [f for f in needed if any(f == p or p in f.parents for p in copied)]
    assert sorted(set(needed) - set(covered)) == []
    for unused in ("sim", "components", "replica", "envoy", "gateway_ext", "batch", "autoscale",
                   "modelfleet/config", "modelfleet/cli", "modelfleet/local"):
        assert not any(p == REPO / unused or REPO / unused in p.parents for p in copied), unused


def test_the_vllm_image_checks_the_middleware_it_will_load() -> None:
    text = _text("vllm")
    module, cls = MIDDLEWARE.rsplit(".", 1)
    assert f"from {module} import {cls}" in text
    assert f"--middleware {MIDDLEWARE}" in _header(text)
    assert "FROM ${VLLM_IMAGE}" in text and "vllm/vllm-openai:v" in text


def _ignored(patterns: list[tuple[bool, re.Pattern[str]]], path: str) -> bool:
    """Whether a .dockerignore excludes ``path`` (the last matching pattern decides; a pattern
    that matches a parent folder matches what is inside it)."""
    parents = [path] + ["/".join(path.split("/")[:i]) for i in range(1, path.count("/") + 1)]
    excluded = False
    for negated, pattern in patterns:
        if any(pattern.fullmatch(p) for p in parents):
            excluded = not negated
    return excluded


def _dockerignore(name: str) -> list[tuple[bool, re.Pattern[str]]]:
    out = []
    for line in (REPO / "images" / f"{name}.Dockerfile.dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negated, line = line.startswith("!"), line.lstrip("!").rstrip("/")
        regex = re.escape(line).replace(r"\*\*/", "(?:.*/)?").replace(r"\*", "[^/]*")
        out.append((negated, re.compile(regex)))
    return out


@pytest.mark.parametrize("name", DOCKERFILES)
def test_the_build_context_holds_only_what_is_copied(name: str) -> None:
    patterns = _dockerignore(name)
    copied = _copied(name)
    for src in copied:
        assert not _ignored(patterns, src), f"{name}: {src} is copied but ignored"
        assert not _ignored(patterns, f"{src}/x.py") or not (REPO / src).is_dir(), src
    for junk in ("modelfleet/__pycache__/x.pyc", "replica_middleware/x.pyc", ".venv/bin/python",
                 "tests/project/test_layout.py", ".git/HEAD"):
        assert _ignored(patterns, junk), f"{name}: {junk} reaches the build context"
    for entry in REPO.iterdir():
        top = entry.name
        if not any(src == top or src.startswith(top + "/") for src in copied):
            assert _ignored(patterns, top), f"{name}: {top} is not copied but reaches the context"


def _containers(mocks: RecordingMocks) -> list[dict[str, Any]]:
    out = []
    for obj in mocks.kubernetes_objects():
        pod = obj.get("spec", {}).get("template", {}).get("spec", {})
        out += pod.get("containers", []) + pod.get("initContainers", [])
    return out


def test_the_commands_the_iac_runs_are_the_images(us_east: RecordingMocks) -> None:
    containers = _containers(us_east)
    platform = [c for c in containers if "/platform:" in c["image"]]
    modules = {c["command"][2] for c in platform if c["command"][:2] == ["python", "-m"]}
    assert [c["command"] for c in platform if c["command"][:2] != ["python", "-m"]] == []
    assert modules == set(PLATFORM_COMMANDS)
    text = _text("platform")
    checked = re.search(r'python -c "import ([^"]+)"', text)
    assert checked
    for module, extra in PLATFORM_COMMANDS.items():
        assert f"python -m {module} " in _header(text)
        assert extra in EXTRAS["platform"]
        assert any(m.strip().split(".")[0] == module for m in checked.group(1).split(","))

    engines = [c for c in containers if "/vllm:" in c["image"]]
    assert engines and all(c["command"] == ["vllm", "serve"] for c in engines)
    assert all(c["args"][c["args"].index("--middleware") + 1] == MIDDLEWARE for c in engines)


def test_the_sglang_image_runs_nothing_of_the_project() -> None:
    version = load_config(REPO / "config").config.versions[0]
    command, args = sglang_command(version.model_copy(update={"engine": "sglang"}))
    assert " ".join(command) in _header(_text("sglang"))
    assert not any(name in " ".join(args) for name in FIRST_PARTY)


def test_third_party_images_are_pinned() -> None:
    images = Images()
    for ref in (images.envoy, images.pause, images.aws_cli):
        assert re.search(r":v?\d+\.\d+", ref), ref

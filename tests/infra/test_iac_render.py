"""``modelfleet render``: files for every resource, and ``--diff`` against an earlier render."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import yaml

from components.testing import REPO
from modelfleet.cli import render


def _render(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    render.register(parser.add_subparsers())
    args = parser.parse_args(["render", "--stacks-dir", str(REPO / "stacks"), *argv])
    code: int = args.run(args)
    return code


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("render") / "us-east-1"
    assert _render("--stack", "us-east-1", "--out", str(out)) == 0
    return out


def test_render_writes_every_resource(baseline: Path) -> None:
    deployment = yaml.safe_load((baseline / "kubernetes/modelfleet/Deployment-vllm-reason-70b-v1.yaml").read_text())
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--tensor-parallel-size") + 1] == "2"
    node_group = json.loads((baseline / "aws/eks/NodeGroup-gpu-a100-80gb-ng.json").read_text())
    assert node_group["amiType"] == "AL2023_x86_64_NVIDIA"
    assert (baseline / "helm/addons-keda.yaml").is_file()
    index = json.loads((baseline / "index.json").read_text())
    assert {"type": "modelfleet:k8s:ModelPool", "name": "chat-7b@v13", "file": None} in index
    files = [p for p in baseline.rglob("*") if p.is_file()]
    assert len(files) > 80
    assert not any("render-placeholder" in p.read_text() for p in files)  # secrets never written


def test_diff_reports_a_changed_replica_count(baseline: Path, config_copy: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    pools = config_copy / "pools.yaml"
    pools.write_text(pools.read_text().replace(
        "{model: chat-7b, version: v13, region: us-east-1, min_replicas: 6, max_replicas: 16}",
        "{model: chat-7b, version: v13, region: us-east-1, min_replicas: 8, max_replicas: 20}"))
    capsys.readouterr()
    assert _render("--stack", "us-east-1", "--config", str(config_copy), "--diff", str(baseline)) == 0
    out = capsys.readouterr().out
    assert "~ kubernetes/modelfleet/ScaledObject-vllm-chat-7b-v13.yaml" in out
    assert "-  maxReplicaCount: 16" in out and "+  maxReplicaCount: 20" in out
    assert "-  minReplicaCount: 6" in out and "+  minReplicaCount: 8" in out
    assert "~ kubernetes/modelfleet/Deployment-vllm-chat-7b-v13.yaml" in out
    assert "+  replicas: 8" in out
    assert "~ kubernetes/modelfleet/ConfigMap-modelfleet-config.yaml" in out  # the control plane's copy
    assert "-      - {model: chat-7b, version: v13, region: us-east-1, min_replicas: 6, max_replicas: 16}" in out
    assert "ScaledObject-vllm-chat-7b-v14" not in out


def test_diff_of_an_unchanged_config(baseline: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _render("--stack", "us-east-1", "--diff", str(baseline), "--json") == 0
    result = json.loads(capsys.readouterr().out)
    assert result["ok"] and result["diff"] == {"added": [], "removed": [], "changed": {}}


def test_a_config_error_renders_nothing(config_copy: Path, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    pools = config_copy / "pools.yaml"
    pools.write_text(pools.read_text().replace("version: v14, region: us-east-1", "version: v99, region: us-east-1"))
    out = tmp_path / "out"
    assert _render("--stack", "us-east-1", "--config", str(config_copy), "--out", str(out)) == 1
    err = capsys.readouterr().err
    assert "config error, nothing rendered" in err and "pool names chat-7b@v99" in err
    assert not out.exists()


def test_an_unknown_stack_lists_the_known_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert _render("--stack", "ap-south-1") == 1
    assert "stacks: eu-west-1, global, us-east-1" in capsys.readouterr().err


def test_a_folder_that_is_no_render_is_not_overwritten(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    assert _render("--stack", "global", "--out", str(tmp_path)) == 1
    assert (tmp_path / "notes.txt").read_text() == "mine"

"""The Dockerfiles: pinned bases, every package folder copied, the middleware the pools load."""

from __future__ import annotations

import re
import tomllib

import pytest

from components.k8s.engine_args import MIDDLEWARE
from components.settings import Images
from components.testing import REPO

DOCKERFILES = ["platform", "vllm", "sglang"]


@pytest.mark.parametrize("name", DOCKERFILES)
def test_bases_are_pinned_and_every_package_is_copied(name: str) -> None:
    text = (REPO / "images" / f"{name}.Dockerfile").read_text()
    bases = re.findall(r"^(?:ARG \w+_IMAGE=|FROM )(\S+)", text, flags=re.M)
    assert bases and all(":" in b and not b.endswith(":latest") for b in bases if not b.startswith("$"))
    packages = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    folders = {"envoy" if p == "envoy_control" else p.split(".")[0] for p in packages}
    copied = set(re.findall(r"^COPY (\w+)/ ", text, flags=re.M))
    assert folders <= copied, f"{name}.Dockerfile misses {sorted(folders - copied)}"


def test_the_vllm_image_checks_the_middleware_it_will_load() -> None:
    text = (REPO / "images" / "vllm.Dockerfile").read_text()
    module, cls = MIDDLEWARE.rsplit(".", 1)
    assert f"from {module} import {cls}" in text
    assert "FROM ${VLLM_IMAGE}" in text and "vllm/vllm-openai:v" in text


def test_third_party_images_are_pinned() -> None:
    images = Images()
    for ref in (images.envoy, images.pause, images.aws_cli):
        assert re.search(r":v?\d+\.\d+", ref), ref

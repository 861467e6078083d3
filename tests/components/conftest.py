"""Fixtures for the component tests: the example config and a way to build components under
``pulumi.runtime.Mocks`` (each test builds only what it checks)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from components.mocking import RecordingMocks, run_program
from components.settings import Images
from modelfleet.config import PlatformConfig, load_config

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def config() -> PlatformConfig:
    """The declared config under ``config/``: chat-7b v13 (live) and v14 (canary), reason-70b v1
    (INT8, 2 GPUs), pools in us-east-1 and eu-west-1."""
    return load_config(REPO / "config").config


@pytest.fixture
def build() -> Callable[[Callable[[], object]], RecordingMocks]:
    """Run a function that declares components under fresh recording mocks."""
    return run_program


@pytest.fixture(scope="session")
def images() -> Images:
    return Images(registry="registry.test/modelfleet", tag="t1")

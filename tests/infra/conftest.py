"""Fixtures for the whole-program tests: the stacks as declared in ``stacks/``, run under mocks
once per session (a region takes about a second)."""

from __future__ import annotations

from pathlib import Path

import pytest

from components.mocking import RecordingMocks
from components.testing import REPO, render_stack


@pytest.fixture(scope="session")
def us_east() -> RecordingMocks:
    return render_stack("us-east-1")


@pytest.fixture(scope="session")
def eu_west() -> RecordingMocks:
    return render_stack("eu-west-1")


@pytest.fixture(scope="session")
def global_layer() -> RecordingMocks:
    return render_stack("global")


@pytest.fixture
def config_copy(tmp_path: Path) -> Path:
    """A copy of ``config/`` to edit, as a config pull request would."""
    out = tmp_path / "config"
    out.mkdir()
    for f in (REPO / "config").glob("*.yaml"):
        (out / f.name).write_text(f.read_text())
    return out

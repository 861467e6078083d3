"""Test helpers for components and the program (like ``replica.testing``): look up pools,
declared objects and inputs in recorded mocks, and run a stack of ``stacks/`` under mocks."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from components.mocking import RecordingMocks, plain, run_program
from components.program import stack_program
from components.settings import settings_from_file
from modelfleet.config import PlatformConfig
from modelfleet.config.schema import Model, Pool, Version

REPO = Path(__file__).resolve().parents[1]
"""The project root (the checkout; components is installed editable)."""

Build = Callable[[Callable[[], object]], RecordingMocks]
"""The ``build`` fixture: run a function that declares components under fresh mocks."""


def pool_of(config: PlatformConfig, key: str, region: str = "us-east-1") -> tuple[Pool, Version, Model]:
    """The pool ``key`` (``model@version``) in ``region``, its version and its model."""
    pool = next(p for p in config.pools if p.key == key and p.region == region)
    version = config.version(pool.model, pool.version)
    model = config.model(pool.model)
    assert version is not None and model is not None
    return pool, version, model


def objects(mocks: RecordingMocks, kind: str) -> list[dict[str, Any]]:
    """Every declared Kubernetes object of ``kind``, as plain data."""
    return [o for o in mocks.kubernetes_objects() if o["kind"] == kind]


def inputs(mocks: RecordingMocks, typ: str) -> list[dict[str, Any]]:
    """The plain inputs of every resource of Pulumi type ``typ``."""
    return [plain(r.inputs) for r in mocks.of_type(typ)]


def render_stack(stack: str, config_dir: Path | None = None) -> RecordingMocks:
    """Run the program of ``stacks/Pulumi.<stack>.yaml`` under recording mocks."""
    settings = settings_from_file(REPO / "stacks", stack, config_dir)
    return run_program(stack_program(settings), stack=stack)

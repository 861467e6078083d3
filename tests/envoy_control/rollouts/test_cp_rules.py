"""The Prometheus rules under rules/: ``promtool check rules`` and ``promtool test rules``.

Skipped where promtool is not installed (Debian package prometheus), failed instead when CI=true.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
RULES = sorted((REPO / "rules").glob("*.yml"))
RULE_TESTS = sorted((REPO / "rules" / "tests").glob("*.yml"))


@pytest.fixture(scope="module")
def promtool() -> str:
    path = shutil.which("promtool") or ("/usr/bin/promtool" if Path("/usr/bin/promtool").exists() else None)
    if path is None:
        message = "promtool is not installed (Debian package prometheus)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


def test_rule_files_pass_promtool_check(promtool: str) -> None:
    assert {p.name for p in RULES} == {"guard.yml", "online.yml"}
    done = subprocess.run([promtool, "check", "rules", *map(str, RULES)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_rule_unit_tests_are_green(promtool: str) -> None:
    assert {p.name for p in RULE_TESTS} == {"guard_test.yml", "online_test.yml"}
    done = subprocess.run([promtool, "test", "rules", *map(str, RULE_TESTS)], capture_output=True,
                          text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("SUCCESS") == len(RULE_TESTS)

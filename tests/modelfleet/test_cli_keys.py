"""`modelfleet keys add`: a key printed once, only its hash written, comments kept."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from modelfleet.cli.main import main
from modelfleet.config import load_config
from modelfleet.config.edit import add_key_hash
from modelfleet.config.keyhash import hash_key
from modelfleet.config.keys import KeyRing

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def cfg(tmp_path: Path) -> Path:
    dest = tmp_path / "config"
    shutil.copytree(REPO / "config", dest)
    return dest


def test_added_key_authenticates_and_only_its_hash_is_stored(cfg: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = (cfg / "teams.yaml").read_text()
    assert main(["keys", "add", "support", "--config", str(cfg)]) == 0
    key = capsys.readouterr().out.strip()
    assert key.startswith("mf-") and len(key) > 40
    after = (cfg / "teams.yaml").read_text()
    assert key not in after and hash_key(key) in after
    # comments and the other teams are untouched: only the one line changed
    changed = [(a, b) for a, b in zip(before.splitlines(), after.splitlines(), strict=True) if a != b]
    assert len(changed) == 1 and "key_hashes" in changed[0][1]
    teams = load_config(cfg).config.teams
    support = next(t for t in teams if t.name == "support")
    assert len(support.key_hashes) == 2
    auth = KeyRing(teams).authenticate(f"Bearer {key}")
    assert getattr(auth, "team", None) is not None and auth.team.name == "support"  # type: ignore[union-attr]


def test_block_list_and_missing_key_hashes(cfg: Path) -> None:
    text = (cfg / "teams.yaml").read_text()
    first = text.split("key_hashes: [")[1].split("]")[0]
    text = text.replace(f"key_hashes: [{first}]", f"key_hashes:\n      - {first}", 1)
    (cfg / "teams.yaml").write_text(text)
    add_key_hash(cfg, "search", hash_key("k1"))
    team = next(t for t in load_config(cfg).config.teams if t.name == "search")
    assert team.key_hashes == (first, hash_key("k1"))

    text = (cfg / "teams.yaml").read_text()
    research_hash = next(t for t in load_config(cfg).config.teams if t.name == "research").key_hashes[0]
    (cfg / "teams.yaml").write_text(text.replace(f"    key_hashes: [{research_hash}]\n", ""))
    (cfg / "local.yaml").write_text((cfg / "local.yaml").read_text().replace(
        "    research: mf-dev-research-00000000000003\n", ""))
    add_key_hash(cfg, "research", hash_key("k2"))
    team = next(t for t in load_config(cfg).config.teams if t.name == "research")
    assert team.key_hashes == (hash_key("k2"),)


def test_unknown_team_changes_nothing(cfg: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = (cfg / "teams.yaml").read_text()
    assert main(["keys", "add", "nobody", "--config", str(cfg)]) == 1
    assert "no team 'nobody'" in capsys.readouterr().err
    assert (cfg / "teams.yaml").read_text() == before

"""Loading and checking the declared config (modelfleet.config)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from modelfleet.config import ConfigError, load_config

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "config"


@pytest.fixture
def cfg_dir(tmp_path: Path) -> Path:
    """A writable copy of the example config."""
    dest = tmp_path / "config"
    shutil.copytree(EXAMPLE, dest)
    return dest


def edit(dir_: Path, file: str, change: object) -> None:
    """Load ``file``, let ``change`` mutate the plain data, write it back."""
    path = dir_ / file
    data = yaml.safe_load(path.read_text())
    change(data)  # type: ignore[operator]
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def errors_of(dir_: Path) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(dir_)
    return [str(p) for p in info.value.problems if p.severity == "error"]


def test_example_config_loads_with_the_seed_shape() -> None:
    result = load_config(EXAMPLE)
    cfg = result.config
    chat = cfg.model("chat-7b")
    assert chat is not None and chat.live == "v13"
    assert chat.canary is not None and (chat.canary.version, chat.canary.percent) == ("v14", 10)
    reason = cfg.versions_of("reason-70b")
    assert [(v.precision, v.gpus_per_replica) for v in reason] == [("int8", 2)]
    assert {t.name for t in cfg.teams} == {"search", "support", "research"}
    assert result.warnings == []


def test_every_error_is_reported_with_file_line_and_field_path(cfg_dir: Path) -> None:
    def break_versions(d: dict) -> None:  # type: ignore[type-arg]
        d["versions"][1]["precision"] = "fp8"
        d["versions"][2]["gpus_per_replica"] = "two"

    edit(cfg_dir, "models.yaml", break_versions)
    edit(cfg_dir, "pools.yaml", lambda d: d["pools"][0].update(min_replicas=-1))
    errs = errors_of(cfg_dir)
    text = "\n".join(errs)
    assert "models.yaml" in text and "versions[1].precision" in text
    assert "versions[2].gpus_per_replica" in text
    assert "pools.yaml" in text and "pools[0].min_replicas" in text
    # line numbers point into the file
    line = next(e for e in errs if "versions[1].precision" in e).split(":")[1]
    assert line.isdigit() and int(line) > 1


def test_alias_and_pool_must_name_declared_versions(cfg_dir: Path) -> None:
    edit(cfg_dir, "models.yaml", lambda d: d["models"][0].update(live="v99"))
    edit(cfg_dir, "pools.yaml", lambda d: d["pools"][1].update(version="v42"))
    text = "\n".join(errors_of(cfg_dir))
    assert "models[0].live" in text and "chat-7b@v99" in text
    assert "pools[1].version" in text and "chat-7b@v42" in text


def test_guaranteed_shares_of_a_model_sum_to_at_most_one(cfg_dir: Path) -> None:
    edit(cfg_dir, "teams.yaml", lambda d: d["teams"][2]["limits"][0].update(guaranteed_share=0.4))
    text = "\n".join(errors_of(cfg_dir))
    assert "guaranteed shares of chat-7b sum to 1.20" in text
    assert "teams.yaml" in text


def _reason_version(d: dict, **changes: object) -> None:  # type: ignore[type-arg]
    v = next(v for v in d["versions"] if v["model"] == "reason-70b")
    v.update(changes)


def test_70b_fp16_on_two_gpus_is_rejected(cfg_dir: Path) -> None:
    edit(cfg_dir, "models.yaml", lambda d: _reason_version(d, precision="fp16"))
    text = "\n".join(errors_of(cfg_dir))
    assert "versions[2].gpus_per_replica" in text
    assert "140 GB of weights" in text


def test_70b_fp16_on_four_gpus_is_accepted(cfg_dir: Path) -> None:
    edit(cfg_dir, "models.yaml", lambda d: _reason_version(d, precision="fp16", gpus_per_replica=4))
    load_config(cfg_dir)


def test_70b_4bit_on_one_gpu_is_accepted_with_a_warning(cfg_dir: Path) -> None:
    edit(cfg_dir, "models.yaml", lambda d: _reason_version(d, precision="4bit", gpus_per_replica=1))
    result = load_config(cfg_dir)
    assert len(result.warnings) == 1
    assert "reasoning quality needs an eval" in result.warnings[0].message
    assert result.warnings[0].location.path == "versions[2].precision"


def test_tensor_parallelism_must_divide_attention_heads(cfg_dir: Path) -> None:
    edit(cfg_dir, "models.yaml", lambda d: _reason_version(d, gpus_per_replica=3))
    text = "\n".join(errors_of(cfg_dir))
    assert "does not divide 64 attention heads" in text


def test_unknown_keys_and_sections_are_errors(cfg_dir: Path) -> None:
    edit(cfg_dir, "teams.yaml", lambda d: d["teams"][0].update(tokens_per_day=5))
    (cfg_dir / "extra.yaml").write_text("routes: []\n")
    text = "\n".join(errors_of(cfg_dir))
    assert "teams[0].tokens_per_day" in text
    assert "extra.yaml" in text and "unknown section" in text


def test_invalid_yaml_is_reported_with_its_line(cfg_dir: Path) -> None:
    (cfg_dir / "broken.yaml").write_text("models:\n  - name: [unclosed\n")
    errs = errors_of(cfg_dir)
    assert any("broken.yaml:" in e and "not valid YAML" in e for e in errs)


def test_duplicates_and_canary_equal_to_live(cfg_dir: Path) -> None:
    def dup(d: dict) -> None:  # type: ignore[type-arg]
        d["versions"].append(dict(d["versions"][0]))
        d["models"][0]["canary"]["version"] = "v13"

    edit(cfg_dir, "models.yaml", dup)
    text = "\n".join(errors_of(cfg_dir))
    assert "chat-7b@v13 is declared more than once" in text
    assert "canary version is the live version" in text


def test_loaded_records_are_immutable() -> None:
    cfg = load_config(EXAMPLE).config
    with pytest.raises(Exception):  # noqa: B017 - pydantic raises ValidationError on frozen
        cfg.versions[0].precision = "int8"  # type: ignore[misc]


def test_dev_keys_must_match_their_teams_hashes(cfg_dir: Path) -> None:
    edit(cfg_dir, "local.yaml", lambda d: d["local"]["dev_keys"].update(search="mf-not-the-key", nobody="x"))
    text = "\n".join(errors_of(cfg_dir))
    assert "local.dev_keys.search" in text and "not among team search's key_hashes" in text
    assert "local.dev_keys.nobody" in text and "team 'nobody' is not declared" in text

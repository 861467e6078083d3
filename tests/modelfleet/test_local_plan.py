"""What the local stack starts, decided from the config."""

from __future__ import annotations

import json
from pathlib import Path

from modelfleet.config import load_config
from modelfleet.config.local_plan import replica_counts, replica_plan
from modelfleet.local.replicas import replica_argv
from replica.params import CHAT_7B, REASON_70B
from replica.version_params import engine_params

REPO = Path(__file__).resolve().parents[2]


def test_default_local_stack_is_three_live_one_canary_one_reasoning() -> None:
    cfg = load_config(REPO / "config").config
    assert replica_counts(cfg) == {"chat-7b@v13": 3, "chat-7b@v14": 1, "reason-70b@v1": 1}
    ids = [r.replica_id for r in replica_plan(cfg)]
    assert ids == ["chat-7b@v13-0", "chat-7b@v13-1", "chat-7b@v13-2", "chat-7b@v14-0", "reason-70b@v1-0"]


def test_unlisted_routed_versions_get_one_replica() -> None:
    cfg = load_config(REPO / "config").config
    cfg = cfg.model_copy(update={"local": cfg.local.model_copy(update={"replicas": {}})})
    assert replica_counts(cfg) == {"chat-7b@v13": 1, "chat-7b@v14": 1, "reason-70b@v1": 1}


def test_engine_params_from_the_version_match_the_seed_presets() -> None:
    cfg = load_config(REPO / "config").config
    chat = cfg.version("chat-7b", "v13")
    reason = cfg.version("reason-70b", "v1")
    assert chat is not None and reason is not None
    assert CHAT_7B.with_overrides(engine_params(chat)) == CHAT_7B
    assert REASON_70B.with_overrides(engine_params(reason)) == REASON_70B


def test_replica_command_line_serves_alias_and_explicit_name() -> None:
    cfg = load_config(REPO / "config").config
    v = cfg.version("chat-7b", "v14")
    assert v is not None
    argv = replica_argv(v, "chat-7b@v14-0", "127.0.0.1", 9001, "local", 10.0, 3)
    i = argv.index("--served-model-name")
    assert argv[i + 1 : i + 3] == ["chat-7b", "chat-7b@v14"]
    assert json.loads(argv[argv.index("--engine-params") + 1])["num_gpus"] == 1
    assert argv[1:3] == ["-P", "-m"]

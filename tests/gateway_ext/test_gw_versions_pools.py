"""Version choice (explicit, canary split by conversation) and the pools built from the config."""

from __future__ import annotations

import random

import pytest

from gateway_ext.limits.pools import make_pools, pool_capacities, replicas_per_version
from gateway_ext.request import ChatRequest, parse_chat_request
from gateway_ext.routing.versions import choose_version, split_point, version_chooser
from modelfleet.config import PlatformConfig
from modelfleet.config.schema import Canary


def test_explicit_version_wins(platform_config: PlatformConfig) -> None:
    chat = platform_config.model("chat-7b")
    assert chat is not None
    assert choose_version(chat, "v14", "conv-1", 0.0) == "v14"
    assert choose_version(chat, "v13", None, 0.01) == "v13"


@pytest.mark.parametrize(("percent", "draw", "expected"), [
    (10, 0.05, "v14"), (10, 0.10, "v13"), (10, 0.5, "v13"), (0, 0.0, "v13"), (100, 0.999, "v14"),
])
def test_without_conversation_the_draw_splits(
        platform_config: PlatformConfig, percent: float, draw: float, expected: str) -> None:
    chat = platform_config.model("chat-7b")
    assert chat is not None
    model = chat.model_copy(update={"canary": Canary(version="v14", percent=percent)})
    assert choose_version(model, None, None, draw) == expected


def test_a_conversation_keeps_its_version_and_the_split_is_about_the_percent(
        platform_config: PlatformConfig) -> None:
    chat = platform_config.model("chat-7b")
    assert chat is not None and chat.canary is not None and chat.canary.percent == 10
    for i in range(50):  # the draw is ignored when there is a conversation id
        first = choose_version(chat, None, f"conv-{i}", 0.0)
        assert all(choose_version(chat, None, f"conv-{i}", d) == first for d in (0.3, 0.99))
    share = sum(choose_version(chat, None, f"c{i}", 0.0) == "v14" for i in range(4000)) / 4000
    assert 0.08 < share < 0.12
    assert 0 <= split_point("x") < 1 and split_point("x") == split_point("x")


def test_the_chooser_draws_per_request_without_conversation(
        platform_config: PlatformConfig) -> None:
    choose = version_chooser(platform_config, random.Random(7))
    body = b'{"model": "chat-7b", "messages": [{"role": "user", "content": "hi"}]}'
    req = parse_chat_request(body, {}, platform_config)
    assert isinstance(req, ChatRequest)
    picks = [choose(req) for _ in range(2000)]
    assert 0.07 < picks.count("v14") / 2000 < 0.13


def test_pool_capacity_is_tokens_in_flight_times_replicas(platform_config: PlatformConfig) -> None:
    replicas = replicas_per_version(platform_config)
    assert replicas == {"chat-7b@v13": 3, "chat-7b@v14": 1, "reason-70b@v1": 1}
    capacities = pool_capacities(platform_config, replicas)
    assert capacities == {"chat-7b@v13": 336_000, "chat-7b@v14": 112_000, "reason-70b@v1": 40_000}
    override = replicas_per_version(platform_config, {"chat-7b@v13": 12, "nope@v1": 3})
    assert override["chat-7b@v13"] == 12 and "nope@v1" not in override


def test_pools_of_one_model_share_team_concurrency(platform_config: PlatformConfig) -> None:
    pools = make_pools(platform_config, {"chat-7b@v13": 100, "chat-7b@v14": 100,
                                         "reason-70b@v1": 100}, 8,
                       {"interactive": 60.0, "standard": 20.0, "batch": 120.0})
    assert pools["chat-7b@v13"].concurrency is pools["chat-7b@v14"].concurrency
    assert pools["chat-7b@v13"].concurrency is not pools["reason-70b@v1"].concurrency
    assert pools["chat-7b@v13"].config.max_queue == 8
    assert pools["chat-7b@v13"].config.in_flight_ttl_s == pytest.approx(4096 / 10 + 180)

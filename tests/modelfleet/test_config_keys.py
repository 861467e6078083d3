"""Team keys: hashing, generation, constant-time lookup, 401 and 403 outcomes."""

from __future__ import annotations

import hmac
import re

import pytest

from modelfleet.config import PlatformConfig, Team, TeamLimit
from modelfleet.config.keyhash import hash_key
from modelfleet.config.keys import Authenticated, KeyRing, authorize, bearer_token, generate_key
from modelfleet.contract.errors import ApiError, ErrorType
from modelfleet.contract.headers import PRIORITY_HEADER


def test_hash_key_is_the_config_form() -> None:
    assert hash_key("abc") == (
        "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")


def test_dev_keys_of_the_config_comment_match_the_declared_hashes(
        platform_config: PlatformConfig, dev_keys: dict[str, str]) -> None:
    ring = KeyRing(platform_config.teams)
    assert set(dev_keys) == {t.name for t in platform_config.teams}
    for team, key in dev_keys.items():
        result = ring.authenticate(f"Bearer {key}")
        assert isinstance(result, Authenticated) and result.team.name == team


def test_generated_keys_are_prefixed_random_and_urlsafe() -> None:
    made = {generate_key() for _ in range(50)}
    assert len(made) == 50
    for key in made:
        assert re.fullmatch(r"mf-[A-Za-z0-9_-]{43}", key)
    assert generate_key(lambda n: "x" * n) == "mf-" + "x" * 32


@pytest.mark.parametrize(("header", "key"), [
    ("Bearer abc", "abc"), ("bearer   abc ", "abc"), ("BEARER abc", "abc"),
    (None, None), ("", None), ("Bearer", None), ("Bearer ", None), ("Basic abc", None),
    ("abc", None),
])
def test_bearer_token(header: str | None, key: str | None) -> None:
    assert bearer_token(header) == key


@pytest.mark.parametrize(("header", "code"), [
    (None, "missing_api_key"), ("Basic Zm9vOmJhcg==", "missing_api_key"),
    ("Bearer mf-not-a-key", "invalid_api_key"),
    ("Bearer mf-dev-search-0000000000000002", "invalid_api_key"),
])
def test_missing_or_unknown_keys_are_401(platform_config: PlatformConfig, header: str | None,
                                         code: str) -> None:
    result = KeyRing(platform_config.teams).authenticate(header)
    assert isinstance(result, ApiError)
    assert (result.status, result.type, result.code) == (401, ErrorType.AUTHENTICATION, code)
    assert result.body()["error"]["type"] == "authentication_error"


def test_lookup_compares_every_hash_even_after_a_match(
        platform_config: PlatformConfig, dev_keys: dict[str, str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[bytes] = []
    real = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls.append(b)
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", counting)
    ring = KeyRing(platform_config.teams)
    first_team = platform_config.teams[0].name
    assert isinstance(ring.authenticate(f"Bearer {dev_keys[first_team]}"), Authenticated)
    assert len(calls) == len(ring) == sum(len(t.key_hashes) for t in platform_config.teams)


def test_a_team_may_have_several_keys() -> None:
    team = Team(name="multi", key_hashes=(hash_key("k1"), hash_key("k2")))
    ring = KeyRing([team])
    for key in ("k1", "k2"):
        result = ring.authenticate(f"Bearer {key}")
        assert isinstance(result, Authenticated) and result.team is team


def test_authorize_model_and_tier(platform_config: PlatformConfig) -> None:
    teams = {t.name: t for t in platform_config.teams}
    limit = authorize(teams["search"], "chat-7b", "interactive")
    assert isinstance(limit, TeamLimit) and limit.tokens_per_minute == 6_000_000

    no_model = authorize(teams["support"], "reason-70b", "standard")
    assert isinstance(no_model, ApiError)
    assert (no_model.status, no_model.type, no_model.code, no_model.param) == (
        403, ErrorType.PERMISSION, "model_not_allowed", "model")

    no_tier = authorize(teams["research"], "chat-7b", "interactive")
    assert isinstance(no_tier, ApiError)
    assert (no_tier.status, no_tier.code, no_tier.param) == (403, "tier_not_allowed", PRIORITY_HEADER)

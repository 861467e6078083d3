"""The FastAPI service in process: the check contract Envoy relies on, settles, metrics, debug
endpoints, settings, usage flushed to Postgres, and Redis down (fail open to local buckets)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from gateway_ext.metering.store import UsageStore
from gateway_ext.runtime import Runtime, build_runtime
from gateway_ext.service import create_app
from gateway_ext.settings import Settings
from modelfleet.config import PlatformConfig
from modelfleet.contract.headers import PRIORITY_HEADER, SHED_STATUS
from modelfleet.contract.metrics import GATEWAY_STORE_FALLBACKS, GATEWAY_TEAM_BUCKET_TOKENS

CHAT = {"model": "chat-7b", "max_tokens": 100, "messages": [{"role": "user", "content": "Hi!"}]}
PROMPT = 7


@asynccontextmanager
async def serve(settings: Settings, config: PlatformConfig) -> AsyncIterator[
        tuple[httpx.AsyncClient, Runtime]]:
    runtime = build_runtime(settings, config)
    app = create_app(runtime)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            yield client, runtime


@pytest.fixture
def settings(tmp_path: Path) -> Callable[..., Settings]:
    def make(**values: Any) -> Settings:
        base = {"usage_db_url": f"sqlite:///{tmp_path / 'usage.db'}",
                "spool": tmp_path / "spool.jsonl", "seed": 1, "debug": True}
        return Settings.from_env({}, **{**base, **values})
    return make


def check(key: str | None, body: Any = CHAT, **headers: str) -> dict[str, Any]:
    auth = {"authorization": f"Bearer {key}"} if key else {}
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return {"content": content, "headers": {**auth, **headers,
                                            "content-type": "application/json"}}


async def test_an_allowed_check_carries_the_upstream_and_client_headers(
        settings: Callable[..., Settings], platform_config: PlatformConfig,
        dev_keys: dict[str, str]) -> None:
    async with serve(settings(), platform_config) as (client, _):
        r = await client.post("/authz/v1/chat/completions",
                              **check(dev_keys["search"], **{PRIORITY_HEADER: "interactive"}))
        assert r.status_code == 200 and r.content == b""
        assert r.headers["x-route-version"] in ("chat-7b@v13", "chat-7b@v14")
        assert r.headers["x-modelfleet-team"] == "search"
        assert r.headers["x-modelfleet-tier"] == "interactive"
        assert len(r.headers["x-modelfleet-reservation"]) == 32
        assert r.headers["x-ratelimit-remaining-tokens"] == str(6_000_000 - PROMPT - 100)
        pinned = await client.post("/authz/v1/chat/completions",
                                   **check(dev_keys["search"], {**CHAT, "model": "chat-7b@v14"}))
        assert pinned.headers["x-route-version"] == "chat-7b@v14"


async def test_refusals_are_openai_json_and_a_503_uses_the_marker(
        settings: Callable[..., Settings], platform_config: PlatformConfig,
        dev_keys: dict[str, str]) -> None:
    async with serve(settings(replicas={"chat-7b@v13": 0, "chat-7b@v14": 0},
                              queue_timeout_batch_s=0.05), platform_config) as (client, _):
        missing = await client.post("/authz/v1/chat/completions", **check(None))
        assert missing.status_code == 401 and missing.json()["error"]["code"] == "missing_api_key"
        assert missing.headers["content-type"] == "application/json"
        bad = await client.post("/authz/v1/chat/completions",
                                **check(dev_keys["support"], {**CHAT, "max_tokens": 0}))
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_tokens"
        # no replica: a batch request waits, times out and is shed
        shed = await client.post("/authz/v1/chat/completions",
                                 **check(dev_keys["support"], **{PRIORITY_HEADER: "batch"}))
        assert shed.status_code == SHED_STATUS
        assert shed.json()["error"]["type"] == "server_error"
        assert int(shed.headers["retry-after"]) >= 5 and "retry-after-ms" in shed.headers


async def test_other_paths_only_need_a_key(
        settings: Callable[..., Settings], platform_config: PlatformConfig,
        dev_keys: dict[str, str]) -> None:
    async with serve(settings(), platform_config) as (client, _):
        ok = await client.get("/authz/v1/models",
                              headers={"authorization": f"Bearer {dev_keys['research']}"})
        assert ok.status_code == 200 and "x-route-version" not in ok.headers
        denied = await client.get("/authz/v1/models", headers={"authorization": "Bearer nope"})
        assert denied.status_code == 401 and denied.json()["error"]["code"] == "invalid_api_key"


async def test_a_settle_refunds_and_shows_in_metrics_and_the_debug_bucket(
        settings: Callable[..., Settings], platform_config: PlatformConfig,
        dev_keys: dict[str, str]) -> None:
    async with serve(settings(), platform_config) as (client, runtime):
        r = await client.post("/authz/v1/chat/completions", **check(dev_keys["research"]))
        report = {"reservation_id": r.headers["x-modelfleet-reservation"], "team": "research",
                  "model": "chat-7b", "version": r.headers["x-route-version"].split("@")[1],
                  "prompt_tokens": PROMPT, "cached_tokens": 0, "completion_tokens": 30,
                  "outcome": "finished"}
        settled = await client.post("/v1/settle", json=report)
        assert settled.json()["verdict"] == "settled"
        assert settled.json()["reserved_tokens"] == PROMPT + 100
        batch = (await client.post("/v1/settle", json={"reports": [report, report]})).json()
        assert [r["verdict"] for r in batch["results"]] == ["duplicate", "duplicate"]
        bad = await client.post("/v1/settle", json={**report, "completion_tokens": -1})
        assert bad.status_code == 422
        text = (await client.get("/metrics")).text
        assert (f'{GATEWAY_TEAM_BUCKET_TOKENS}{{event="refunded",model="chat-7b",'
                'team="research"} 70.0') in text
        bucket = (await client.get("/v1/debug/buckets/research/chat-7b")).json()
        assert bucket["touched"] and bucket["remaining_tokens"] >= 1_000_000 - PROMPT - 30
        pools = (await client.get("/v1/debug/pools")).json()
        assert pools["chat-7b@v13"]["in_flight_tokens"] == 0
        assert (await client.get("/health")).json()["running"] == 0
        assert runtime.lifecycle.running == 0
    async with serve(settings(debug=False), platform_config) as (client, _):
        assert (await client.get("/v1/debug/pools")).status_code == 404


async def test_usage_reaches_postgres_at_shutdown(
        settings: Callable[..., Settings], platform_config: PlatformConfig,
        dev_keys: dict[str, str], postgres_url: str, table_prefix: str) -> None:
    values = settings(usage_db_url=postgres_url, usage_table_prefix=table_prefix,
                      flush_interval_s=60)
    async with serve(values, platform_config) as (client, _):
        for completion in (10, 20):
            r = await client.post("/authz/v1/chat/completions", **check(dev_keys["support"]))
            await client.post("/v1/settle", json={
                "reservation_id": r.headers["x-modelfleet-reservation"], "team": "support",
                "model": "chat-7b", "version": "v13", "prompt_tokens": PROMPT,
                "cached_tokens": 2, "completion_tokens": completion})
        await client.post("/authz/v1/chat/completions", **check(dev_keys["support"], b"{"))
    store = UsageStore(postgres_url, table_prefix)
    try:
        rows = [r for r in store.rows() if r.key.team == "support"]
        assert sum(r.counts.output_tokens for r in rows) == 30
        assert sum(r.counts.prompt_tokens for r in rows) == 2 * PROMPT
        assert sum(r.counts.cached_tokens for r in rows) == 4
        assert sum(r.counts.requests for r in rows) == 2
        assert {r.key.region for r in rows} == {"local"}
    finally:
        store.drop_tables()
        store.dispose()


async def test_redis_down_fails_open_to_per_process_buckets(
        settings: Callable[..., Settings], platform_config: PlatformConfig,
        dev_keys: dict[str, str]) -> None:
    async with serve(settings(redis_url="redis://127.0.0.1:1/0", redis_timeout_s=0.05),
                     platform_config) as (client, _):
        r = await client.post("/authz/v1/chat/completions", **check(dev_keys["search"]))
        assert r.status_code == 200  # served: admission still guards the pool
        assert (await client.get("/health")).json()["bucket_store"] == "fallback"
        settled = await client.post("/v1/settle", json={
            "reservation_id": r.headers["x-modelfleet-reservation"], "team": "search",
            "model": "chat-7b", "version": "v13", "prompt_tokens": PROMPT,
            "completion_tokens": 1})
        assert settled.json()["verdict"] == "settled"  # in the local bucket it was made in
        text = (await client.get("/metrics")).text
        assert f'{GATEWAY_STORE_FALLBACKS}{{op="reserve"}} 1.0' in text


async def test_with_redis_the_bucket_is_shared(
        settings: Callable[..., Settings], platform_config: PlatformConfig,
        dev_keys: dict[str, str], redis_url: str, redis_prefix: str,
        redis_client: redis.Redis) -> None:
    async with serve(settings(redis_url=redis_url, redis_prefix=redis_prefix),
                     platform_config) as (client, _):
        r = await client.post("/authz/v1/chat/completions", **check(dev_keys["search"]))
        assert r.status_code == 200
        assert redis_client.exists(f"{redis_prefix}:bucket:{{search:chat-7b}}")
        assert (await client.get("/health")).json()["bucket_store"] == "ok"


def test_settings_read_the_environment_and_flags_win() -> None:
    env = {"MODELFLEET_GATEWAY_PORT": "9001", "MODELFLEET_GATEWAY_REPLICAS": '{"chat-7b@v13": 2}',
           "MODELFLEET_GATEWAY_REDIS_URL": "redis://env", "OTHER": "x"}
    s = Settings.from_env(env, redis_url="redis://flag", region=None)
    assert (s.port, s.replicas, s.redis_url, s.region) == (9001, {"chat-7b@v13": 2},
                                                           "redis://flag", None)
    with pytest.raises(ValueError):
        Settings.from_env({"MODELFLEET_GATEWAY_PORT": "not a port"})

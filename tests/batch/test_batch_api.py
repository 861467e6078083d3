"""The batch API in process (FastAPI over SQLite): team keys, a batch visible to its team only,
OpenAI-shaped errors for every bad request, cancel, list, and the service's settings."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from batch.service import batch_service_argv, create_batch_app, parse_args
from batch.settings import BatchSettings
from modelfleet.config import PlatformConfig
from modelfleet.contract.headers import PRIORITY_HEADER

NOW_WINDOW = "1h"


@pytest.fixture
def settings(tmp_path: Path) -> Callable[..., BatchSettings]:
    def make(**values: Any) -> BatchSettings:
        base = {"db_url": f"sqlite:///{tmp_path / 'b.db'}", "file_roots": [tmp_path / "data"],
                "role": "api"}
        return BatchSettings.from_env({}, **{**base, **values})
    (tmp_path / "data").mkdir()
    return make


@asynccontextmanager
async def serve(settings: BatchSettings, config: PlatformConfig) -> AsyncIterator[httpx.AsyncClient]:
    app = create_batch_app(settings, config)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://batch") as client:
            yield client


def auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def error_of(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    error: dict[str, Any] = body["error"]
    return error


async def test_a_batch_is_created_read_and_cancelled_by_its_team_only(
        settings: Callable[..., BatchSettings], platform_config: PlatformConfig,
        dev_keys: dict[str, str], tmp_path: Path) -> None:
    uri = (tmp_path / "data" / "in.jsonl").as_uri()
    async with serve(settings(), platform_config) as client:
        r = await client.post("/v1/batches", headers=auth(dev_keys["research"]), json={
            "model": "chat-7b", "input_uri": uri, "completion_window": "2h",
            "metadata": {"job": "nightly"}})
        assert r.status_code == 200, r.text
        made = r.json()
        assert made["status"] == "validating" and made["object"] == "batch"
        assert made["id"] == made["batch_id"] and made["id"].startswith("batch_")
        assert made["output_uri"] == (tmp_path / "data" / "in.output.jsonl").as_uri()
        assert made["deadline"] - made["created_at"] in (7199, 7200)
        assert made["counts"] == {"total": 0, "completed": 0, "failed": 0, "pending": 0,
                                  "incomplete": 0}
        assert made["metadata"] == {"job": "nightly"} and made["tier"] == "batch"
        path = f"/v1/batches/{made['id']}"
        got = await client.get(path, headers=auth(dev_keys["research"]))
        assert got.status_code == 200 and got.json()["id"] == made["id"]
        for other in ("support", "search"):  # same answer as for an id that does not exist
            hidden = error_of(await client.get(path, headers=auth(dev_keys[other])), 404)
            assert hidden["code"] == "batch_not_found" and hidden["type"] == "not_found_error"
            error_of(await client.post(path + "/cancel", headers=auth(dev_keys[other])), 404)
            listed = await client.get("/v1/batches", headers=auth(dev_keys[other]))
            assert listed.json()["data"] == []
        unknown = error_of(await client.get("/v1/batches/batch_x", headers=auth(dev_keys["research"])), 404)
        assert unknown["message"] == hidden["message"].replace(made["id"], "batch_x")
        cancel = await client.post(path + "/cancel", headers=auth(dev_keys["research"]))
        assert cancel.status_code == 200 and cancel.json()["status"] == "cancelling"
        assert cancel.json()["cancelling_at"] is not None
        again = await client.post(path + "/cancel", headers=auth(dev_keys["research"]))
        assert again.status_code == 200 and again.json()["status"] == "cancelling"
        listed = (await client.get("/v1/batches?limit=1", headers=auth(dev_keys["research"]))).json()
        assert [b["id"] for b in listed["data"]] == [made["id"]] and listed["has_more"] is False


async def test_keys_and_bad_requests_get_openai_errors(
        settings: Callable[..., BatchSettings], platform_config: PlatformConfig,
        dev_keys: dict[str, str], tmp_path: Path) -> None:
    uri = (tmp_path / "data" / "in.jsonl").as_uri()
    good = {"model": "chat-7b", "input_uri": uri}
    async with serve(settings(), platform_config) as client:
        assert error_of(await client.get("/v1/batches/batch_1"), 401)["code"] == "missing_api_key"
        assert error_of(await client.post("/v1/batches", json=good, headers=auth("mf-nope")),
                        401)["code"] == "invalid_api_key"
        research = auth(dev_keys["research"])
        cases: list[tuple[Any, int, str | None, str]] = [
            ({**good, "model": "llama-3"}, 404, "model", "model_not_found"),
            ({**good, "model": "chat-7b@v99"}, 404, "model", "model_not_found"),
            ({**good, "deadline": 1.0}, 400, "deadline", "invalid_request"),
            ({**good, "deadline": "2030-01-01T00:00:00"}, 400, "deadline", "invalid_request"),
            ({**good, "deadline": "tomorrow"}, 400, "deadline", "invalid_request"),
            ({**good, "completion_window": "soon"}, 400, "completion_window", "invalid_request"),
            ({**good, "completion_window": "30d"}, 400, "deadline", "invalid_request"),
            ({**good, "deadline": 4e9, "completion_window": "1h"}, 400, "deadline",
             "invalid_request"),
            ({**good, "input_uri": "file:///etc/passwd"}, 400, "input_uri", "uri_not_allowed"),
            ({**good, "input_uri": "ftp://x/y"}, 400, "input_uri", "invalid_uri"),
            ({**good, "output_uri": uri}, 400, "output_uri", "invalid_request"),
            ({**good, "endpoint": "/v1/embeddings"}, 400, "endpoint", "invalid_request"),
            ({**good, "input_file_id": "file-1"}, 400, "input_file_id", "invalid_request"),
            ({**good, "colour": "red"}, 400, "colour", "invalid_request"),
            ({"input_uri": uri}, 400, "model", "invalid_request"),
            ([1, 2], 400, None, "invalid_request"),
        ]
        for body, status, param, code in cases:
            error = error_of(await client.post("/v1/batches", json=body, headers=research), status)
            assert (error["param"], error["code"]) == (param, code), body
        raw = await client.post("/v1/batches", content=b"{nope", headers={
            **research, "content-type": "application/json"})
        assert error_of(raw, 400)["type"] == "invalid_request_error"
        # search may not send batch to chat-7b (its tiers: interactive, standard)
        denied = error_of(await client.post("/v1/batches", json=good,
                                            headers=auth(dev_keys["search"])), 403)
        assert denied["type"] == "permission_error" and denied["param"] == PRIORITY_HEADER
        when = datetime.now(UTC).replace(microsecond=0) + timedelta(days=1)
        with_z = await client.post("/v1/batches", headers=research, json={
            **good, "deadline": when.isoformat().replace("+00:00", "Z")})
        assert with_z.status_code == 200 and with_z.json()["deadline"] == when.timestamp()


def test_settings_flags_win_over_the_environment(tmp_path: Path) -> None:
    env = {"MODELFLEET_BATCH_CONCURRENCY": "3", "MODELFLEET_BATCH_FILE_ROOTS": json.dumps(["/a"]),
           "MODELFLEET_BATCH_S3_BUCKETS": '["b1"]', "MODELFLEET_BATCH_ROLE": "worker"}
    s = BatchSettings.from_env(env, **vars(parse_args(["--concurrency", "5"])))
    assert (s.concurrency, s.file_roots, s.s3_buckets, s.role) == (5, [Path("/a")], ["b1"], "worker")
    argv = batch_service_argv(tmp_path / "config", "127.0.0.1", 9000, "sqlite:///x.db",
                              "http://127.0.0.1:8080/v1", table_prefix="t_",
                              file_roots=[tmp_path], extra=["--concurrency", "2"])
    args = parse_args(argv[argv.index("batch") + 1:])
    flags = BatchSettings.from_env({}, **vars(args))
    assert (flags.port, flags.table_prefix, flags.dev_keys, flags.concurrency) == (9000, "t_", True, 2)
    assert flags.file_roots == [tmp_path] and flags.api_base_url == "http://127.0.0.1:8080/v1"

"""``/v1/files`` with OpenAI's own client, in process: upload, create a batch from the file, let the
worker run it (against a fake gateway), read the output file; files and batches per team; team
file roots (``{team}``) and S3 prefixes that another team cannot name."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import openai
import pytest

from batch.files import BatchFileError, BatchFiles
from batch.service import create_batch_app
from batch.settings import BatchSettings
from modelfleet.config import PlatformConfig

LINES = 5


def chat_answer(request: httpx.Request) -> httpx.Response:
    body = json.loads(request.content)
    return httpx.Response(200, json={
        "id": "chatcmpl-x", "object": "chat.completion", "model": body["model"],
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": "ok"}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}})


def input_file() -> bytes:
    return "".join(json.dumps({"custom_id": f"q{i}", "method": "POST",
                               "url": "/v1/chat/completions",
                               "body": {"model": "chat-7b", "max_tokens": 5,
                                        "messages": [{"role": "user", "content": f"q{i}"}]}})
                   + "\n" for i in range(LINES)).encode()


@asynccontextmanager
async def clients(tmp_path: Path, config: PlatformConfig,
                  keys: list[str]) -> AsyncIterator[list[openai.AsyncOpenAI]]:
    settings = BatchSettings.from_env(
        {}, db_url=f"sqlite:///{tmp_path / 'b.db'}", role="all", dev_keys=True,
        poll_interval_s=0.05, file_roots=[tmp_path / "teams" / "{team}"],
        files_dir=tmp_path / "uploads")
    app = create_batch_app(settings, config, transport=httpx.MockTransport(chat_answer))
    async with app.router.lifespan_context(app):
        made = [openai.AsyncOpenAI(api_key=key, base_url="http://batch/v1", max_retries=0,
                                   http_client=httpx.AsyncClient(  # type: ignore[arg-type]
                                       transport=httpx.ASGITransport(app=app)))
                for key in keys]
        yield made
        for client in made:
            await client.close()


async def test_the_openai_client_uploads_runs_and_reads_a_batch(
        tmp_path: Path, platform_config: PlatformConfig, dev_keys: dict[str, str]) -> None:
    async with clients(tmp_path, platform_config,
                       [dev_keys["research"], dev_keys["support"]]) as (client, other):
        uploaded = await client.files.create(file=("in.jsonl", io.BytesIO(input_file())),
                                             purpose="batch")
        assert uploaded.id.startswith("file-") and uploaded.bytes == len(input_file())
        assert uploaded.filename == "in.jsonl" and uploaded.purpose == "batch"
        batch = await client.batches.create(input_file_id=uploaded.id, completion_window="24h",
                                            endpoint="/v1/chat/completions")
        assert batch.input_file_id == uploaded.id and batch.completion_window == "24h"
        for _ in range(400):
            batch = await client.batches.retrieve(batch.id)
            if batch.status in ("completed", "failed", "expired", "cancelled"):
                break
            await asyncio.sleep(0.05)
        assert batch.status == "completed", batch
        assert batch.request_counts is not None and batch.request_counts.completed == LINES
        assert batch.output_file_id is not None
        text = (await client.files.content(batch.output_file_id)).text
        out = [json.loads(line) for line in text.splitlines()]
        assert [o["custom_id"] for o in out] == [f"q{i}" for i in range(LINES)]
        assert all(o["response"]["status_code"] == 200 for o in out)
        meta = await client.files.retrieve(batch.output_file_id)
        assert meta.bytes == len(text.encode()) and meta.purpose == "batch_output"
        assert [f.id for f in (await client.files.list()).data] == [uploaded.id]

        # another team: every id is unknown, and it cannot run a batch on the file
        for call in (other.files.content(uploaded.id), other.files.retrieve(uploaded.id),
                     other.files.content(batch.output_file_id),
                     other.batches.retrieve(batch.id)):
            with pytest.raises(openai.NotFoundError):
                await call
        with pytest.raises(openai.NotFoundError):
            await other.batches.create(input_file_id=uploaded.id, completion_window="24h",
                                       endpoint="/v1/chat/completions")
        assert (await other.files.list()).data == []
        with pytest.raises(openai.BadRequestError):
            await client.files.create(file=("x.jsonl", io.BytesIO(b"{}")),
                                      purpose="fine-tune")
        deleted = await client.files.delete(uploaded.id)
        assert deleted.deleted
        with pytest.raises(openai.NotFoundError):
            await client.files.retrieve(uploaded.id)


async def test_input_uris_are_confined_to_the_team(
        tmp_path: Path, platform_config: PlatformConfig, dev_keys: dict[str, str]) -> None:
    (tmp_path / "teams" / "support").mkdir(parents=True)
    theirs = tmp_path / "teams" / "support" / "in.jsonl"
    theirs.write_bytes(input_file())
    mine = tmp_path / "teams" / "research" / "in.jsonl"
    async with clients(tmp_path, platform_config,
                       [dev_keys["research"], dev_keys["support"]]) as (client, other):
        upload = await other.files.create(file=("in.jsonl", io.BytesIO(input_file())),
                                          purpose="batch")
        for uri in (theirs.as_uri(), (tmp_path / "uploads" / "support" /
                                      f"{upload.id}.jsonl").as_uri()):
            with pytest.raises(openai.BadRequestError) as refused:
                await client.post("/batches", cast_to=httpx.Response,
                                  body={"input_uri": uri, "model": "chat-7b"})
            assert refused.value.code == "uri_not_allowed", uri
        made = await other.post("/batches", cast_to=httpx.Response,
                                body={"input_uri": theirs.as_uri(), "model": "chat-7b"})
        assert made.json()["status"] == "validating"
        with pytest.raises(openai.BadRequestError):  # both inputs at once
            await client.post("/batches", cast_to=httpx.Response, body={
                "input_file_id": upload.id, "input_uri": mine.as_uri()})


def test_team_roots_and_s3_prefixes(tmp_path: Path) -> None:
    files = BatchFiles([tmp_path / "shared", tmp_path / "t" / "{team}"],
                       ["open-bucket", "tenants/batches/{team}/"], files_dir=tmp_path / "up")
    ok = [("a", (tmp_path / "shared" / "x").as_uri()), ("a", (tmp_path / "t/a/x").as_uri()),
          ("a", (tmp_path / "up/a/f").as_uri()), ("a", "s3://open-bucket/any/key"),
          ("a", "s3://tenants/batches/a/in.jsonl")]
    refused = [("a", (tmp_path / "t/b/x").as_uri()), ("a", (tmp_path / "up/b/f").as_uri()),
               ("a", "s3://tenants/batches/b/in.jsonl"), ("a", "s3://tenants/batches/ab/x"),
               ("a", "s3://other/x"), (None, (tmp_path / "t/a/x").as_uri())]
    for team, uri in ok:
        files.check(uri, team)
    for who, where in refused:
        with pytest.raises(BatchFileError):
            files.check(where, who)

"""The batch input file: OpenAI batch request lines to requests, per-line errors, and the
whole-file problems that fail a batch."""

from __future__ import annotations

import json
from typing import Any

from batch.lines import FileError, ParsedLine, parse_input
from batch.models import error_line, line_id, response_line

MESSAGES = [{"role": "user", "content": "hi"}]


def req(cid: Any, **over: Any) -> str:
    line = {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "chat-7b", "messages": MESSAGES, "max_tokens": 5}}
    line.update(over)
    return json.dumps(line)


def parse(*lines: str, model: str = "chat-7b", max_lines: int = 100) -> list[ParsedLine]:
    out = parse_input("\n".join(lines).encode(), model, max_lines)
    assert isinstance(out, list)
    return out


def test_good_lines_become_requests_in_file_order() -> None:
    body = {"messages": MESSAGES, "max_tokens": 5, "stream": False}
    got = parse(req("a"), "", req("b", body=body), req("c", body={**body, "model": "chat-7b@v14"}))
    assert [(p.line_no, p.custom_id, p.error) for p in got] == [(1, "a", None), (3, "b", None),
                                                                 (4, "c", None)]
    assert got[1].body == {"messages": MESSAGES, "max_tokens": 5, "model": "chat-7b"}  # filled
    assert got[2].body is not None and got[2].body["model"] == "chat-7b@v14"  # a pinned version


def test_malformed_lines_are_errors_of_their_own_line() -> None:
    got = parse(
        "{not json", "[1, 2]", req(""), req(None), req("a"), req("a"),
        req("m", method="GET"), req("u", url="/v1/embeddings"), req("b", body="text"),
        req("x", body={"model": "reason-70b", "messages": MESSAGES}),
        req("s", body={"messages": MESSAGES, "stream": True}),
        req("big", body={"messages": [{"role": "user", "content": "x" * (1 << 20)}]}),
        b"\xff\xfe".decode("latin-1"),
    )
    codes = [(p.line_no, p.custom_id, p.error.code if p.error else None) for p in got]
    assert codes == [
        (1, None, "invalid_json"), (2, None, "invalid_line"), (3, None, "invalid_custom_id"),
        (4, None, "invalid_custom_id"), (5, "a", None), (6, "a", "duplicate_custom_id"),
        (7, "m", "invalid_method"), (8, "u", "invalid_url"), (9, "b", "invalid_body"),
        (10, "x", "model_mismatch"), (11, "s", "stream_unsupported"), (12, "big", "body_too_large"),
        (13, None, "invalid_json"),
    ]
    assert all("x" * 20 not in (p.error.message if p.error else "") for p in got)  # never echoed


def test_whole_file_problems_fail_the_batch() -> None:
    assert parse_input(b"\n \n", "chat-7b") == FileError("empty_file", "The input file has no "
                                                         "request lines.")
    too_many = "\n".join(req(str(i)) for i in range(4)).encode()
    out = parse_input(too_many, "chat-7b", max_lines=3)
    assert isinstance(out, FileError) and out.code == "too_many_lines"


def test_output_lines_have_openai_batch_shape() -> None:
    ok = response_line("batch_1", 4, "a", 200, "chatcmpl-1", {"choices": []})
    assert ok == {"id": line_id("batch_1", 4), "custom_id": "a",
                  "response": {"status_code": 200, "request_id": "chatcmpl-1",
                               "body": {"choices": []}}, "error": None}
    bad = error_line("batch_1", 5, None, "invalid_json", "The line is not valid JSON.")
    assert bad["response"] is None and bad["error"]["line"] == 5
    assert line_id("batch_1", 4) == line_id("batch_1", 4) != line_id("batch_1", 5)
    assert line_id("batch_1", 4).startswith("batch_req_")

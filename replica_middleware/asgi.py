"""Small ASGI helpers of the middleware: read a request body, call the app in process."""

from __future__ import annotations

from typing import Any

from starlette.types import ASGIApp, Message, Receive


async def asgi_get(app: ASGIApp, path: str) -> tuple[int, bytes]:
    """``GET path`` on ``app`` in process: (status, body)."""
    out: dict[str, Any] = {"status": 500, "body": b""}

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            out["status"] = message["status"]
        elif message["type"] == "http.response.body":
            out["body"] += message.get("body", b"")

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
             "root_path": "", "headers": [], "client": ("127.0.0.1", 0),
             "server": ("127.0.0.1", 0)}
    await app(scope, receive, send)
    return int(out["status"]), bytes(out["body"])


async def read_body(receive: Receive) -> bytes:
    """The whole request body (empty if the client left first)."""
    body = b""
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return body
        body += bytes(message.get("body", b""))
        if not message.get("more_body", False):
            return body

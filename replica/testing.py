"""In-process helpers for tests and benchmarks: a replica under uvicorn in a thread, SSE parsing."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn
from fastapi import FastAPI


@contextlib.contextmanager
def serve_in_thread(app: FastAPI, host: str = "127.0.0.1", start_timeout_s: float = 10.0) -> Iterator[str]:
    """Run ``app`` under uvicorn on a free port of ``host`` in a daemon thread; yields its base URL.

    The app's lifespan (the engine loop) runs in that thread's event loop; leaving the block
    shuts the server down as SIGTERM would.
    """
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=0, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, name="replica-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout_s
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            server.should_exit = True
            raise RuntimeError("replica server did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=start_timeout_s)


def sse_data(body: str) -> list[str]:
    """The ``data:`` payloads of a server-sent event stream, in order."""
    return [line[len("data: "):] for line in body.splitlines() if line.startswith("data: ")]


def sse_json(body: str) -> list[dict[str, Any]]:
    """The JSON chunks of a stream, ``[DONE]`` left out."""
    return [json.loads(d) for d in sse_data(body) if d != "[DONE]"]

"""Fixtures for the replica tests: an in-process app (ASGI transport) and a live uvicorn server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from replica.chat import ReplicaConfig
from replica.params import CHAT_7B
from replica.server import create_app
from replica.testing import serve_in_thread

FAST = 200.0
"""Time scale of the tests: 200 model seconds per wall second, so a 300-token answer takes ~50 ms."""


def fast_config() -> ReplicaConfig:
    """chat-7b served as ``chat-7b`` and ``chat-7b@v13``, 200 times faster than real time."""
    return ReplicaConfig(
        served_model_names=("chat-7b", "chat-7b@v13"),
        params=CHAT_7B,
        model_version="chat-7b@v13",
        replica_id="chat-7b-v13-0",
        region="local",
        seed=1,
        time_scale=FAST,
    )


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client on an in-process replica whose engine loop runs in the app's lifespan."""
    app = create_app(fast_config())
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://replica", timeout=30) as c:
            yield c


@pytest.fixture(scope="module")
def live_url() -> Iterator[str]:
    """Base URL of a replica under a real uvicorn on 127.0.0.1 (one per test module)."""
    with serve_in_thread(create_app(fast_config())) as url:
        yield url

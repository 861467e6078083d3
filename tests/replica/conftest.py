"""Fixtures for the replica tests: an in-process app (ASGI transport) and live uvicorn servers
(the engine's app alone, and the replica as it runs: behind the modelfleet middleware)."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from replica.chat import ReplicaConfig
from replica.params import CHAT_7B
from replica.server import create_app, serve_app
from replica.testing import serve_in_thread
from replica_middleware.settings import MiddlewareSettings

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


def _served(time_scale: float) -> Iterator[str]:
    settings = MiddlewareSettings(replica_id="chat-7b-v13-0", model="chat-7b", version="v13",
                                  handle_sigterm=False, time_scale=time_scale)
    config = dataclasses.replace(fast_config(), time_scale=time_scale)
    with serve_in_thread(serve_app(config, settings)) as url:
        yield url


@pytest.fixture(scope="module")
def served_url() -> Iterator[str]:
    """Base URL of the replica as ``python -m replica`` runs it, the engine behind the modelfleet
    middleware (no control plane, no settle URL), under a real uvicorn on 127.0.0.1."""
    yield from _served(FAST)


@pytest.fixture
def slow_served_url() -> Iterator[str]:
    """:func:`served_url` at 20 model seconds per wall second: a 5,000-token answer streams for
    ~8 s, so a test sees it running whatever the machine's load (a loaded machine lets the engine
    catch up with the wall clock in bursts)."""
    yield from _served(20.0)

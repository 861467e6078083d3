"""Fixtures of the gateway_ext tests: real Redis here; the config, dev keys and Postgres from
:mod:`modelfleet.testing`.

Redis and Postgres are the machine's (``MODELFLEET_TEST_REDIS_URL``, ``MODELFLEET_TEST_POSTGRES_URL``
override the defaults). When one is missing its tests fail under ``CI=true`` and skip otherwise.
Every test gets its own Redis key prefix and its own table prefix, and its data is removed after.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from modelfleet.testing import (  # noqa: F401  (fixtures)
    dev_keys,
    platform_config,
    postgres_url,
    table_prefix,
)

REPO = Path(__file__).resolve().parents[2]
REDIS_URL = os.environ.get("MODELFLEET_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def _missing(what: str, exc: Exception) -> None:
    message = f"{what} is not reachable: {exc}"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def redis_url() -> str:
    """The URL of a reachable Redis (fails under CI=true, skips otherwise, when unreachable)."""
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.RedisError as exc:
        _missing(f"Redis at {REDIS_URL}", exc)
    finally:
        client.close()
    return REDIS_URL


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    """A client of the test Redis."""
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def redis_prefix(redis_client: redis.Redis) -> Iterator[str]:
    """A key prefix of this test alone; every key under it is deleted afterwards."""
    prefix = f"mf-test-{uuid.uuid4().hex[:12]}"
    yield prefix
    keys = list(redis_client.scan_iter(match=f"{prefix}:*", count=1000))
    if keys:
        redis_client.delete(*keys)

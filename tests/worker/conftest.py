"""Fixtures for worker tests: the real Redis (database 15) and a key prefix per test, deleted after.

Set LIGHTPATH_TEST_REDIS_URL to point elsewhere (default: the local server, db 15).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
import redis

REDIS_URL = os.environ.get("LIGHTPATH_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")


@pytest.fixture
def redis_url() -> str:
    return REDIS_URL


@pytest.fixture
def admin() -> Iterator[redis.Redis]:
    """A plain client for looking behind the bus's back."""
    client = redis.Redis.from_url(REDIS_URL)
    yield client
    client.close()


@pytest.fixture
def prefix(admin: redis.Redis) -> Iterator[str]:
    """A key prefix no other test uses; every key under it is deleted afterwards."""
    value = f"lightpath-test:{uuid.uuid4().hex[:12]}"
    yield value
    keys = list(admin.scan_iter(match=f"{value}*", count=1000))
    if keys:
        admin.delete(*keys)

"""Shared fixtures: real databases (SQLite file and the local PostgreSQL) and a live server.

PostgreSQL tests get a database of their own per test run, dropped at the end.
Set LIGHTPATH_TEST_POSTGRES_URL to point elsewhere (default: the local server).

Hypothesis runs derandomised by default (profile `ci`): a commit's property tests
draw the same examples on every machine, so a run that passed here passes in CI and
a failure reproduces. `HYPOTHESIS_PROFILE=explore` draws fresh random examples on
every run, to hunt for new counterexamples (each one found goes in as an
`@example`).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import psycopg
import pytest
import redis
from hypothesis import settings
from sqlalchemy import create_engine, text

from app.settings import Settings
from app.store.migrate import upgrade_to_head
from app.store.tables import metadata
from tests.support import LiveServer

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

REDIS_URL = os.environ.get("LIGHTPATH_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
ADMIN_URL = os.environ.get(
    "LIGHTPATH_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A fresh database on the real PostgreSQL server, migrated, dropped after the run."""
    name = f"lightpath_test_{uuid.uuid4().hex[:10]}"
    base = ADMIN_URL.rsplit("/", 1)[0]
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = f"{base}/{name}"
    upgrade_to_head(Settings(database_url=url))
    yield url
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _truncate(url: str) -> None:
    engine = create_engine(Settings(database_url=url).database_url)
    with engine.begin() as conn:
        names = ", ".join(t.name for t in metadata.sorted_tables)
        conn.execute(text(f"TRUNCATE {names} RESTART IDENTITY CASCADE"))
    engine.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Each API test runs on the embedded SQLite file and on real PostgreSQL."""
    if request.param == "sqlite":
        path = tmp_path_factory.mktemp("db") / "lightpath.db"
        url = f"sqlite:///{path}"
        upgrade_to_head(Settings(database_url=url))
        return url
    url = request.getfixturevalue("postgres_url")
    _truncate(url)
    return url


@pytest.fixture
def settings(database_url: str) -> Settings:
    return Settings(database_url=database_url, cluster="small", admit_wait_s=2.0, worker_tick_s=0.5)


@pytest.fixture
def server(settings: Settings) -> Iterator[LiveServer]:
    live = LiveServer(settings)
    live.start()
    yield live
    live.stop()


@pytest.fixture
def redis_url() -> str:
    """The real Redis (database 15 unless LIGHTPATH_TEST_REDIS_URL says otherwise)."""
    return REDIS_URL


@pytest.fixture
def admin() -> Iterator[redis.Redis]:
    """A plain Redis client for looking behind the bus's back."""
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

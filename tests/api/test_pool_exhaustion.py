"""An exhausted connection pool, a read-only or locked database: 503 with Retry-After, fast,
while /healthz keeps answering."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.settings import Settings
from app.store import database
from app.store.migrate import upgrade_to_head
from tests.support import LiveServer


@pytest.fixture
def small_pool(postgres_url: str) -> Iterator[LiveServer]:
    from tests.conftest import _truncate

    _truncate(postgres_url)
    settings = Settings(
        database_url=postgres_url,
        cluster="small",
        admit_wait_s=0.5,
        worker_tick_s=0.5,
        db_pool_size=1,
        db_pool_timeout_s=0.5,
    )
    live = LiveServer(settings)
    live.start()
    yield live
    live.stop()


@pytest.mark.postgres
def test_an_exhausted_pool_answers_503_and_healthz_stays_up(small_pool: LiveServer) -> None:
    assert small_pool.runtime is not None
    engine = small_pool.runtime.services.store.write_engine
    held = [engine.connect(), engine.connect()]  # the pool (1) and its overflow (1)
    slowest_health = 0.0
    stop = threading.Event()

    def probe() -> None:
        nonlocal slowest_health
        with httpx.Client(base_url=small_pool.url, timeout=5) as c:
            while not stop.is_set():
                start = time.monotonic()
                assert c.get("/healthz").status_code == 200
                slowest_health = max(slowest_health, time.monotonic() - start)
                time.sleep(0.05)

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        with small_pool.client(timeout=10) as c:
            answers = []
            for _ in range(3):  # concurrent in the server: none waits behind another
                start = time.monotonic()
                r = c.get("/v1/jobs/nobody")
                answers.append((r.status_code, time.monotonic() - start, r))
        for status, took_s, r in answers:
            assert status == 503, r.text
            assert r.headers["retry-after"] == "1"
            assert r.headers["content-type"].startswith("application/problem+json")
            assert took_s < 2.0, f"503 after {took_s:.1f} s"
    finally:
        for conn in held:
            conn.close()
        stop.set()
        prober.join(10)
    assert slowest_health < 0.5, f"/healthz took {slowest_health:.2f} s"
    with small_pool.client() as c:
        assert c.get("/v1/jobs/nobody").status_code == 404


@pytest.mark.postgres
def test_a_read_only_database_answers_503_and_is_not_ready(postgres_url: str) -> None:
    """A fault sweep set the database read-only (as a failover to a standby leaves
    it): 167 submits and 114 ends answered 500 `internal` (psycopg's
    ReadOnlySqlTransaction arrives as an InternalError), and /readyz said ready."""
    import psycopg

    from tests.conftest import ADMIN_URL, _truncate

    _truncate(postgres_url)
    name = postgres_url.rsplit("/", 1)[1]
    live = LiveServer(Settings(database_url=postgres_url, cluster="small", admit_wait_s=0.5))
    live.start()
    try:
        assert live.runtime is not None
        with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
        try:
            live.runtime.services.store.write_engine.dispose()  # new sessions: read-only
            with live.client() as c:
                r = c.post("/v1/jobs", json={"job_id": "ro", "parallelism": {"dp": 2, "pp": 1}})
                assert r.status_code == 503, r.text
                assert r.headers["retry-after"] == "1"
                assert r.headers["content-type"].startswith("application/problem+json")
                ready = c.get("/readyz")
                assert ready.status_code == 503
                assert "read-only" in ready.json()["checks"]["database"]
        finally:
            with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
                admin.execute(f'ALTER DATABASE "{name}" RESET default_transaction_read_only')
        live.runtime.services.store.write_engine.dispose()
        with live.client() as c:
            assert c.get("/readyz").status_code == 200
            r = c.post("/v1/jobs", json={"job_id": "ro", "parallelism": {"dp": 2, "pp": 1}})
            assert r.status_code in (201, 202), r.text
    finally:
        live.stop()


def test_a_locked_sqlite_database_answers_503_before_the_client_gives_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A contract sweep held `BEGIN EXCLUSIVE` on the embedded database: writes answered
    503 only after SQLite's 30 s busy timeout, when the client (30 s by default) had
    already given up with a ReadTimeout. The wait is 10 s now (1 s here, to be quick)."""
    from lightpath_client import Client

    assert database.SQLITE_BUSY_TIMEOUT_MS < Client().timeout_s * 1000 / 2
    monkeypatch.setattr(database, "SQLITE_BUSY_TIMEOUT_MS", 1000)
    path = tmp_path / "lp.db"
    settings = Settings(database_url=f"sqlite:///{path}", cluster="small", admit_wait_s=0.5)
    upgrade_to_head(settings)
    live = LiveServer(settings)
    live.start()
    lock = sqlite3.connect(path, isolation_level=None)
    try:
        lock.execute("BEGIN EXCLUSIVE")
        with live.client(timeout=30) as c:
            started = time.monotonic()
            r = c.post("/v1/jobs", json={"job_id": "locked", "parallelism": {"dp": 1, "pp": 1}})
            took = time.monotonic() - started
        assert r.status_code == 503, r.text
        assert r.headers["Retry-After"] and took < 10, took
    finally:
        lock.execute("ROLLBACK")
        lock.close()
        live.stop()

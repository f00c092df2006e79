"""The job view cache never serves a view older than a change this process knows of."""

from __future__ import annotations

import time

from app.api.read_cache import JobViewCache
from app.bus.messages import JobsChanged
from tests.support import LiveServer


def test_a_read_that_raced_an_invalidation_is_not_cached() -> None:
    cache = JobViewCache(ttl_s=60)
    generation = cache.generation()
    cache.on_change(JobsChanged(("a",)))  # the worker changed "a" while we read it
    cache.put("a", b"old", generation)
    assert cache.get("a") is None
    generation = cache.generation()
    cache.put("a", b"new", generation)
    assert cache.get("a") == b"new"


def test_entries_expire_and_can_be_disabled() -> None:
    cache = JobViewCache(ttl_s=0.05)
    cache.put("a", b"v", cache.generation())
    assert cache.get("a") == b"v"
    time.sleep(0.06)
    assert cache.get("a") is None
    off = JobViewCache(ttl_s=0)
    off.put("a", b"v", off.generation())
    assert off.get("a") is None


def test_completion_is_visible_at_once_to_the_next_read(server: LiveServer) -> None:
    with server.client() as c:
        c.post("/v1/jobs", json={"job_id": "c", "parallelism": {"dp": 1, "pp": 1}})
        assert c.get("/v1/jobs/c").json()["state"] == "placed"
        c.post("/v1/jobs/c/complete")
        assert c.get("/v1/jobs/c").json()["state"] == "completed"


def test_placement_by_the_worker_is_visible_at_once(server: LiveServer) -> None:
    with server.client() as c:
        c.post("/v1/jobs", json={"job_id": "all", "parallelism": {"dp": 16, "pp": 2}})
        c.post("/v1/jobs", json={"job_id": "w", "parallelism": {"dp": 1, "pp": 1}})
        assert c.get("/v1/jobs/w").json()["state"] == "queued"
        c.post("/v1/jobs/all/complete")
        assert (
            c.get("/v1/jobs/w", params={"wait_for": "placed", "timeout_s": 10}).json()["state"]
            == "placed"
        )
        assert c.get("/v1/jobs/w").json()["state"] == "placed"

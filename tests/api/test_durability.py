"""State survives a restart of the service."""

from __future__ import annotations

import pytest
from sqlalchemy.exc import OperationalError

from app.settings import Settings
from tests.support import LiveServer


def test_placed_and_queued_jobs_survive_a_restart(settings: Settings) -> None:
    first = LiveServer(settings)
    first.start()
    try:
        with first.client() as c:
            assert (
                c.post(
                    "/v1/jobs", json={"job_id": "p", "parallelism": {"dp": 16, "pp": 2}}
                ).status_code
                == 201
            )
            assert (
                c.post(
                    "/v1/jobs", json={"job_id": "q", "parallelism": {"dp": 2, "pp": 1}}
                ).status_code
                == 202
            )
            before = {j["job_id"]: j for j in c.get("/v1/jobs").json()["jobs"]}
    finally:
        first.stop()

    second = LiveServer(settings)
    second.start()
    try:
        with second.client() as c:
            after = {j["job_id"]: j for j in c.get("/v1/jobs").json()["jobs"]}
            assert after["p"]["state"] == "placed"
            assert after["p"]["placement"] == before["p"]["placement"]
            assert after["q"]["state"] == "queued"
            c.post("/v1/jobs/p/complete")
            placed = c.get("/v1/jobs/q", params={"wait_for": "placed", "timeout_s": 10}).json()
            assert placed["state"] == "placed"
            log = c.get("/v1/decisions", params={"limit": 1000}).json()["decisions"]
            assert [d["seq"] for d in log] == list(range(1, len(log) + 1))
            placements = [d["job_id"] for d in log if d["kind"] == "placement"]
            assert placements == ["p", "q"]
    finally:
        second.stop()


def test_a_failed_read_after_the_commit_answers_the_stored_job_not_503(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fault sweep killed pooled PostgreSQL connections: POST /v1/jobs answered 503
    "nothing was done" for jobs it had stored (13 of 33), when the read of the first
    decision, after the commit, met a dead connection. The job was accepted: 202."""
    live = LiveServer(settings)
    live.start()
    try:
        assert live.runtime is not None
        store = live.runtime.services.store

        def dropped(*_args: object) -> None:
            raise OperationalError("SELECT", {}, Exception("server closed the connection"))

        monkeypatch.setattr(store, "job_and_free_servers", dropped)
        with live.client() as c:
            r = c.post("/v1/jobs", json={"job_id": "kept", "parallelism": {"dp": 2, "pp": 1}})
            assert r.status_code == 202, r.text
            assert r.json()["job_id"] == "kept"
            assert r.json()["state"] == "queued"
            monkeypatch.undo()
            assert c.get("/v1/jobs/kept").json()["state"] in ("queued", "placed")
            # the retry a client makes anyway is idempotent: the job as it stands
            again = c.post("/v1/jobs", json={"job_id": "kept", "parallelism": {"dp": 2, "pp": 1}})
            assert again.status_code == 200, again.text
    finally:
        live.stop()


def test_an_ending_or_heartbeat_is_answered_from_its_own_transaction(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fault sweep: DELETE answered 503 "nothing was done" for a job it had
    cancelled, when the read after the commit (on another pooled connection) met a
    killed one. The ending and the heartbeat read the row inside their transaction."""
    live = LiveServer(settings)
    live.start()
    try:
        assert live.runtime is not None
        store = live.runtime.services.store
        real_get_job = store.get_job
        with live.client() as c:
            for name in ("beat", "gone"):
                body = {"job_id": name, "parallelism": {"dp": 2, "pp": 1}, "lease_s": 60}
                assert c.post("/v1/jobs", json=body).status_code in (201, 202)
            reads = 0

            def first_read_only(job_id: str) -> object:
                nonlocal reads
                reads += 1
                if reads > 1:  # the ownership check reads first; nothing after that may
                    raise OperationalError("SELECT", {}, Exception("server closed"))
                return real_get_job(job_id)

            for method, path, state in (
                ("POST", "/v1/jobs/beat/heartbeat", None),
                ("DELETE", "/v1/jobs/gone", "cancelled"),
            ):
                reads = 0
                monkeypatch.setattr(store, "get_job", first_read_only)
                r = c.request(method, path)
                monkeypatch.undo()
                assert r.status_code == 200, r.text
                assert state is None or r.json()["state"] == state
            assert c.get("/v1/jobs/gone").json()["state"] == "cancelled"
    finally:
        live.stop()

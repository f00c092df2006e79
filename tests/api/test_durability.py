"""State survives a restart of the service."""

from __future__ import annotations

import json
from pathlib import Path

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


def test_a_restart_on_a_cluster_without_a_jobs_pod_fails_it_and_serves_the_rest(
    settings: Settings, tmp_path: Path
) -> None:
    """A contract sweep restarted `serve` on a cluster file without two pods (retired):
    the job placed there stayed placed, every fabric pass failed on its servers, and
    every later job stayed without a collective or a network, while /readyz said
    ready. That job now fails `cluster_changed`; the others are served."""
    first = LiveServer(settings)
    first.start()
    try:
        with first.client() as c:
            wide = c.post("/v1/jobs", json={"job_id": "wide", "parallelism": {"dp": 16, "pp": 2}})
            assert wide.json()["state"] == "placed"
            cluster = c.get("/v1/cluster").json()
    finally:
        first.stop()
    cluster["pods"] = [p for p in cluster["pods"] if p["id"] != "pod-3"]
    for oxc in cluster["oxcs"]:
        del oxc["pod_ports"]["pod-3"]
    path = tmp_path / "without-pod-3.json"
    path.write_text(json.dumps(cluster))

    second = LiveServer(settings.model_copy(update={"cluster": str(path)}))
    second.start()
    try:
        with second.client() as c:
            ended = c.get("/v1/jobs/wide", params={"wait_for": "failed", "timeout_s": 10}).json()
            assert ended["state"] == "failed"
            assert ended["end_reason"].startswith("cluster_changed: 8 of its servers"), ended
            assert "pod-3/tor-0/srv-0" in ended["end_reason"]
            # a job across pods afterwards gets its plan and circuits
            c.post("/v1/jobs", json={"job_id": "next", "parallelism": {"dp": 6, "pp": 2}})
            job = c.get("/v1/jobs/next", params={"wait_for": "placed", "timeout_s": 10}).json()
            assert job["state"] == "placed" and job["collective"] is not None, job
            assert job["network"]["mode"] == "isolated", job["network"]
            assert c.get("/v1/cluster").json()["summary"]["free_servers"] == 24 - 12
            log = c.get("/v1/decisions", params={"limit": 1000}).json()["decisions"]
            assert [d["seq"] for d in log] == list(range(1, len(log) + 1))
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

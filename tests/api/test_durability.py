"""State survives a restart of the service."""

from __future__ import annotations

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

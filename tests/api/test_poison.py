"""Ingest no report can poison: out-of-range bytes refused, engine failures set aside."""

from __future__ import annotations

import time
from typing import Any

from tests.support import LiveServer


def _servers_by_pod(job: dict[str, Any]) -> list[str]:
    """Two servers of the job in different pods."""
    servers = [u["server"] for u in job["placement"]["units"]]
    first = servers[0]
    other = next(s for s in servers if s.split("/")[0] != first.split("/")[0])
    return [first, other]


def _counted(c: Any, job_id: str) -> int:
    p = c.get(f"/v1/predictions/{job_id}").json()
    return int(p["hits"]) + int(p["held"]) + int(p["misses"])


def test_bytes_summing_past_the_limit_are_refused(server: LiveServer) -> None:
    with server.client() as c:
        job = c.post("/v1/jobs", json={"job_id": "big", "parallelism": {"dp": 8, "pp": 2}}).json()
        a, b = _servers_by_pod(job)
        each_finite = {
            "reports": [
                {
                    "job_id": "big",
                    "phase_started_at": 1.0,
                    "demands": [
                        {"src": a, "dst": b, "bytes": 1e308},
                        {"src": b, "dst": a, "bytes": 1e308},
                    ],
                }
            ]
        }
        r = c.post("/v1/traffic", json=each_finite)
        assert r.status_code == 422, r.text
        assert r.headers["content-type"].startswith("application/problem+json")
        assert r.json()["errors"][0]["type"] == "too_many_bytes"


def test_a_report_the_engine_cannot_use_is_set_aside_and_the_cursor_moves_on(
    server: LiveServer,
) -> None:
    assert server.runtime is not None
    traffic = server.runtime.services.traffic
    with server.client() as c:
        job = c.post("/v1/jobs", json={"job_id": "big", "parallelism": {"dp": 8, "pp": 2}}).json()
        assert job["state"] == "placed", job
        a, b = _servers_by_pod(job)
        # stored before the API checked totals (or by any other path): each value finite,
        # their sum per pod pair is not
        poison = {
            "job_id": "big",
            "phase_started_at": 1_763_812_345.0,
            "demands": [[a, b, 1e308], [a, b, 1e308]],
        }
        traffic.ingest([poison])
        good = {
            "reports": [
                {
                    "job_id": "big",
                    "phase_started_at": 1_763_812_346.0 + k,
                    "demands": [{"src": a, "dst": b, "bytes": 1e9}],
                }
                for k in range(3)
            ]
        }
        assert c.post("/v1/traffic", json=good).status_code == 202
        deadline = time.monotonic() + 20
        while _counted(c, "big") < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _counted(c, "big") == 3, "reports after the poison one were not consumed"
        page = c.get("/v1/traffic/dead-letters").json()
        assert [d["ord"] for d in page["dead_letters"]] == [1]
        # a page exactly full with nothing after it is the last page
        assert c.get("/v1/traffic/dead-letters", params={"limit": 1}).json()["next"] is None
        letter = page["dead_letters"][0]
        assert letter["job_id"] == "big" and letter["reason"]
        assert letter["report"]["demands"] == [
            {"src": a, "dst": b, "bytes": 1e308},
            {"src": a, "dst": b, "bytes": 1e308},
        ]  # as a reporter posts them
        assert letter["at"].endswith("Z")  # UTC on SQLite too
        metrics = c.get("/metrics").text
        assert "lightpath_traffic_dead_letters_total 1.0" in metrics
        # a new job still gets its answer promptly: the worker is not stuck retrying
        start = time.monotonic()
        r = c.post("/v1/jobs", json={"job_id": "after", "parallelism": {"dp": 2, "pp": 1}})
        assert r.status_code == 201, r.text
        assert time.monotonic() - start < 2.5


def test_a_report_naming_a_job_not_placed_is_set_aside(server: LiveServer) -> None:
    """Before, a report naming an unknown or ended job was accepted and dropped unseen.
    Its bytes are not credited to the jobs on those servers either."""
    with server.client() as c:
        job = c.post("/v1/jobs", json={"job_id": "live", "parallelism": {"dp": 8, "pp": 2}}).json()
        a, b = _servers_by_pod(job)
        t = time.time()
        on_live = {"src": a, "dst": b, "bytes": 1e9}
        reports = [
            # names a job that does not exist, on the live job's servers
            {"job_id": "ghost", "phase_started_at": t - 3, "demands": [on_live]},
            # names a job that does not exist, between servers nobody holds
            {"job_id": "ghost", "phase_started_at": t - 2, "demands": [_idle_pair(c, job)]},
            # names no job, on the live job's servers: the live job's
            {"phase_started_at": t - 1, "demands": [on_live]},
            # names no job, between servers nobody holds (it was dropped unseen)
            {"phase_started_at": t - 1, "demands": [_idle_pair(c, job)]},
        ]
        assert c.post("/v1/traffic", json={"reports": reports}).status_code == 202
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and _counted(c, "live") < 1:
            time.sleep(0.1)
        assert _counted(c, "live") == 1
        letters = c.get("/v1/traffic/dead-letters").json()["dead_letters"]
        assert [(d["job_id"], "not placed" in d["reason"]) for d in letters] == [
            ("ghost", True),
            ("ghost", True),
            (None, False),
        ]
        assert "no placed job holds" in letters[-1]["reason"]


def _idle_pair(c: Any, job: dict[str, Any]) -> dict[str, Any]:
    """Two servers in different pods that no job holds."""
    held = {u["server"] for u in job["placement"]["units"]}
    cluster = c.get("/v1/cluster").json()
    by_pod = [
        [s["id"] for t in p["tors"] for s in t["servers"] if s["id"] not in held]
        for p in cluster["pods"]
    ]
    free = [ids[0] for ids in by_pod if ids]
    return {"src": free[0], "dst": free[-1], "bytes": 1e9}

"""The fabric over REST: collectives, cross-connects on the (mock) switches, decisions."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from tests.support import LiveServer


def eventually(check: Callable[[], Any], timeout_s: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.05)


def _cross_connects(
    topology: dict[str, Any], job_id: str | None = None
) -> set[tuple[str, int, int]]:
    return {
        (o["id"], cc["a"], cc["b"])
        for o in topology["oxcs"]
        for cc in o["cross_connects"]
        if job_id is None or cc["job_id"] == job_id
    }


def test_cross_pod_job_gets_circuits_collective_and_routing(server: LiveServer) -> None:
    with server.client() as c:
        r = c.post("/v1/jobs", json={"job_id": "wide", "parallelism": {"dp": 8, "pp": 2}})
        assert r.status_code == 201
        job = eventually(lambda: (j := c.get("/v1/jobs/wide").json())["collective"] and j)
        coll = job["collective"]
        assert coll["algorithm"] in {"inc", "ring", "tree", "hierarchical_ring"}
        assert coll["estimated_allreduce_s"] > 0
        topo = eventually(
            lambda: (
                (t := c.get("/v1/topology").json())
                and "desired" not in t
                and _cross_connects(t)
                and t
            )
        )
        mine = _cross_connects(topo, "wide")
        assert mine, "a job spanning pods needs circuits"
        ports = [(o, p) for o, a, b in mine for p in (a, b)]
        assert len(ports) == len(set(ports)), "no port in two cross-connects"
        circuits = topo["pod_circuits"]
        for a, row in circuits.items():
            for b, n in row.items():
                assert circuits[b][a] == n
        decisions = c.get("/v1/decisions", params={"limit": 1000}).json()["decisions"]
        kinds = {d["kind"] for d in decisions if d["job_id"] == "wide"}
        assert {"placement", "oxc", "routing"} <= kinds
        routing = [d["routing"] for d in decisions if d["kind"] == "routing"]
        assert all(r["phase"] in {"pp", "dp", "ep"} for r in routing)
        assert any(r["routes"] for r in routing)

        c.post("/v1/jobs/wide/complete")
        eventually(lambda: not _cross_connects(c.get("/v1/topology").json()))
        decisions = c.get("/v1/decisions", params={"limit": 1000}).json()["decisions"]
        teardown = [d for d in decisions if d["kind"] == "oxc" and d["reason"] == "completion"]
        assert teardown and all(d["oxc"]["disconnect"] for d in teardown)


def _circuits(topology: dict, job_id: str) -> int:
    return len(_cross_connects(topology, job_id))


def test_jobs_short_of_ports_are_all_served_and_a_completion_grows_the_survivor(
    server: LiveServer,
) -> None:
    with server.client() as c:
        c.post("/v1/jobs", json={"job_id": "first", "parallelism": {"dp": 6, "pp": 2}})
        eventually(lambda: _cross_connects(c.get("/v1/topology").json(), "first"))
        c.post("/v1/jobs", json={"job_id": "second", "parallelism": {"dp": 6, "pp": 2}})
        second = eventually(lambda: c.get("/v1/jobs/second").json()["network"])
        first = c.get("/v1/jobs/first").json()["network"]
        for view in (first, second):
            assert view["mode"] in ("isolated", "shared") and view["pod_ports"]
        # the second job's cross-connects appear while it runs (on its turn if shared)
        eventually(lambda: _cross_connects(c.get("/v1/topology").json(), "second"))
        before = _circuits(c.get("/v1/topology").json(), "second")
        c.post("/v1/jobs/first/complete")
        eventually(lambda: not _cross_connects(c.get("/v1/topology").json(), "first"))
        grown = eventually(
            lambda: (n := _circuits(c.get("/v1/topology").json(), "second")) > before and n,
        )
        assert grown > before
        assert c.get("/v1/jobs/second").json()["network"]["mode"] == "isolated"
        # every decision's reason is one the contract lists
        logged = c.get("/v1/decisions", params={"limit": 1000}).json()["decisions"]
        assert {d["reason"] for d in logged} <= {
            "arrival",
            "completion",
            "phase",
            "prediction",
            "reconcile",
        }


def test_a_single_pod_arrival_writes_no_oxc_decision_for_another_job(server: LiveServer) -> None:
    with server.client() as c:
        c.post("/v1/jobs", json={"job_id": "wide", "parallelism": {"dp": 6, "pp": 2}})
        eventually(lambda: _cross_connects(c.get("/v1/topology").json(), "wide"))
        eventually(lambda: "desired" not in c.get("/v1/topology").json())
        last = c.get("/v1/decisions", params={"limit": 1000}).json()["decisions"][-1]["seq"]
        c.post("/v1/jobs", json={"job_id": "solo", "parallelism": {"dp": 1, "pp": 1}})
        eventually(lambda: c.get("/v1/jobs/solo").json()["network"])
        assert c.get("/v1/jobs/solo").json()["network"]["mode"] == "none"
        after = c.get("/v1/decisions", params={"after": last, "limit": 1000}).json()
        assert not [d for d in after["decisions"] if d["kind"] == "oxc"]


def test_a_failed_port_moves_the_circuit(server: LiveServer) -> None:
    with server.client() as c:
        c.post("/v1/jobs", json={"job_id": "j", "parallelism": {"dp": 6, "pp": 2}})
        mine = eventually(lambda: _cross_connects(c.get("/v1/topology").json(), "j"))
        oxc_id, port, _ = sorted(mine)[0]
        assert server.runtime is not None
        server.runtime.services.southbound.switches[oxc_id].fail_port(port)
        server.runtime.controller.kick()

        def moved() -> bool:
            topo = c.get("/v1/topology").json()
            now = _cross_connects(topo, "j")
            on_failed = any(o == oxc_id and port in (a, b) for o, a, b in now)
            return (
                bool(now)
                and not on_failed
                and "desired" not in topo
                and port in topo["failed_ports"].get(oxc_id, [])
            )

        eventually(moved)

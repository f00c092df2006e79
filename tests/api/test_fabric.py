"""The fabric over REST: collectives, cross-connects on the (mock) switches, decisions."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from app.engine.cluster import cluster_to_dict, preset
from app.settings import Settings
from tests.support import LiveServer, live_on, narrow_cluster


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
        # the fabric pass comes tens of milliseconds after the placement: the long-poll
        # waits for it
        waited = c.get("/v1/jobs/wide", params={"wait_for": "placed", "timeout_s": 5}).json()
        assert waited["collective"] and waited["network"]["mode"] == "isolated", waited
        assert waited["network"]["pod_ports"]
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
        # every entry has every kind's key (null but its own), as the contract shows them
        assert all({"placement", "oxc", "routing"} <= set(d) for d in decisions)
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
        # 20 servers: pods 2 and 3 and the 4 left on pod-1, whose uplinks the first holds
        c.post("/v1/jobs", json={"job_id": "second", "parallelism": {"dp": 10, "pp": 2}})
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


def _fail_port(server: LiveServer, oxc_id: str, port: int) -> None:
    """Fail `port` on the mock switch and wake the switch controller to notice."""
    assert server.runtime is not None and server.runtime.controller is not None
    server.runtime.services.southbound.switches[oxc_id].fail_port(port)
    server.runtime.controller.kick()


def test_a_failed_port_moves_the_circuit(server: LiveServer) -> None:
    with server.client() as c:
        c.post("/v1/jobs", json={"job_id": "j", "parallelism": {"dp": 6, "pp": 2}})
        mine = eventually(lambda: _cross_connects(c.get("/v1/topology").json(), "j"))
        oxc_id, port, _ = sorted(mine)[0]
        _fail_port(server, oxc_id, port)

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


@pytest.mark.parametrize("dp", [8, 6])
def test_a_failed_port_rewires_only_the_circuit_on_it(server: LiveServer, dp: int) -> None:
    """SPEC 4.3: cross-connects change as little as possible. A failed port used to drop
    every cross-connect of the job on it and map the job afresh from the lowest ports,
    so the job's healthy circuits on that OXC were all switched (no traffic meanwhile)."""
    with server.client() as c:
        c.post("/v1/jobs", json={"job_id": "j", "parallelism": {"dp": dp, "pp": 2}})
        eventually(lambda: _cross_connects(c.get("/v1/topology").json(), "j"))
        eventually(lambda: "desired" not in c.get("/v1/topology").json())
        before = _cross_connects(c.get("/v1/topology").json(), "j")
        oxc_id, port, other = sorted(before)[0]
        _fail_port(server, oxc_id, port)

        def settled() -> bool:
            topo = c.get("/v1/topology").json()
            return "desired" not in topo and port in topo["failed_ports"].get(oxc_id, [])

        eventually(settled)
        eventually(
            lambda: (oxc_id, port, other) not in _cross_connects(c.get("/v1/topology").json(), "j")
        )
        after = _cross_connects(c.get("/v1/topology").json(), "j")
        assert before - after == {(oxc_id, port, other)}, (sorted(before), sorted(after))
        assert len(after - before) <= 1


def test_a_restored_port_gives_the_job_its_circuit_back(server: LiveServer) -> None:
    """Light back on a failed port: the job that lost a circuit there grows back to what
    it held (it stayed one circuit short until some other job came or went on its pods)."""
    model = {"parameters": 7e9, "activation_bytes": 5e7, "microbatches": 8}
    with server.client() as c:
        for job_id, dp, pp in (("j", 8, 2), ("k", 4, 3), ("m", 2, 2)):
            body = {"job_id": job_id, "parallelism": {"dp": dp, "pp": pp}, "model": model}
            assert c.post("/v1/jobs", json=body).status_code == 201
        eventually(lambda: _cross_connects(c.get("/v1/topology").json(), "j"))
        eventually(lambda: "desired" not in c.get("/v1/topology").json())
        before = _cross_connects(c.get("/v1/topology").json(), "j")
        oxc_id, port, _ = sorted(before)[-1]
        assert server.runtime is not None
        switch = server.runtime.services.southbound.switches[oxc_id]
        switch.fail_port(port)
        server.runtime.controller.kick()

        def one_short() -> bool:
            topo = c.get("/v1/topology").json()
            return (
                "desired" not in topo
                and port in topo["failed_ports"].get(oxc_id, [])
                and len(_cross_connects(topo, "j")) == len(before) - 1
            )

        eventually(one_short)
        switch.restore_port(port)
        server.runtime.controller.kick()

        def whole_again() -> bool:
            topo = c.get("/v1/topology").json()
            return "desired" not in topo and len(_cross_connects(topo, "j")) == len(before)

        eventually(whole_again)


def test_jobs_short_of_ports_use_a_clusters_electrical_core(
    settings: Settings, tmp_path: Path
) -> None:
    """A cluster file may give pods an electrical core beside the OXCs: `GET /v1/cluster`
    shows it, and a job that gets no circuits (two uplinks per pod run out) is served
    there: `network.mode` "electrical", no cross-connect of its own, headers on the
    electrical layer."""
    narrow = narrow_cluster(electrical_gbps=400.0)
    path = tmp_path / "narrow.json"
    path.write_text(json.dumps(cluster_to_dict(narrow)))
    live = LiveServer(settings.model_copy(update={"cluster": str(path)}))
    live.start()
    try:
        with live.client() as c:
            pods = c.get("/v1/cluster").json()["pods"]
            assert {p["electrical_gbps"] for p in pods} == {400.0}
            # a ring over three pods takes both uplinks of each; the next job's pods
            # have none left it could take (each pair of the first needs its one)
            sizes = (20, 12)
            for i, dp in enumerate(sizes):
                r = c.post("/v1/jobs", json={"job_id": f"w{i}", "parallelism": {"dp": dp, "pp": 1}})
                assert r.status_code == 201, r.text
            views = {
                f"w{i}": eventually(lambda i=i: c.get(f"/v1/jobs/w{i}").json()["network"])
                for i in range(len(sizes))
            }
            electrical = [j for j, v in views.items() if v["mode"] == "electrical"]
            assert electrical, views
            for j in electrical:
                assert views[j]["pod_ports"] == {} and views[j]["estimated_slowdown"] >= 1.0
            topo = eventually(
                lambda: (t := c.get("/v1/topology").json()) and "desired" not in t and t
            )
            assert not any(_cross_connects(topo, j) for j in electrical)
            logged = c.get("/v1/decisions", params={"limit": 1000}).json()["decisions"]
            latest = {
                (d["job_id"], d["routing"]["phase"]): d["routing"]
                for d in logged
                if d["kind"] == "routing"
            }
            assert all(
                h["layer"] == ("electrical" if j in electrical else "optical")
                for (j, _), h in latest.items()
            )
    finally:
        live.stop()


def test_a_job_spanning_pods_is_placed_where_uplinks_are_free(server: LiveServer) -> None:
    """The first job's slice holds every uplink of the two pods it spans; the second
    2-pod job goes to the pods with free uplinks, not to the first's leftover servers."""
    with server.client() as c:
        c.post("/v1/jobs", json={"job_id": "first", "parallelism": {"dp": 6, "pp": 2}})
        view = eventually(lambda: c.get("/v1/jobs/first").json()["network"])
        assert view["mode"] == "isolated" and view["pod_ports"] == {"pod-0": 16, "pod-1": 16}
        r = c.post("/v1/jobs", json={"job_id": "second", "parallelism": {"dp": 6, "pp": 2}})
        assert r.status_code == 201, r.text
        units = r.json()["placement"]["units"]
        assert {u["server"].split("/")[0] for u in units} == {"pod-2", "pod-3"}


def test_a_job_stating_the_largest_numbers_leaves_every_job_served(server: LiveServer) -> None:
    """A job at the traffic and compute maxima is placed and planned like any other;
    one past them is refused at the door. (1e307-byte activations over 16 micro-batches
    once made the allocation's arithmetic NaN, and every fabric pass failed while that
    job ran: no job got circuits.) Its parameters stay small enough for GPU memory."""
    big = {
        "model": {
            "bytes_per_parameter": 16,
            "activation_bytes": 1e13,
            "microbatches": 1_000_000,
        },
        "compute": {
            "microbatch_forward_s": 86_400,
            "microbatch_backward_s": 86_400,
            "optimizer_s": 86_400,
        },
    }
    with server.client() as c:
        for field, value in (
            ("model", {"activation_bytes": 1e307, "microbatches": 16}),
            ("compute", {"microbatch_forward_s": 1e308, "microbatch_backward_s": 1e308}),
        ):
            body = {"job_id": "too-big", "parallelism": {"dp": 1, "pp": 12}, field: value}
            r = c.post("/v1/jobs", json=body)
            assert r.status_code == 422, r.text
            assert r.json()["type"].endswith("out-of-range")
        r = c.post(
            "/v1/jobs", json={"job_id": "largest", "parallelism": {"dp": 1, "pp": 12}, **big}
        )
        assert r.status_code in (201, 202), r.text
        r = c.post("/v1/jobs", json={"job_id": "next", "parallelism": {"dp": 12, "pp": 1}})
        assert r.status_code == 201, r.text
        for job_id in ("largest", "next"):
            job = eventually(lambda j=job_id: (x := c.get(f"/v1/jobs/{j}").json())["network"] and x)
            if job["state"] != "placed":
                continue
            assert job["network"]["mode"] in {"isolated", "shared", "electrical", "none"}
            slowdown = job["network"]["estimated_slowdown"]
            assert slowdown is None or slowdown >= 1.0
        nxt = c.get("/v1/jobs/next").json()
        assert nxt["network"]["mode"] != "none" and nxt["collective"]


def test_a_restart_on_a_cluster_without_a_switch_forgets_what_it_held(
    settings: Settings, tmp_path: Path
) -> None:
    """Restarted on a cluster file whose switches are named otherwise, the state still
    held the old switches' confirmed cross-connects: `/v1/topology` answered 500 on
    every call (a helper's restart from one cluster file to another), and the worker
    never dropped them. The view shows them until the worker's next full pass forgets
    a switch the cluster no longer has; the job is rewired onto the new switches."""
    data = cluster_to_dict(preset("small"))
    for oxc in data["oxcs"]:
        oxc["id"] = "old-" + oxc["id"]
    path = tmp_path / "renamed.json"
    path.write_text(json.dumps(data))
    with live_on(settings, str(path)) as before, before.client() as c:
        r = c.post("/v1/jobs", json={"job_id": "wide", "parallelism": {"dp": 8, "pp": 2}})
        assert r.status_code == 201, r.text
        eventually(lambda: _cross_connects(c.get("/v1/topology").json(), "wide"))
    with live_on(settings, "small") as after, after.client() as c:
        first = c.get("/v1/topology")
        assert first.status_code == 200, first.text
        topo = eventually(
            lambda: (
                (t := c.get("/v1/topology").json())
                and not any(o["id"].startswith("old-") for o in t["oxcs"])
                and "desired" not in t
                and _cross_connects(t, "wide")
                and t
            ),
            timeout_s=30.0,
        )
        assert {o for o, _, _ in _cross_connects(topo)} <= {x.id for x in preset("small").oxcs}
        assert c.get("/v1/jobs/wide").json()["state"] == "placed"


def test_a_pod_whose_uplinks_are_all_dark_gets_no_new_job_spanning_pods(
    server: LiveServer,
) -> None:
    """A helper's fault sweep: with every uplink of a pod failed, the job there lost its
    circuits, its `network.pod_ports` emptied, and the dark pod looked wholly free to
    placement: the next spanning job's last part went there (the fullest pod "with
    free uplinks") while healthy pods stood free, and it waited for light that never
    came. Placement counts failed uplinks as taken."""
    cluster = preset("small")  # 4 pods of 8 servers
    with server.client() as c:
        r = c.post("/v1/jobs", json={"job_id": "a", "parallelism": {"dp": 12, "pp": 1}})
        assert r.status_code == 201, r.text
        servers = [u["server"] for u in r.json()["placement"]["units"]]
        # the pod holding fewer of its servers (12 = 8 + 4) keeps free servers
        dark = min(
            {x.split("/")[0] for x in servers},
            key=lambda p: sum(x.startswith(p + "/") for x in servers),
        )
        eventually(lambda: (n := c.get("/v1/jobs/a").json()["network"]) and n["pod_ports"])
        for oxc in cluster.oxcs:
            for port in oxc.pod_ports[dark]:
                _fail_port(server, oxc.id, port)
        eventually(lambda: (n := c.get("/v1/jobs/a").json()["network"]) and n["mode"] != "isolated")
        eventually(
            lambda: (
                sum(len(v) for v in c.get("/v1/topology").json()["failed_ports"].values())
                == cluster.pods_by_id[dark].uplink_ports
            )
        )
        b = c.post("/v1/jobs", json={"job_id": "b", "parallelism": {"dp": 12, "pp": 1}})
        assert b.status_code == 201, b.text
        on = {u["server"].split("/")[0] for u in b.json()["placement"]["units"]}
        assert dark not in on, (dark, on)
        assert eventually(lambda: c.get("/v1/jobs/b").json()["network"])["mode"] == "isolated"

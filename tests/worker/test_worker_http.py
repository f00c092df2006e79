"""The worker's probes: /readyz answers problem+json when a dependency is down, in time."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from fastapi.testclient import TestClient

from app.api.problems import PROBLEM_JSON
from app.engine.cluster import preset
from app.worker.http import create_worker_app

SMALL = preset("small")
ALL_OXCS = [o.id for o in SMALL.oxcs]


def _runtime(list_oxcs: object) -> SimpleNamespace:
    services = SimpleNamespace(
        store=SimpleNamespace(ping=lambda: None),
        bus=SimpleNamespace(ping=lambda: None),
        southbound=SimpleNamespace(list_oxcs=list_oxcs),
        metrics=SimpleNamespace(registry=None),
        cluster=SMALL,
    )
    return SimpleNamespace(services=services, is_leader=lambda: True)


def test_the_worker_is_ready_when_every_dependency_answers() -> None:
    with TestClient(create_worker_app(_runtime(lambda: ALL_OXCS))) as c:
        answer = c.get("/readyz")
    assert answer.status_code == 200
    assert answer.json() == {
        "status": "ready",
        "leader": True,
        "checks": {"database": "ok", "bus": "ok", "southbound": "ok"},
    }


def test_a_hung_switch_makes_a_503_problem_within_a_probe_timeout() -> None:
    """A sweep SIGSTOPped the mock switches: the worker's /readyz answered after 5 s
    (past Kubernetes' 1 s probe timeout) with a plain JSON body."""
    release = threading.Event()

    def hung() -> None:
        release.wait(10)

    try:
        with TestClient(create_worker_app(_runtime(hung))) as c:
            started = time.monotonic()
            answer = c.get("/readyz")
            took = time.monotonic() - started
    finally:
        release.set()
    assert took < 1.0, took
    assert answer.status_code == 503
    assert answer.headers["content-type"] == PROBLEM_JSON
    body = answer.json()
    assert body["status"] == 503 and body["title"] == "Not ready" and body["leader"] is True
    assert body["checks"]["database"] == "ok"
    assert body["checks"]["southbound"].startswith("unreachable: no answer")
    assert "southbound" in body["detail"]


def test_the_worker_is_not_ready_while_its_fabric_process_is_not() -> None:
    """A sweep saw the worker's /readyz answer ready for the 30 s a stalled fabric child
    took to be restarted, while no placed job got circuits."""
    stalled = "stalled: no pass round for 12 s (restarted at 30 s)"
    health: list[str | None] = [stalled]
    runtime = _runtime(lambda: ALL_OXCS)
    runtime.worker = SimpleNamespace(fabric_process=SimpleNamespace(health=lambda: health[0]))
    with TestClient(create_worker_app(runtime)) as c:
        down = c.get("/readyz")
        health[0] = None
        up = c.get("/readyz")
    assert down.status_code == 503 and down.headers["content-type"] == PROBLEM_JSON
    assert down.json()["checks"]["fabric"] == stalled and down.json()["leader"] is True
    assert stalled in down.json()["detail"]
    assert up.status_code == 200 and up.json()["checks"]["fabric"] == "ok"


def test_switches_that_do_not_host_the_clusters_oxcs_are_not_ready() -> None:
    """An audit ran a seed-15k worker against mock switches started on `small`: 14 of
    its 16 OXCs answered `unknown-switch` on every pass while /readyz said the
    southbound was ok (the probe only listed the switches)."""
    with TestClient(create_worker_app(_runtime(lambda: ALL_OXCS[:1]))) as c:
        answer = c.get("/readyz")
    assert answer.status_code == 503 and answer.headers["content-type"] == PROBLEM_JSON
    missing = len(ALL_OXCS) - 1
    assert answer.json()["checks"]["southbound"] == (
        f"the switches do not host {missing} of the cluster's {len(ALL_OXCS)} OXCs "
        f"({', '.join(ALL_OXCS[1:4])}{', ...' if missing > 3 else ''})"
    )

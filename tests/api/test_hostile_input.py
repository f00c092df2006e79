"""Hostile but well-formed input: 4xx, never a 500; races answered once; no secret printed."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from typing import Any

import pytest
from sqlalchemy import select

from app.bus.redis_streams import RedisStreamsBus
from app.store import tables as t
from tests.support import LiveServer

HUGE = 9223372036854775808  # 2**63: one past the largest bigint


def test_huge_numbers_are_4xx(server: LiveServer) -> None:
    with server.client() as c:
        job = {"job_id": "huge", "parallelism": {"dp": 2, "pp": 1}, "model": {"parameters": 1e308}}
        r = c.post("/v1/jobs", json=job)
        assert r.status_code == 422, r.text
        assert r.headers["content-type"].startswith("application/problem+json")
        advice = {"gpu_memory_bytes": 1e308, "model": {"parameters": 1e308}, "parallelism": {}}
        r = c.post("/v1/advice/batch-size", json=advice)
        assert r.status_code == 422, r.text
        assert r.json()["type"].endswith("out-of-range")
        for path in ("/v1/jobs", "/v1/decisions"):
            r = c.get(path, params={"after": HUGE})
            assert r.status_code == 422, (path, r.text)
            r = c.get(path, params={"after": HUGE - 1})
            assert r.status_code == 200, (path, r.text)


def test_numbers_must_be_json_numbers(server: LiveServer) -> None:
    """true is not 1 and "1e9" is not 1e9: `"lease_s": true` once became a one-second
    lease, and the job was failed as lease_expired a second after placement."""
    job: dict[str, Any] = {"job_id": "typed", "parallelism": {"dp": 1, "pp": 1}}
    model = {"parameters": 7e9, "hidden_size": 4096, "num_layers": 32, "seq_len": 2048}
    advice = {"model": model, "parallelism": {}, "gpu_memory_bytes": 8e10}
    pair = ["pod-0/tor-0/srv-0", "pod-1/tor-0/srv-0"]
    with server.client() as c:
        for field, value in (
            ("lease_s", True),
            ("walltime_s", "100"),
            ("model", {"parameters": "7e9"}),
            ("model", {"parameters": True}),
            ("compute", {"optimizer_s": True}),
        ):
            r = c.post("/v1/jobs", json={**job, field: value})
            assert r.status_code == 422, (field, value, r.text)
            assert r.headers["content-type"].startswith("application/problem+json")
        for size in (True, "1e9"):
            r = c.post("/v1/traffic", json=_batch(pair, size))  # type: ignore[arg-type]
            assert r.status_code == 422, (size, r.text)
        r = c.post("/v1/advice/batch-size", json={**advice, "gpu_memory_bytes": True})
        assert r.status_code == 422, r.text
        # integers are numbers
        r = c.post("/v1/jobs", json={**job, "lease_s": 60, "walltime_s": 3600})
        assert r.status_code == 201, r.text
        assert c.post("/v1/advice/batch-size", json=advice).status_code == 200


def _batch(server_ids: list[str], size: float) -> dict[str, Any]:
    a, b = server_ids
    return {
        "reports": [{"phase_started_at": 1.0, "demands": [{"src": a, "dst": b, "bytes": size}]}]
    }


def test_an_idempotency_key_reused_with_another_batch_is_409(server: LiveServer) -> None:
    pair = ["pod-0/tor-0/srv-0", "pod-1/tor-0/srv-0"]
    with server.client() as c:
        key = {"Idempotency-Key": "batch-1"}
        first = c.post("/v1/traffic", json=_batch(pair, 1e9), headers=key)
        assert first.status_code == 202, first.text
        again = c.post("/v1/traffic", json=_batch(pair, 1e9), headers=key)
        assert again.status_code == 202 and again.json() == first.json()
        other = c.post("/v1/traffic", json=_batch(pair, 2e9), headers=key)
        assert other.status_code == 409, other.text
        documented = c.get("/openapi.json").json()["paths"]["/v1/traffic"]["post"]["responses"]
        assert "409" in documented
        assert other.headers["content-type"].startswith("application/problem+json")
        assert c.post("/v1/traffic", json=_batch(pair, 3e9)).json()["last_seq"] == 2


def test_an_empty_idempotency_key_is_refused_not_stored(server: LiveServer) -> None:
    # an empty key was stored like any other: the next batch sent with an empty header
    # (an unset template variable, say) was a 409 for a key nobody chose
    pair = ["pod-0/tor-0/srv-0", "pod-1/tor-0/srv-0"]
    with server.client() as c:
        for size in (1e9, 2e9):
            r = c.post("/v1/traffic", json=_batch(pair, size), headers={"Idempotency-Key": ""})
            assert r.status_code == 422, r.text
            assert r.headers["content-type"].startswith("application/problem+json")
            assert "header.idempotency-key" in [e["field"] for e in r.json()["errors"]]
        assert c.post("/v1/traffic", json=_batch(pair, 3e9)).json()["last_seq"] == 1


@pytest.mark.postgres
@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_concurrent_completes_answer_one_completion(server: LiveServer) -> None:
    assert server.runtime is not None
    with server.client() as c:
        r = c.post("/v1/jobs", json={"job_id": "racy", "parallelism": {"dp": 2, "pp": 1}})
        assert r.status_code == 201, r.text
    answers: list[dict[str, Any]] = []
    start = threading.Barrier(8)

    def complete() -> None:
        with server.client() as c:
            start.wait()
            r = c.post("/v1/jobs/racy/complete")
            assert r.status_code == 200, r.text
            answers.append(r.json())

    threads = [threading.Thread(target=complete) for _ in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    assert len(answers) == 8
    assert len({a["completed_at"] for a in answers}) == 1
    with server.runtime.services.store.read_engine.connect() as conn:
        events = conn.execute(select(t.outbox.c.payload)).scalars().all()
    assert [e for e in events if e == {"type": "CompleteJob", "job_id": "racy"}] == [
        {"type": "CompleteJob", "job_id": "racy"}
    ]


def test_a_malformed_token_list_is_refused_without_printing_it() -> None:
    env = dict(os.environ, LIGHTPATH_API_TOKENS="launcher=s3cr3t-one,bogus=s3cr3t-two")
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "api"], env=env, capture_output=True, timeout=60
    )
    assert done.returncode == 2
    out = (done.stdout + done.stderr).decode()
    assert "LIGHTPATH_API_TOKENS" in out
    assert "s3cr3t" not in out


def test_change_notices_are_namespaced_by_redis_database(redis_url: str) -> None:
    base = redis_url.rsplit("/", 1)[0]
    a = RedisStreamsBus(f"{base}/3")
    b = RedisStreamsBus(f"{base}/4")
    assert a.changes_channel == "lightpath:3:changes"
    assert a.changes_channel != b.changes_channel
    a.close()
    b.close()


def test_topology_marks_switches_the_last_pass_did_not_reach(server: LiveServer) -> None:
    assert server.runtime is not None and server.runtime.controller is not None
    server.runtime.controller.run_once()
    with server.client() as c:
        body = c.get("/v1/topology").json()
        assert body["stale"] is False
        assert all(o["stale"] is False and o["unreachable_since"] is None for o in body["oxcs"])
        gone = body["oxcs"][0]["id"]
        repo = server.runtime.services.fabric
        repo.save_reachability([gone])  # what a pass that cannot read it writes
        body = c.get("/v1/topology").json()
        assert body["stale"] is True
        view = {o["id"]: o for o in body["oxcs"]}
        assert view[gone]["stale"] is True and view[gone]["unreachable_since"]
        assert not any(o["stale"] for k, o in view.items() if k != gone)
        since = view[gone]["unreachable_since"]
        repo.save_reachability([gone])  # still unreachable: the same since
        assert c.get("/v1/topology").json()["oxcs"][0]["unreachable_since"] == since
        repo.save_reachability([])
        assert c.get("/v1/topology").json()["stale"] is False


def test_topology_answers_an_unbounded_mlu_as_null_not_500(server: LiveServer) -> None:
    """A 300-job drive read `GET /v1/topology` 500 for 40 s (`Out of range float values
    are not JSON compliant`): the last plan's MLU was infinite. A job cut off by failed
    ports can still make it so; it is stored and answered as null."""
    if not server.settings.database_url.startswith("sqlite"):
        pytest.skip("PostgreSQL's json refuses Infinity: only SQLite could hold such a fact")
    assert server.runtime is not None
    repo = server.runtime.services.fabric
    repo.record_fabric((), {}, [], {"mlu": float("inf"), "time_division": []}, previous=())
    with server.client() as c:
        answer = c.get("/v1/topology")
        assert answer.status_code == 200, answer.text
        assert answer.json()["mlu"] is None


def test_a_switch_controller_pass_records_an_unreachable_switch(server: LiveServer) -> None:
    assert server.runtime is not None and server.runtime.controller is not None
    controller = server.runtime.controller
    driver = controller.driver
    first = controller.cluster.oxcs[0].id
    real = driver.read

    def read(oxc_id: str, *, token: int | None = None) -> Any:
        if oxc_id == first:
            from app.southbound.errors import SwitchUnreachable

            raise SwitchUnreachable(f"{oxc_id} does not answer", oxc_id=oxc_id)
        return real(oxc_id, token=token)

    driver.read = read  # type: ignore[method-assign]
    try:
        controller.run_once()
        with server.client() as c:
            view = {o["id"]: o for o in c.get("/v1/topology").json()["oxcs"]}
        assert view[first]["stale"] is True
    finally:
        driver.read = real  # type: ignore[method-assign]
    controller.run_once()
    with server.client() as c:
        assert c.get("/v1/topology").json()["stale"] is False


def test_model_shapes_past_any_model_are_422_and_cannot_stop_scheduling(
    server: LiveServer,
) -> None:
    """A body with `hidden_size: 10**160` and no parameter count passed the memory check
    (it needs parameters) and was queued; every worker pass then failed in the traffic
    model (an int too large for a float) and no later job was ever placed."""
    shapes = [
        {"hidden_size": 10**160, "seq_len": 10**160},
        {"num_layers": 10**400},
        {"microbatch_size": 10**30},
        {"attention_heads": 10**200},
        # each in range, their product (the implied boundary activation) past 1e13 bytes
        {"hidden_size": 1 << 20, "seq_len": 1 << 24, "microbatch_size": 1 << 16},
    ]
    with server.client() as c:
        for i, model in enumerate(shapes):
            job = {"job_id": f"poison-{i}", "parallelism": {"dp": 1, "pp": 1}, "model": model}
            r = c.post("/v1/jobs", json=job)
            assert r.status_code == 422, (model, r.text)
            problem = r.json()
            assert problem["errors"] and all(
                e["field"].startswith("body.model") for e in problem["errors"]
            ), problem
            advice = {
                "model": {"parameters": 1e9, **model},
                "parallelism": {},
                "gpu_memory_bytes": 8e10,
            }
            r = c.post("/v1/advice/batch-size", json=advice)
            assert r.status_code == 422, (model, r.text)
            assert r.json()["errors"], r.text
        r = c.post("/v1/jobs", json={"job_id": "victim", "parallelism": {"dp": 1, "pp": 1}})
        assert r.status_code in (201, 202), r.text
        got = c.get("/v1/jobs/victim", params={"wait_for": "placed", "timeout_s": 10}).json()
        assert got["state"] == "placed", got

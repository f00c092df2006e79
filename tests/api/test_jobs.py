"""The job lifecycle over real HTTP, on SQLite and PostgreSQL."""

from __future__ import annotations

import concurrent.futures as cf
import json
import time
from pathlib import Path
from typing import Any

import pytest

from app.engine.cluster import build_cluster, cluster_to_dict
from app.engine.queue import QueuePolicy
from app.settings import Settings
from tests.support import LiveServer, live_on

SMALL_SERVERS = 32  # preset small: 4 pods x 2 ToRs x 4 servers


def job(job_id: str, dp: int = 2, pp: int = 2, ep: int = 1, **extra: Any) -> dict[str, Any]:
    return {"job_id": job_id, "parallelism": {"dp": dp, "pp": pp, "ep": ep}, **extra}


def test_arrival_places_on_distinct_servers_and_completion_frees_them(server: LiveServer) -> None:
    with server.client() as c:
        r = c.post("/v1/jobs", json=job("a", dp=4, pp=2))
        assert r.status_code == 201, r.text
        body = r.json()
        assert body["state"] == "placed"
        units = body["placement"]["units"]
        assert len(units) == 8
        assert len({u["server"] for u in units}) == 8
        assert {(u["stage"], u["dp_rank"]) for u in units} == {
            (s, d) for s in range(2) for d in range(4)
        }
        cluster = c.get("/v1/cluster").json()
        assert cluster["summary"]["free_servers"] == SMALL_SERVERS - 8
        held = {
            s["id"]
            for p in cluster["pods"]
            for t in p["tors"]
            for s in t["servers"]
            if not s["free"]
        }
        assert held == {u["server"] for u in units}

        done = c.post("/v1/jobs/a/complete")
        assert done.status_code == 200
        assert done.json()["state"] == "completed"
        again = c.post("/v1/jobs/a/complete")
        assert again.status_code == 200
        assert again.json()["completed_at"] == done.json()["completed_at"]
        assert c.get("/v1/cluster").json()["summary"]["free_servers"] == SMALL_SERVERS


def test_ep_groups_share_a_tor(server: LiveServer) -> None:
    with server.client() as c:
        r = c.post("/v1/jobs", json=job("moe", dp=2, pp=2, ep=4))
        assert r.status_code == 201, r.text
        groups: dict[tuple[int, int], set[str]] = {}
        for u in r.json()["placement"]["units"]:
            tor = u["server"].rsplit("/", 1)[0]
            groups.setdefault((u["stage"], u["dp_rank"]), set()).add(tor)
        assert all(len(tors) == 1 for tors in groups.values())


def test_a_job_left_queued_gets_202_when_its_pass_commits_not_after_the_admit_wait(
    settings: Settings,
) -> None:
    """The API answers 202 once a scheduling pass has considered the job (`examined`),
    not after LIGHTPATH_ADMIT_WAIT_S: a launcher behind a full cluster hears at once."""
    import time

    live = LiveServer(settings.model_copy(update={"admit_wait_s": 5.0}))
    live.start()
    try:
        with live.client() as c:
            assert c.post("/v1/jobs", json=job("big", dp=16, pp=2)).status_code == 201
            took = []
            for i in range(3):
                start = time.monotonic()
                queued = c.post("/v1/jobs", json=job(f"next-{i}", dp=2, pp=1))
                took.append(time.monotonic() - start)
                assert queued.status_code == 202 and queued.json()["queue_reason"]
            assert max(took) < 1.5, f"a queued job waited {max(took):.2f} s for its 202"
    finally:
        live.stop()


def test_the_head_of_the_queue_says_what_it_needs_in_its_own_terms(server: LiveServer) -> None:
    # the head's reason spoke of "whole-ToR EP groups" for every job, ep=1 included, and EP
    # groups may span a pod's ToRs anyway
    with server.client() as c:
        assert c.post("/v1/jobs", json=job("big", dp=16, pp=2)).status_code == 201

        def head_reason(job_id: str) -> str:
            for _ in range(100):
                reason = c.get(f"/v1/jobs/{job_id}").json()["queue_reason"] or ""
                if reason.startswith("head of the queue"):
                    return str(reason)
                time.sleep(0.05)
            raise AssertionError(f"{job_id} never became the head: {reason}")

        assert c.post("/v1/jobs", json=job("dense", dp=2, pp=1)).status_code == 202
        reason = head_reason("dense")
        assert reason.startswith("head of the queue: needs 2 servers, 0 free"), reason
        assert "EP" not in reason
        c.delete("/v1/jobs/dense")
        body = {"job_id": "moe", "parallelism": {"dp": 1, "pp": 2, "ep": 4}}
        assert c.post("/v1/jobs", json=body).status_code == 202
        reason = head_reason("moe")
        assert "EP groups of 4 servers inside a pod" in reason, reason


def test_full_cluster_queues_then_admits_on_completion(server: LiveServer) -> None:
    with server.client() as c:
        assert c.post("/v1/jobs", json=job("big", dp=16, pp=2)).status_code == 201
        queued = c.post("/v1/jobs", json=job("next", dp=2, pp=1))
        assert queued.status_code == 202
        assert queued.json()["state"] == "queued"
        assert "servers" in queued.json()["queue_reason"]
        polled = c.get("/v1/jobs/next", params={"wait_for": "placed", "timeout_s": 0.3})
        assert polled.json()["state"] == "queued"
        # `queued` is a state too (it was a 422): every state is it or later, so at once
        started = time.monotonic()
        now = c.get("/v1/jobs/next", params={"wait_for": "queued", "timeout_s": 20})
        assert now.status_code == 200 and now.json()["state"] == "queued", now.text
        assert time.monotonic() - started < 5
        assert [
            j["job_id"] for j in c.get("/v1/jobs", params={"state": "queued"}).json()["jobs"]
        ] == ["next"]

        with cf.ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(
                c.get, "/v1/jobs/next", params={"wait_for": "placed", "timeout_s": 20}
            )
            c.post("/v1/jobs/big/complete")
            placed = waiting.result(timeout=25)
        assert placed.json()["state"] == "placed"
        assert placed.json()["placed_at"] is not None


def test_waiting_for_placed_answers_with_the_fabric_plan(server: LiveServer) -> None:
    """A contract sweep: the 201 and a `wait_for=placed` read right after it carried
    `collective` and `network` null (the fabric pass plans the job tens of ms after
    its placement), so a launcher reading `network.mode` there found nothing."""
    with server.client() as c:
        for name, dp, pp in (("solo", 1, 1), ("wide", 4, 4), ("mid", 2, 2)):
            assert c.post("/v1/jobs", json=job(name, dp=dp, pp=pp)).status_code == 201
            r = c.get(f"/v1/jobs/{name}", params={"wait_for": "placed", "timeout_s": 10})
            assert r.json()["state"] == "placed"
            assert r.json()["collective"]["algorithm"], r.text
            assert r.json()["network"]["mode"] in ("isolated", "shared", "electrical", "none")


def test_unknown_job_is_404_problem(server: LiveServer) -> None:
    with server.client() as c:
        for r in (c.get("/v1/jobs/nope"), c.post("/v1/jobs/nope/complete")):
            assert r.status_code == 404
            assert r.headers["content-type"] == "application/problem+json"
            assert r.json()["status"] == 404


def test_same_id_same_body_is_200_other_body_is_409(server: LiveServer) -> None:
    with server.client() as c:
        assert c.post("/v1/jobs", json=job("x")).status_code == 201
        same = c.post("/v1/jobs", json=job("x", collective="auto", priority=0))
        assert same.status_code == 200
        # an empty `model` or `compute` object states nothing, as leaving it out
        assert c.post("/v1/jobs", json={**job("x"), "model": {}, "compute": {}}).status_code == 200
        assert same.json()["job_id"] == "x"
        other = c.post("/v1/jobs", json=job("x", dp=4))
        assert other.status_code == 409
        assert other.headers["content-type"] == "application/problem+json"
        assert len(c.get("/v1/jobs").json()["jobs"]) == 1


def test_concurrent_identical_posts_create_one_job(server: LiveServer) -> None:
    def post(_: int) -> int:
        with server.client() as c:
            return c.post("/v1/jobs", json=job("race", dp=2, pp=2)).status_code

    with cf.ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(post, range(8)))
    assert sorted(codes).count(201) == 1
    assert sorted(codes).count(200) == 7
    with server.client() as c:
        jobs = c.get("/v1/jobs").json()["jobs"]
        assert [j["job_id"] for j in jobs] == ["race"]
        decisions = c.get("/v1/decisions").json()["decisions"]
        assert [d["job_id"] for d in decisions if d["kind"] == "placement"] == ["race"]


def test_never_fitting_job_is_refused_with_reason(server: LiveServer) -> None:
    with server.client() as c:
        r = c.post("/v1/jobs", json=job("huge", dp=64, pp=2))
        assert r.status_code == 422
        problem = r.json()
        assert problem["type"].endswith("never-fits")
        assert "more servers than the cluster has" in problem["detail"]
        assert problem["reason"] == problem["detail"] == "; ".join(problem["reasons"])
        # small's pods hold 8 servers: an EP group of 9 fits no pod (one of 8 would
        # span the ToRs of a pod)
        wide = c.post("/v1/jobs", json=job("wide", dp=1, pp=1, ep=9))
        assert wide.status_code == 422
        assert "pod" in wide.json()["detail"]
        assert c.get("/v1/jobs").json()["jobs"] == []


def test_decision_log_is_gap_free_and_pages(server: LiveServer) -> None:
    with server.client() as c:
        for i in range(7):
            assert c.post("/v1/jobs", json=job(f"j{i}", dp=1, pp=2)).status_code == 201
        seen, after = [], 0
        while True:
            page = c.get("/v1/decisions", params={"after": after, "limit": 3}).json()
            if not page["decisions"]:
                assert page["next"] == after  # caught up: ask again with the same after
                break
            seen.extend(d["seq"] for d in page["decisions"])
            # one cursor rule on every paginated endpoint: next is the after to pass
            assert page["next"] == page["decisions"][-1]["seq"]
            after = page["next"]
        assert seen == list(range(1, len(seen) + 1))
        assert len(seen) >= 7


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        (QueuePolicy.FIFO, ["first", "small", "urgent"]),
        (QueuePolicy.SMALLEST_FIRST, ["small", "urgent", "first"]),
        (QueuePolicy.EDF, ["urgent", "first", "small"]),
    ],
)
def test_queue_policies_readmit_in_their_order(
    settings: Settings, policy: QueuePolicy, expected: list[str]
) -> None:
    live = LiveServer(settings.model_copy(update={"queue_policy": policy, "backfill": False}))
    live.start()
    try:
        with live.client() as c:
            assert c.post("/v1/jobs", json=job("blocker", dp=16, pp=2)).status_code == 201
            # each waiting job needs the whole cluster, so they are admitted one at a time
            c.post("/v1/jobs", json=job("first", dp=16, pp=2, deadline=3000.0))
            c.post("/v1/jobs", json=job("small", dp=8, pp=2, deadline=4000.0))
            c.post("/v1/jobs", json=job("urgent", dp=12, pp=2, deadline=1000.0))
            order = []
            running = "blocker"
            for _ in expected:
                c.post(f"/v1/jobs/{running}/complete")
                placed = None
                for _attempt in range(100):
                    states = {
                        j["job_id"]: j
                        for j in c.get("/v1/jobs", params={"state": "placed"}).json()["jobs"]
                    }
                    if states:
                        placed = next(iter(states))
                        break
                    c.get("/v1/jobs/first", params={"wait_for": "completed", "timeout_s": 0.05})
                assert placed is not None
                order.append(placed)
                running = placed
            assert order == expected
    finally:
        live.stop()


def test_backfill_admits_small_jobs_while_the_head_waits(server: LiveServer) -> None:
    with server.client() as c:
        holder = {}
        for i in range(SMALL_SERVERS):
            r = c.post("/v1/jobs", json=job(f"one{i}", dp=1, pp=1))
            assert r.status_code == 201
            holder[r.json()["placement"]["units"][0]["server"]] = f"one{i}"
        # free one server in every ToR: no ToR can take a 4-wide EP group
        freed_tor = set()
        for server_id, job_id in sorted(holder.items()):
            tor = server_id.rsplit("/", 1)[0]
            if tor not in freed_tor:
                freed_tor.add(tor)
                assert c.post(f"/v1/jobs/{job_id}/complete").status_code == 200
                del holder[server_id]
        head = c.post("/v1/jobs", json=job("head", dp=2, pp=1, ep=4))
        assert head.status_code == 202
        small = c.post("/v1/jobs", json=job("small", dp=1, pp=1))
        assert small.status_code == 201, "backfill should place a 1-server job"
        for job_id in holder.values():
            c.post(f"/v1/jobs/{job_id}/complete")
        placed = c.get("/v1/jobs/head", params={"wait_for": "placed", "timeout_s": 10}).json()
        assert placed["state"] == "placed"


def test_a_job_too_big_for_the_free_servers_gets_202_without_waiting_for_a_pass(
    settings: Settings,
) -> None:
    """With too few servers free, a job is queued whatever a pass would add: the API answers
    202 at once (with why). A job that might fit still waits for the scheduler's decision,
    here up to the admit wait, since no worker runs beside this API."""
    import time

    from app.engine.job import Placement, Unit
    from app.wiring import build_store, load_cluster

    servers = list(load_cluster("small").server_ids)
    store = build_store(settings)
    try:
        body = {"job_id": "holder", "parallelism": {"dp": 30, "pp": 1}}
        store.submit_job("holder", body, "h", servers_needed=30, priority=0, deadline=None)
        units = tuple(Unit(s, 0, i, 0) for i, s in enumerate(servers[:30]))
        store.record_admission(
            [Placement("holder", units)], examined=[], queue_reasons={}, reason="arrival"
        )
    finally:
        store.dispose()
    live = LiveServer(settings.model_copy(update={"admit_wait_s": 1.5}), api_only=True)
    live.start()
    try:
        with live.client() as c:
            start = time.monotonic()
            too_big = c.post("/v1/jobs", json=job("four", dp=4, pp=1))
            took = time.monotonic() - start
            assert too_big.status_code == 202, too_big.text
            assert too_big.json()["queue_reason"] == "needs 4 servers, 2 free"
            assert took < 1.0, f"waited {took:.2f} s for a 202 the free count decided"
            start = time.monotonic()
            fits = c.post("/v1/jobs", json=job("two", dp=2, pp=1))
            assert fits.status_code == 202  # nobody decided: answered at the admit wait
            assert time.monotonic() - start >= 1.4
    finally:
        live.stop()


@pytest.mark.redis
def test_serve_talks_over_redis_streams_when_redis_is_configured(
    database_url: str, redis_url: str, prefix: str, admin: Any
) -> None:
    """With LIGHTPATH_REDIS_URL set, `serve`'s parts meet on the Redis stream, not in process:
    a job is placed through it and the stream's consumer group has read its entries."""
    settings = Settings(
        database_url=database_url,
        cluster="small",
        admit_wait_s=5.0,
        worker_tick_s=30.0,  # a tick would place it without the stream
        redis_url=redis_url,
        redis_prefix=prefix,
    )
    live = LiveServer(settings)
    live.start()
    try:
        with live.client() as c:
            r = c.post(
                "/v1/jobs", json={"job_id": "via-redis", "parallelism": {"dp": 2, "pp": 1, "ep": 1}}
            )
            assert r.status_code == 201, r.text
            assert r.json()["state"] == "placed"
        groups = admin.xinfo_groups(f"{prefix}:commands")
        assert [g["name"] for g in groups] == [b"workers"]
        assert groups[0]["entries-read"] >= 1
    finally:
        live.stop()


def test_a_job_stored_on_a_larger_cluster_is_answered_as_it_stands(
    settings: Settings, tmp_path: Path
) -> None:
    """Restarted on a smaller cluster, a job the state holds could no longer fit: its
    identical submit answered 422 `never-fits` before the id was looked up, where
    the contract answers 200 with the job (409 for another body). A new id that
    cannot fit is still 422."""
    big = build_cluster(
        "big", pods=8, tors_per_pod=2, servers_per_tor=4, uplink_ports_per_pod=8, oxcs=2,
        oxc_ports=32,
    )  # fmt: skip
    path = tmp_path / "big.json"
    path.write_text(json.dumps(cluster_to_dict(big)))
    body = {"job_id": "wide", "parallelism": {"dp": 40, "pp": 1}}
    with live_on(settings, str(path)) as before, before.client() as c:
        assert c.post("/v1/jobs", json=body).status_code in (201, 202)
    with live_on(settings, "small") as after, after.client() as c:
        again = c.post("/v1/jobs", json=body)
        assert again.status_code == 200, again.text
        assert again.json()["job_id"] == "wide"
        other = c.post("/v1/jobs", json={**body, "priority": 3})
        assert other.status_code == 409, other.text
        new = c.post("/v1/jobs", json={**body, "job_id": "wider"})
        assert new.status_code == 422 and new.json()["type"].endswith("never-fits")

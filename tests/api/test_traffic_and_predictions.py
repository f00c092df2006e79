"""Traffic reports over HTTP: validation, durability, and the cycle predictor behind them."""

from __future__ import annotations

import random
import time
from typing import Any

from tests.support import LiveServer


def _job(client: Any, job_id: str, dp: int, pp: int) -> dict[str, Any]:
    r = client.post("/v1/jobs", json={"job_id": job_id, "parallelism": {"dp": dp, "pp": pp}})
    assert r.status_code == 201, r.text
    return r.json()


def _phase_reports(
    job: dict[str, Any], rng: random.Random, start: float, n: int, label_every: int
) -> list[dict[str, Any]]:
    """Alternate PP (stage 0 -> 1) and DP (ring within each stage) phases with +-4% noise."""
    units = job["placement"]["units"]
    by_stage: dict[int, list[str]] = {}
    for u in sorted(units, key=lambda u: (u["stage"], u["dp_rank"])):
        by_stage.setdefault(u["stage"], []).append(u["server"])
    reports = []
    for i in range(n):
        if i % 2 == 0:
            demands = [
                {"src": a, "dst": b, "bytes": 4e8 * rng.uniform(0.96, 1.04)}
                for a, b in zip(by_stage[0], by_stage[1], strict=True)
            ]
        else:
            demands = []
            for members in by_stage.values():
                for k, a in enumerate(members):
                    b = members[(k + 1) % len(members)]
                    demands.append({"src": a, "dst": b, "bytes": 2e9 * rng.uniform(0.96, 1.04)})
        report: dict[str, Any] = {"phase_started_at": start + i * 0.5, "demands": demands}
        if i % label_every == 0:
            report["job_id"] = job["job_id"]
        reports.append(report)
    return reports


def test_a_two_stage_job_learns_period_two(server: LiveServer) -> None:
    rng = random.Random(7)
    with server.client() as c:
        # dp=8, pp=2 on `small` spans pods, so both phases cross pods
        job = _job(c, "llm", dp=8, pp=2)
        reports = _phase_reports(job, rng, 1_763_812_345.0, 40, label_every=3)
        for k in range(0, len(reports), 10):
            r = c.post("/v1/traffic", json={"reports": reports[k : k + 10]})
            assert r.status_code == 202, r.text
            assert r.json()["accepted"] == 10
        assert r.json()["last_seq"] == 40
        for _ in range(100):
            p = c.get("/v1/predictions/llm").json()
            if p["hits"] + p["held"] + p["misses"] == 40:
                break
            time.sleep(0.1)
        # phases from before the job's circuits were asked for ran on what it held
        assert p["hits"] + p["held"] + p["misses"] == 40
        assert p["period"] == 2
        assert len(p["queue"]) == 2 and p["queue"][0] != p["queue"][1]
        assert p["misses"] <= 5
        assert p["next_plan"] in p["queue"]


def test_hits_are_what_the_switches_delivered(server: LiveServer) -> None:
    rng = random.Random(11)
    with server.client() as c:
        job = _job(c, "fast", dp=8, pp=2)
        # phases 10 ms apart at 25 ms reconfiguration: no switch could deliver them
        burst = _phase_reports(job, rng, time.time(), 30, label_every=1)
        for k, r in enumerate(burst):
            r["phase_started_at"] = burst[0]["phase_started_at"] + 0.010 * k
        assert c.post("/v1/traffic", json={"reports": burst}).status_code == 202
        for _ in range(100):
            p = c.get("/v1/predictions/fast").json()
            if p["hits"] + p["held"] + p["misses"] > 0:
                break
            time.sleep(0.1)
        assert 0 < p["hits"] + p["held"] + p["misses"] <= 30
        assert p["hits"] == 0


def test_phases_half_a_second_apart_are_rewired_in_time(server: LiveServer) -> None:
    """Forward sends of a 3-stage job alternate pod pairs; 0.5 s gaps hide a 25 ms switch."""
    rng = random.Random(5)
    with server.client() as c:
        job = _job(c, "slow", dp=8, pp=3)  # stage s in pod-s on `small`
        by_stage: dict[int, list[str]] = {}
        for u in sorted(job["placement"]["units"], key=lambda u: (u["stage"], u["dp_rank"])):
            by_stage.setdefault(u["stage"], []).append(u["server"])
        n, gap = 16, 0.5
        start = time.time() + 0.2
        for i in range(n):
            # reported as the phase starts, like a training loop's reporter
            time.sleep(max(0.0, start + i * gap - time.time()))
            src, dst = by_stage[i % 2], by_stage[i % 2 + 1]
            demands = [
                {"src": a, "dst": b, "bytes": 4e9 * rng.uniform(0.96, 1.04)}
                for a, b in zip(src, dst, strict=True)
            ]
            report = {"job_id": "slow", "phase_started_at": start + i * gap, "demands": demands}
            assert c.post("/v1/traffic", json={"reports": [report]}).status_code == 202
        for _ in range(100):
            p = c.get("/v1/predictions/slow").json()
            if p["hits"] + p["held"] + p["misses"] == n:
                break
            time.sleep(0.1)
        assert p["hits"] + p["held"] + p["misses"] == n
        assert p["period"] == 2
        # learning takes a few phases; after that every phase finds its circuits ready
        assert p["hits"] >= n // 2, p
        assert p["exposed_reconfig_s"] == 0.0, str(p)
        rewired = c.get("/v1/decisions", params={"limit": 500}).json()["decisions"]
        mine = [d for d in rewired if d.get("job_id") == "slow" and d["reason"] == "prediction"]
        assert {d["kind"] for d in mine} >= {"oxc", "routing"}


def test_unknown_job_prediction_is_404(server: LiveServer) -> None:
    with server.client() as c:
        r = c.get("/v1/predictions/nobody")
        assert r.status_code == 404
        assert r.headers["content-type"] == "application/problem+json"
        _job(c, "fresh", 1, 1)
        p = c.get("/v1/predictions/fresh").json()
        assert p["hits"] == 0 and p["misses"] == 0 and p["period"] is None


GOOD_DEMAND = {"src": "pod-0/tor-0/srv-0", "dst": "pod-1/tor-0/srv-0", "bytes": 1e6}


def test_bad_reports_are_refused_whole(server: LiveServer) -> None:
    cases = [
        {"reports": []},
        {"reports": [{"phase_started_at": 1.0, "demands": []}]},
        {"reports": [{"phase_started_at": 1.0, "demands": [{**GOOD_DEMAND, "bytes": -1}]}]},
        {"reports": [{"phase_started_at": 1.0, "demands": [{**GOOD_DEMAND, "src": "pod-9/x"}]}]},
        {
            "reports": [
                {"phase_started_at": 1.0, "demands": [{**GOOD_DEMAND, "dst": GOOD_DEMAND["src"]}]}
            ]
        },
        {"reports": [{"phase_started_at": 1.0, "demands": [GOOD_DEMAND], "extra": 1}]},
        {"reports": [{"demands": [GOOD_DEMAND]}]},
    ]
    with server.client() as c:
        for body in cases:
            mixed = {
                "reports": [{"phase_started_at": 1.0, "demands": [GOOD_DEMAND]}] + body["reports"]
            }
            for attempt in (body, mixed) if body["reports"] else (body,):
                r = c.post("/v1/traffic", json=attempt)
                assert r.status_code == 422, (attempt, r.text)
                assert r.headers["content-type"] == "application/problem+json"
                assert r.json()["errors"]
        nan = (
            b'{"reports": [{"phase_started_at": 1.0, "demands": [{"src": "pod-0/tor-0/srv-0",'
            b' "dst": "pod-1/tor-0/srv-0", "bytes": NaN}]}]}'
        )
        r = c.post("/v1/traffic", content=nan, headers={"content-type": "application/json"})
        assert 400 <= r.status_code < 500
        big = {"reports": [{"phase_started_at": 1.0, "demands": [GOOD_DEMAND] * 60_000}]}
        r = c.post("/v1/traffic", json=big)  # > 4 MiB
        assert r.status_code == 413
        ok = c.post(
            "/v1/traffic", json={"reports": [{"phase_started_at": 1.0, "demands": [GOOD_DEMAND]}]}
        )
        assert ok.status_code == 202
        assert ok.json()["last_seq"] == 1, "no refused batch may have consumed a sequence number"


def test_batch_size_advice_and_memory_admission(server: LiveServer) -> None:
    with server.client() as c:
        advice = c.post(
            "/v1/advice/batch-size",
            json={
                "model": {
                    "parameters": 13e9,
                    "bytes_per_parameter": 2,
                    "hidden_size": 5120,
                    "num_layers": 40,
                    "seq_len": 2048,
                    "optimizer": "adam",
                    "activation_checkpointing": False,
                },
                "parallelism": {"tp": 8, "pp": 2, "dp": 16, "ep": 1},
                "gpu_memory_bytes": 85899345920,
            },
        )
        assert advice.status_code == 200, advice.text
        a = advice.json()
        assert a["fits"] is True and a["max_microbatch"] >= 1
        mem = a["memory_bytes"]
        assert abs(mem["fixed"] + mem["activations"] + mem["gradients"] - mem["total"]) < 1
        assert mem["total"] <= 85899345920

        def refused(job_id: str, model: dict[str, Any]) -> dict[str, Any]:
            one_server = {"job_id": job_id, "parallelism": {"dp": 1, "pp": 1}, "model": model}
            r = c.post("/v1/jobs", json=one_server)
            assert r.status_code == 422, r.text
            assert r.json()["type"].endswith("out-of-memory")
            return r.json()  # type: ignore[no-any-return]

        body = refused("huge", {"parameters": 175e9, "bytes_per_parameter": 2, "zero_stage": 0})
        assert body["memory_bytes"]["total"] > 80 * 1024**3
        example = c.post(
            "/v1/jobs",
            json={
                "job_id": "gpt3-175b-7",
                "parallelism": {"dp": 4, "pp": 2, "ep": 1},
                "model": {
                    "parameters": 175e9,
                    "bytes_per_parameter": 2,
                    "activation_bytes": 50331648,
                    "microbatches": 16,
                },
                "compute": {
                    "microbatch_forward_s": 0.01,
                    "microbatch_backward_s": 0.02,
                    "optimizer_s": 0.05,
                },
                "collective": "auto",
                "priority": 0,
                "deadline": None,
            },
        )
        assert example.status_code in (201, 202), example.text
        # 10 TB of boundary activation per micro-batch: refused on that alone
        body = refused("oom4", {"parameters": 1e9, "activation_bytes": 1e13, "microbatches": 10**6})
        assert body["memory_bytes"]["activations"] >= 1e13 / 8
        assert [e["field"] for e in body["errors"]] == ["body.model"]
        assert c.get("/v1/jobs/oom4").status_code == 404
        never = c.post("/v1/jobs", json={"job_id": "nf", "parallelism": {"dp": 10_000, "pp": 1}})
        assert never.status_code == 422
        assert never.json()["errors"][0]["field"] == "body.parallelism"


def test_advice_says_when_memory_bounds_no_micro_batch(server: LiveServer) -> None:
    """Without hidden size, layers and sequence length nothing in M(b) grows with b:
    the answer used to be `max_microbatch: 65536` (the search's cap) with nothing to
    say it was no bound; it now says so and names the missing facts."""
    model = {"parameters": 7e9, "hidden_size": 4096}
    body = {"model": model, "parallelism": {"tp": 8}, "gpu_memory_bytes": 8e10}
    with server.client() as c:
        r = c.post("/v1/advice/batch-size", json=body)
        assert r.status_code == 200, r.text
        a = r.json()
        assert a["fits"] is True and a["activations_known"] is False
        assert a["max_microbatch"] == 65536
        assert "model.num_layers" in a["detail"] and "model.seq_len" in a["detail"]
        assert "model.hidden_size" not in a["detail"]
        full = {**model, "num_layers": 32, "seq_len": 2048}
        r = c.post("/v1/advice/batch-size", json={**body, "model": full})
        assert r.json()["activations_known"] is True and r.json()["max_microbatch"] < 65536
        # a model that cannot fit even at b = 1 is answered as before
        r = c.post("/v1/advice/batch-size", json={**body, "model": {"parameters": 1e12}})
        assert r.status_code == 200, r.text
        assert r.json()["fits"] is False and r.json()["max_microbatch"] == 0


def test_a_retried_batch_with_the_same_key_is_stored_once(server: LiveServer) -> None:
    batch = {"reports": [{"phase_started_at": 1.0, "demands": [GOOD_DEMAND]}] * 3}
    with server.client() as c:
        first = c.post("/v1/traffic", json=batch, headers={"Idempotency-Key": "batch-1"})
        again = c.post("/v1/traffic", json=batch, headers={"Idempotency-Key": "batch-1"})
        assert first.status_code == again.status_code == 202
        assert first.json() == again.json() == {"accepted": 3, "last_seq": 3}
        other = c.post("/v1/traffic", json=batch, headers={"Idempotency-Key": "batch-2"})
        assert other.json()["last_seq"] == 6
        # /metrics counts the retried batch once too (it counted 9 reports, 9 demands)
        metrics = c.get("/metrics").text
        assert "lightpath_traffic_reports_total 6.0" in metrics, metrics
        assert "lightpath_traffic_demands_total 6.0" in metrics

"""The pipeline schedule over HTTP: admission, batch-size advice, idempotent bodies."""

from __future__ import annotations

from typing import Any

from tests.support import LiveServer

# pp=2 with 32 micro-batches of a 13B model at 4K tokens: GPipe holds all 32
# micro-batches' activations on the first stage (over 80 GiB), 1F1B only 2
MODEL: dict[str, Any] = {
    "parameters": 13e9,
    "bytes_per_parameter": 2,
    "hidden_size": 5120,
    "num_layers": 40,
    "seq_len": 4096,
    "microbatches": 32,
    "microbatch_size": 1,
}


def test_admission_uses_the_stated_schedule_and_gpipe_by_default(server: LiveServer) -> None:
    with server.client() as c:
        job = {"parallelism": {"dp": 2, "pp": 2}, "model": MODEL}
        default = c.post("/v1/jobs", json={"job_id": "gp-default", **job})
        assert default.status_code == 422, default.text
        assert default.json()["type"].endswith("out-of-memory")
        gpipe = c.post("/v1/jobs", json={"job_id": "gp", "schedule": "gpipe", **job})
        assert gpipe.status_code == 422
        assert gpipe.json()["memory_bytes"] == default.json()["memory_bytes"]
        ofob = c.post("/v1/jobs", json={"job_id": "ofob", "schedule": "1f1b", **job})
        assert ofob.status_code in (201, 202), ofob.text
        got = c.get("/v1/jobs/ofob").json()
        assert got["schedule"] == "1f1b"
        again = c.post("/v1/jobs", json={"job_id": "ofob", "schedule": "1f1b", **job})
        assert again.status_code == 200
        bad = c.post("/v1/jobs", json={"job_id": "bad", "schedule": "zb-v", **job})
        assert bad.status_code == 422
        assert bad.headers["content-type"].startswith("application/problem+json")


def test_stating_the_default_schedule_matches_a_body_without_it(server: LiveServer) -> None:
    with server.client() as c:
        plain = {"job_id": "plain", "parallelism": {"dp": 2, "pp": 1}}
        first = c.post("/v1/jobs", json=plain)
        assert first.status_code in (201, 202), first.text
        assert c.get("/v1/jobs/plain").json()["schedule"] == "gpipe"
        same = c.post("/v1/jobs", json={**plain, "schedule": "gpipe"})
        assert same.status_code == 200, same.text
        other = c.post("/v1/jobs", json={**plain, "schedule": "1f1b"})
        assert other.status_code == 409


def test_batch_size_advice_follows_the_schedule(server: LiveServer) -> None:
    with server.client() as c:
        base = {
            "model": {k: v for k, v in MODEL.items() if k != "microbatch_size"},
            "parallelism": {"tp": 8, "pp": 2, "dp": 2},
            "gpu_memory_bytes": 80 * 1024**3,
        }
        gpipe = c.post("/v1/advice/batch-size", json=base).json()
        ofob = c.post("/v1/advice/batch-size", json={**base, "schedule": "1f1b"}).json()
        explicit = c.post("/v1/advice/batch-size", json={**base, "schedule": "gpipe"}).json()
        assert gpipe == explicit
        assert ofob["fits"] and ofob["max_microbatch"] >= 1
        assert gpipe["max_microbatch"] < ofob["max_microbatch"]

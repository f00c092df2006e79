"""The pipeline schedule over HTTP: admission, batch-size advice, idempotent bodies."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from app.engine.cluster import preset
from app.engine.memory import NOT_ENOUGH_MEMORY
from app.sim.simulator import simulate
from app.sim.workload import read_workload
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


def _admits_up_to(c: Any, model: dict[str, Any], b: int, prefix: str) -> None:
    """Admission takes `model` (dp 2, pp 2, 1F1B) at micro-batch b and refuses b + 1."""
    for k, size, admitted in ((0, b, True), (1, b + 1, False)):
        body = {
            "job_id": f"{prefix}-{k}",
            "parallelism": {"dp": 2, "pp": 2},
            "model": {**model, "microbatch_size": size},
            "schedule": "1f1b",
        }
        answer = c.post("/v1/jobs", json=body)
        assert (answer.status_code in (201, 202)) == admitted, (size, answer.text)


def test_batch_size_advice_and_admission_draw_the_same_line(server: LiveServer) -> None:
    """Advice assumed ZeRO stage 0 where admission assumes LIGHTPATH_DEFAULT_ZERO_STAGE
    (1): a sweep had advice answer 12 samples per micro-batch where admission held 13. With
    no stage stated both assume the same one: the advised size is admitted, one more is
    refused."""
    from app.engine.gpu_profiles import gpu_profile

    memory = gpu_profile(preset("small").gpu_model).memory_bytes
    # at 1K tokens a sample's activations are small beside the optimizer's halving:
    # stage 0 advises 37, stage 1 40
    model = {k: v for k, v in MODEL.items() if k != "microbatch_size"} | {"seq_len": 1024}
    with server.client() as c:
        advice = c.post(
            "/v1/advice/batch-size",
            json={
                "model": model,
                "parallelism": {"tp": 8, "pp": 2, "dp": 2},
                "schedule": "1f1b",
                "gpu_memory_bytes": memory,
            },
        ).json()
        b = advice["max_microbatch"]
        assert advice["fits"] and 1 <= b < 65_536, advice
        _admits_up_to(c, model, b, "line")


def test_advice_without_tp_assumes_the_servers_gpus_as_admission_does(server: LiveServer) -> None:
    """A job body has no `tp`: admission runs tensor parallelism across a server's GPUs,
    while the advice assumed tp 1, so a 13B job at pp 2 was advised "does not fit"
    (256 GB) and then admitted. Without `tp` the advice is the one for tp = GPUs per
    server, and the job it says fits is admitted."""
    model = {
        "parameters": 13_000_000_000,
        "bytes_per_parameter": 2,
        "hidden_size": 5120,
        "num_layers": 40,
        "seq_len": 2048,
        "microbatches": 8,
    }
    split = {"pp": 2, "dp": 2, "ep": 1}
    gpus = preset("small").gpus_per_server
    with server.client() as c:
        plain = c.post("/v1/advice/batch-size", json={"model": model, "parallelism": split})
        stated = c.post(
            "/v1/advice/batch-size", json={"model": model, "parallelism": split | {"tp": gpus}}
        )
        assert plain.status_code == stated.status_code == 200, plain.text
        assert plain.json() == stated.json() and plain.json()["fits"], plain.json()
        one = c.post(
            "/v1/advice/batch-size", json={"model": model, "parallelism": split | {"tp": 1}}
        )
        assert not one.json()["fits"]  # tp 1 stated is still tp 1
        r = c.post("/v1/jobs", json={"job_id": "adv-13b", "parallelism": split, "model": model})
        assert r.status_code in (201, 202), r.text


def test_advice_takes_a_job_bodys_model_and_the_clusters_gpu_memory(server: LiveServer) -> None:
    """Advice refused a job body's `activation_bytes` and `microbatch_size`, jobs refused
    advice's `attention_heads`, and advice required `gpu_memory_bytes`: a launcher could
    not ask about the body it was about to submit. Both now take one model, judged alike."""
    model = MODEL | {"seq_len": 1024, "attention_heads": 64}
    with server.client() as c:

        def advise(m: dict[str, Any]) -> dict[str, Any]:
            body = {"model": m, "parallelism": {"tp": 8, "pp": 2, "dp": 2}, "schedule": "1f1b"}
            r = c.post("/v1/advice/batch-size", json=body)
            assert r.status_code == 200, r.text
            return r.json()

        advice = advise(model)
        b = advice["max_microbatch"]
        assert advice["fits"] and 1 <= b < 65_536, advice
        # more heads keep more attention scores: a smaller micro-batch fits than with the
        # default hidden_size / 128 = 40
        assert (
            b < advise({k: v for k, v in model.items() if k != "attention_heads"})["max_microbatch"]
        )
        _admits_up_to(c, model, b, "heads")
        # a pipeline-boundary activation measured at micro-batch 4 bounds the micro-batch
        # without the layer facts
        measured = {"parameters": 13e9, "activation_bytes": 4e9, "microbatch_size": 4}
        bounded = advise(measured)
        assert bounded["activations_known"] and 1 <= bounded["max_microbatch"] < 65_536


MIXTRAL = {
    "parameters": 141e9,
    "bytes_per_parameter": 2,
    "hidden_size": 6144,
    "num_layers": 56,
    "seq_len": 4096,
    "microbatches": 16,
    "activation_checkpointing": True,
}
# (job body, what the service answers); the simulator must refuse exactly the 422s
ADMISSION_CASES: list[tuple[dict[str, Any], bool]] = [
    ({"parallelism": {"dp": 2, "pp": 2}, "model": MODEL}, False),  # GPipe holds 32
    ({"parallelism": {"dp": 2, "pp": 2}, "model": MODEL, "schedule": "1f1b"}, True),
    ({"parallelism": {"dp": 1, "pp": 1}, "model": {**MODEL, "parameters": 175e9}}, False),
    # experts split over ep servers: Mixtral 8x22B fits over 8, not over 1
    ({"parallelism": {"dp": 1, "pp": 2, "ep": 8}, "model": MIXTRAL, "schedule": "1f1b"}, True),
    ({"parallelism": {"dp": 1, "pp": 2, "ep": 1}, "model": MIXTRAL, "schedule": "1f1b"}, False),
    ({"parallelism": {"dp": 4, "pp": 1}, "model": {"parameters": 7e9}, "lease_s": 60}, True),
]


def test_the_simulator_admits_exactly_what_the_service_admits(
    server: LiveServer, tmp_path: Path
) -> None:
    """One admission, two doors: each body POSTed to the service and, as a workload
    line, replayed by the simulator on the same cluster."""
    lines = []
    with server.client() as c:
        for k, (body, fits) in enumerate(ADMISSION_CASES):
            answer = c.post("/v1/jobs", json={"job_id": f"adm-{k}", **body})
            assert (answer.status_code in (201, 202)) == fits, (k, answer.text)
            if not fits:
                assert answer.json()["type"].endswith("out-of-memory")
            lines.append({"job_id": f"adm-{k}", **body, "arrival_s": float(k), "iterations": 2})
    path = tmp_path / "w.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = simulate(preset("small"), read_workload(path), "ideal")
    refused = {j.job_id for j in result.jobs if j.refused}
    assert refused == {f"adm-{k}" for k, (_, fits) in enumerate(ADMISSION_CASES) if not fits}
    for j in result.jobs:
        if j.refused:
            assert NOT_ENOUGH_MEMORY in j.refused

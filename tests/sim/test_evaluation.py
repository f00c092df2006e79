"""The evaluation's guarantees: calibrated timing, charged sharing, bounds, determinism."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from app.engine.cluster import preset
from app.engine.job import Job, ModelFacts, Parallelism
from app.sim.simulator import simulate
from app.sim.workload import WorkloadJob

TABLE = Path(__file__).resolve().parents[2] / "data" / "tables" / "megatron_sc21_table1.csv"


def _table1_rows() -> list[dict[str, str]]:
    with open(TABLE, newline="") as f:
        return list(csv.DictReader(f))


def _row_job(r: dict[str, str]) -> Job:
    """A Table 1 row as Lightpath runs it: TP (and TP<8 replicas) inside 8-GPU servers."""
    gpus, tp, pp = int(r["num_gpus"]), int(r["tensor_parallel"]), int(r["pipeline_parallel"])
    dp_megatron = int(r["data_parallel_derived"])
    h, s = int(r["hidden_size"]), int(r["seq_len"])
    mbs = 8 // tp  # one server runs 8/tp Megatron replicas' micro-batches side by side
    return Job(
        f"gpt-{r['params_billion']}",
        Parallelism(dp=gpus // (8 * pp), pp=pp),
        ModelFacts(
            parameters=float(r["params_billion"]) * 1e9,
            bytes_per_parameter=2.0,
            activation_bytes=float(h * s * mbs * 2),
            microbatches=int(r["global_batch_size"]) // dp_megatron,
            hidden_size=h,
            num_layers=int(r["num_layers"]),
            seq_len=s,
            microbatch_size=mbs,
        ),
    )


@pytest.mark.parametrize("row", _table1_rows(), ids=lambda r: f"{r['params_billion']}B")
def test_megatron_table1_rows_alone_on_ideal_within_10_percent(row: dict[str, str]) -> None:
    cluster = preset("seed-15k")
    job = _row_job(row)
    result = simulate(cluster, [WorkloadJob(job, 0.0, 3)], "ideal", gpu="a100")
    j = result.jobs[0]
    assert j.end_s is not None and j.start_s is not None
    iteration = (j.end_s - j.start_s) / 3
    derived = float(row["derived_iteration_time_s"])
    assert iteration == pytest.approx(derived, rel=0.10), (iteration, derived)

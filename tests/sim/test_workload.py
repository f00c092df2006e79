"""Workload files: the reader refuses bad lines clearly; the Kalos importer writes valid ones."""

from __future__ import annotations

import csv
import gzip
import json
import math
from pathlib import Path

import pytest

from app.sim.commands import run_from_trace
from app.sim.workload import (
    WorkloadError,
    from_kalos_trace,
    read_workload,
    workload_job_to_dict,
    write_workload,
)

TRACE = Path(__file__).resolve().parents[2] / "data/traces/acme_kalos_completed_llm_jobs.csv"

GOOD = {
    "job_id": "gpt-1",
    "parallelism": {"dp": 2, "pp": 2, "ep": 1},
    "model": {"parameters": 1.3e9, "bytes_per_parameter": 2, "microbatches": 8},
    "compute": {"microbatch_forward_s": 0.01, "microbatch_backward_s": 0.02, "optimizer_s": 0.0},
    "collective": "auto",
    "arrival_s": 0,
    "iterations": 10,
}


def _write(tmp_path: Path, *lines: object) -> Path:
    path = tmp_path / "w.jsonl"
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return path


def test_reads_a_valid_line_and_round_trips(tmp_path: Path) -> None:
    jobs = read_workload(_write(tmp_path, GOOD))
    assert len(jobs) == 1 and jobs[0].job.parallelism.servers == 4
    assert jobs[0].iterations == 10 and jobs[0].job.compute.microbatch_backward_s == 0.02
    again = tmp_path / "again.jsonl"
    write_workload(again, jobs)
    assert [workload_job_to_dict(j) for j in read_workload(again)] == [
        workload_job_to_dict(j) for j in jobs
    ]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", ":1: not valid JSON"),
        ({**GOOD, "paralellism": {}}, "unknown field(s) paralellism"),
        ({k: v for k, v in GOOD.items() if k != "iterations"}, "missing required field iterations"),
        ({**GOOD, "iterations": 0}, "iterations must be an integer >= 1"),
        ({**GOOD, "iterations": 2.5}, "iterations must be an integer >= 1"),
        ({**GOOD, "arrival_s": -1}, "arrival_s must be a finite number >= 0"),
        ({**GOOD, "parallelism": {"dp": "8", "pp": 1}}, "dp must be an integer >= 1"),
        ({**GOOD, "parallelism": {"dp": True, "pp": 1}}, "dp must be an integer >= 1"),
        ({**GOOD, "collective": "magic"}, "collective must be one of"),
        ({**GOOD, "model": {"parameters": -1}}, "parameters must be a positive"),
        ({**GOOD, "model": {"activation_bytes": 1e307}}, "activation_bytes must be at most 1e+13"),
        ({**GOOD, "compute": {"optimizer_s": 1e308}}, "optimizer_s must be at most 86400"),
        ({**GOOD, "job_id": " bad id"}, "is not a valid job id"),
        ([1, 2], "expected a JSON object"),
    ],
)
def test_reader_names_line_and_field(tmp_path: Path, line: object, message: str) -> None:
    with pytest.raises(WorkloadError, match=None) as info:
        read_workload(_write(tmp_path, line))
    assert message in str(info.value)


def test_reader_refuses_duplicates_empty_and_missing_files(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="duplicate job_id gpt-1"):
        read_workload(_write(tmp_path, GOOD, GOOD))
    with pytest.raises(WorkloadError, match="no jobs"):
        read_workload(_write(tmp_path, ""))
    with pytest.raises(WorkloadError, match="cannot read workload"):
        read_workload(tmp_path / "absent.jsonl")


def test_a_gzipped_workload_reads_as_the_plain_one(tmp_path: Path) -> None:
    plain = _write(tmp_path, GOOD, {**GOOD, "job_id": "gpt-2", "arrival_s": 3})
    packed = tmp_path / "w.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert read_workload(packed) == read_workload(plain)
    broken = tmp_path / "bad.jsonl.gz"
    broken.write_bytes(plain.read_bytes())  # not gzip at all
    with pytest.raises(WorkloadError, match="cannot read workload"):
        read_workload(broken)
    shipped = Path(__file__).resolve().parents[2] / "bench/workloads/scatter-1500.jsonl.gz"
    assert len(read_workload(shipped)) == 1500


def test_jobs_come_back_in_arrival_order(tmp_path: Path) -> None:
    late = {**GOOD, "job_id": "late", "arrival_s": 50}
    early = {**GOOD, "job_id": "early", "arrival_s": 5}
    assert [j.job.job_id for j in read_workload(_write(tmp_path, late, early))] == [
        "early",
        "late",
    ]


def test_kalos_importer_is_valid_seeded_and_faithful(tmp_path: Path) -> None:
    out = tmp_path / "kalos.jsonl"
    assert run_from_trace(str(TRACE), str(out), 60, 7) == 0
    jobs = read_workload(out)
    assert len(jobs) == 60
    with open(TRACE, newline="") as f:
        rows = sorted(csv.DictReader(f), key=lambda r: float(r["arrival_s"]))[:60]
    by_id = {r["job_id"]: r for r in rows}
    for entry in jobs:
        row = by_id[entry.job.job_id]
        assert entry.job.parallelism.servers == max(1, math.ceil(int(row["num_gpus"]) / 8))
        assert entry.iterations >= 1 and entry.job.model is not None
        assert entry.job.compute is not None and entry.job.compute.microbatch_forward_s > 0
        assert entry.arrival_s == pytest.approx(
            float(row["arrival_s"]) - float(rows[0]["arrival_s"])
        )
    again = from_kalos_trace(TRACE, jobs=60, seed=7)
    assert [workload_job_to_dict(j) for j in again] == [workload_job_to_dict(j) for j in jobs]


def test_importer_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    assert run_from_trace(str(bad), str(tmp_path / "o.jsonl"), None, 0) == 2
    with pytest.raises(WorkloadError, match="--jobs"):
        from_kalos_trace(TRACE, jobs=0)

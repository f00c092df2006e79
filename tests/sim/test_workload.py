"""Workload files: the reader refuses bad lines clearly; the Kalos importer writes valid ones."""

from __future__ import annotations

import csv
import gzip
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from app.engine.gpu_profiles import DEFAULT_GPU, gpu_profile
from app.engine.job import PipelineSchedule
from app.engine.memory import DEFAULT_ZERO_STAGE, check_job_memory
from app.job_body import JOB_EXAMPLE
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


def test_a_workload_with_a_byte_order_mark_reads_as_without(tmp_path: Path) -> None:
    """Some editors start a UTF-8 file with a byte-order mark: line 1 was refused
    ("Unexpected UTF-8 BOM"), gzipped or not."""
    plain = read_workload(_write(tmp_path, GOOD))
    marked = tmp_path / "bom.jsonl"
    marked.write_text(json.dumps(GOOD) + "\n", encoding="utf-8-sig")
    packed = tmp_path / "bom.jsonl.gz"
    with gzip.open(packed, "wt", encoding="utf-8-sig") as f:
        f.write(json.dumps(GOOD) + "\n")
    for path in (marked, packed):
        assert [workload_job_to_dict(j) for j in read_workload(path)] == [
            workload_job_to_dict(j) for j in plain
        ]


def test_every_field_of_the_api_body_is_a_workload_field(tmp_path: Path) -> None:
    """The contract's own example body (lease, walltime, schedule, an RFC 3339
    deadline) plus arrival_s and iterations is a workload line."""
    line = {
        **JOB_EXAMPLE,
        "deadline": "2030-01-01T00:00:00Z",
        "schedule": "1f1b",
        "model": {**JOB_EXAMPLE["model"], "zero_stage": 2},
        "arrival_s": 0.5,
        "iterations": 3,
    }
    (entry,) = read_workload(_write(tmp_path, line))
    job = entry.job
    assert job.schedule is PipelineSchedule.ONE_F_ONE_B and job.walltime_s == 86400
    assert job.deadline == 1893456000.0 and job.model is not None and job.model.zero_stage == 2
    again = tmp_path / "again.jsonl"
    write_workload(again, [entry])
    (back,) = read_workload(again)
    assert back.job == job


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", ":1: not valid JSON"),
        # both were tracebacks (exit 1): Python's integer-digit limit and its recursion one
        ('{"iterations": ' + "9" * 5001 + "}", ":1: not valid JSON"),
        ("[" * 100_000 + "]" * 100_000, ":1: not valid JSON"),
        ({**GOOD, "paralellism": {}}, "paralellism: Extra inputs are not permitted"),
        ({k: v for k, v in GOOD.items() if k != "iterations"}, "missing required field iterations"),
        ({**GOOD, "iterations": 0}, "iterations must be an integer from 1 to 1,000,000,000"),
        ({**GOOD, "iterations": 2.5}, "iterations must be an integer from 1"),
        # 10**18 ran (a makespan of 9.3e18 s); 10**400 was a traceback in the scheduler
        ({**GOOD, "iterations": 10**18}, "iterations must be an integer from 1"),
        ({**GOOD, "iterations": 10**400}, "got 'a larger one'"),
        ({**GOOD, "arrival_s": -1}, "arrival_s must be a number from 0 to 3.2e+09"),
        # an arrival at 1e300 s ran in no time (iteration times vanish beside it):
        # slowdown 0, below the ideal fabric's 1
        ({**GOOD, "arrival_s": 1e300}, "arrival_s must be a number from 0 to 3.2e+09"),
        ({**GOOD, "parallelism": {"dp": "8", "pp": 1}}, "parallelism.dp: Input should be a valid"),
        ({**GOOD, "parallelism": {"dp": True, "pp": 1}}, "parallelism.dp: Input should be a valid"),
        ({**GOOD, "collective": "magic"}, "collective: Input should be 'auto'"),
        ({**GOOD, "model": {"parameters": -1}}, "model.parameters: Input should be greater than 0"),
        (
            {**GOOD, "model": {"activation_bytes": 1e307}},
            "model.activation_bytes: Input should be less than or equal to 10000000000000",
        ),
        (
            {**GOOD, "compute": {"optimizer_s": 1e308}},
            "compute.optimizer_s: Input should be less than or equal to 86400",
        ),
        ({**GOOD, "job_id": " bad id"}, "job_id: String should match pattern"),
        # the API's pattern: an id every route can address (no "/")
        ({**GOOD, "job_id": "a/b"}, "job_id: String should match pattern"),
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


def test_the_converted_kalos_trace_imports_as_its_jobs() -> None:
    """data/traces' third-party conversion of the same jobs was refused for its columns:
    arrival_time, run time num_iteration x 0.5 s, gpu_workers x gpu_per_worker GPUs."""
    converted = TRACE.with_name("converted_kalos_trace.csv")
    with open(converted, newline="") as f:
        rows = sorted(csv.DictReader(f), key=lambda r: float(r["arrival_time"]))[:30]
    jobs = from_kalos_trace(converted, jobs=30)
    assert [j.job.job_id for j in jobs] == [r["job_id"] for r in rows]
    for entry, row in zip(jobs, rows, strict=True):
        gpus = float(row["gpu_workers"]) * float(row["gpu_per_worker"])
        assert entry.job.parallelism.servers == max(1, math.ceil(gpus / 8))
        assert entry.iterations >= 1
        assert entry.arrival_s == pytest.approx(
            float(row["arrival_time"]) - float(rows[0]["arrival_time"])
        )


def test_importer_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    assert run_from_trace(str(bad), str(tmp_path / "o.jsonl"), None, 0) == 2
    with pytest.raises(WorkloadError, match="--jobs"):
        from_kalos_trace(TRACE, jobs=0)
    # a header and no rows said the columns were missing; a short row, a float() error
    header = "job_id,arrival_s,duration_s,num_gpus\n"
    bad.write_text(header)
    with pytest.raises(WorkloadError, match="holds no jobs"):
        from_kalos_trace(bad)
    bad.write_text(header + "j1,0,100\n")
    with pytest.raises(WorkloadError, match=r"bad.csv:2: no value for num_gpus"):
        from_kalos_trace(bad)
    bad.write_text(header + "j1,1e300,100,8\n")
    with pytest.raises(WorkloadError, match="arrival_s must be a number from 0 to"):
        from_kalos_trace(bad)
    # 400 digits of GPUs read as inf, and the error said "at least 1"
    bad.write_text(header + "j1,0,100," + "9" * 400 + "\n")
    with pytest.raises(WorkloadError, match="num_gpus must be a number from 1 to 1,000,000"):
        from_kalos_trace(bad)


def test_a_trace_saved_with_a_byte_order_mark_imports(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A spreadsheet's CSV starts with a byte-order mark, which became part of the
    first column's name: a good header was refused for its columns."""
    trace = tmp_path / "bom.csv"
    trace.write_text(
        "job_id,arrival_s,duration_s,num_gpus\nj1,0,3600,16\nj2,60,600,8\n", "utf-8-sig"
    )
    assert trace.read_bytes().startswith(b"\xef\xbb\xbf")
    jobs = from_kalos_trace(trace)
    assert [j.job.job_id for j in jobs] == ["j1", "j2"]
    assert [j.job.parallelism.servers for j in jobs] == [2, 1]
    # asking for more jobs than it holds writes what it holds and says so
    out = tmp_path / "w.jsonl"
    assert run_from_trace(str(trace), str(out), 5, 0) == 0
    assert len(out.read_text().splitlines()) == 2
    assert "asked for more jobs than the trace holds (2)" in capsys.readouterr().err


def test_imported_trace_jobs_fit_gpu_memory_as_megatron_ran_them() -> None:
    # The table rows are Megatron-LM runs (1F1B, activation recomputation): imported
    # without those, 57 of the README example's 200 jobs (39.1B at dp32 pp2, 76.1B at
    # dp32 pp4) needed 243-277 GiB per GPU and were refused by simulate's admission.
    gpu = gpu_profile(DEFAULT_GPU)
    for entry in from_kalos_trace(TRACE, jobs=200):
        job = entry.job
        assert job.schedule is PipelineSchedule.ONE_F_ONE_B
        check = check_job_memory(job, gpu.memory_bytes, tp=8, zero_stage=DEFAULT_ZERO_STAGE)
        assert check is not None and check.fits, (job.job_id, check and check.reasons)


def test_a_gz_workload_is_written_gzipped_and_reads_back(tmp_path: Path) -> None:
    jobs = from_kalos_trace(TRACE, jobs=5)
    path = tmp_path / "w.jsonl.gz"
    assert write_workload(path, jobs) == 5
    with gzip.open(path, "rt") as f:  # really gzip, as read_workload reads a .gz
        assert len(f.read().splitlines()) == 5
    assert [workload_job_to_dict(j) for j in read_workload(path)] == [
        workload_job_to_dict(j) for j in jobs
    ]


def test_no_workload_is_written_that_simulate_would_refuse(tmp_path: Path) -> None:
    # a trace row of 1e10 s made 1.4e9 iterations (simulate takes at most 1e9), one of
    # 1e8 GPUs a dp of 781,250 (at most 65,536): the file was written with exit 0
    huge = tmp_path / "huge.csv"
    huge.write_text("job_id,arrival_s,duration_s,num_gpus\na,0,1e10,8\n")
    out = tmp_path / "out.jsonl"
    assert run_from_trace(str(huge), str(out), None, 0) != 0
    assert not out.exists()
    entry = from_kalos_trace(TRACE, jobs=1)[0]
    with pytest.raises(WorkloadError, match="iterations must be"):
        write_workload(out, [replace(entry, iterations=2 * 10**9)])
    assert not out.exists()

"""Workload files for `lightpath simulate`, and the importer from a public cluster trace.

A workload is JSON Lines, one job per line: the body of `POST /v1/jobs` (API.md)
plus `arrival_s` (seconds from the start) and `iterations` (training iterations
the job runs). `read_workload` checks every line with the API's own body model
(`app.job_body.JobIn`: every field the service takes, unknown fields refused,
strict integers, finite numbers, the same bounds) and says which line and field
are wrong; `lease_s` is read and has nothing to do in a simulation.

`from_kalos_trace` builds a workload from the Acme Kalos trace
(data/traces/acme_kalos_completed_llm_jobs.csv, AcmeTrace, CC BY 4.0):
arrivals and GPU counts are the trace's; the parallel plan and model come from
the Megatron-LM (Narayanan et al., SC'21, Table 1) and Llama 3 (Table 4) rows
with the job's GPU count, or the nearest (seeded choice among equals); the
trace's run time becomes iterations of the job's estimated iteration time.

Imports no web, database or bus code.
"""

from __future__ import annotations

import csv
import gzip
import json
import math
import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from app.engine.job import (
    ComputeTimes,
    Job,
    ModelFacts,
    Parallelism,
    PipelineSchedule,
)
from app.job_body import JOB_ID_PATTERN, ComputeIn, JobIn, ModelIn, job_from_body

from .timing import DEFAULT_GPU_TFLOPS, ideal_iteration_estimate_s, stage_compute

# The model tables vendored in the repository's data/.
DEFAULT_TABLES = Path(__file__).resolve().parents[2] / "data" / "tables"


class WorkloadError(ValueError):
    """A workload file or trace cannot be read; the message names the line and field."""


# a century of seconds: later arrivals lose the iteration times added to them in
# float arithmetic (an arrival at 1e300 s ran in no time, slowdown 0)
MAX_ARRIVAL_S = 3.2e9
# a billion iterations: a run of 10**18 gave a makespan of 9.3e18 s, and 10**400 a
# traceback (an integer too large for a float); real runs are 10**3-10**6
MAX_ITERATIONS = 10**9
# A model table's row runs as Megatron-LM ran it: the 1F1B pipeline schedule and
# activation recomputation (the timing model's FLOPs count the recomputation), so
# the memory check the service and the simulator apply sees what such a run holds.
MEGATRON_SCHEDULE = PipelineSchedule.ONE_F_ONE_B


def check_span(entries: Sequence[WorkloadJob], cause: str) -> None:
    """WorkloadError when an arrival is past `MAX_ARRIVAL_S`, which `simulate` refuses
    (a generator writing it would hand over a file nothing reads)."""
    last = max((e.arrival_s for e in entries), default=0.0)
    if not last <= MAX_ARRIVAL_S:
        raise WorkloadError(
            f"{cause} spreads the arrivals over {last:.3g} s, past the {MAX_ARRIVAL_S:g} s "
            "a workload may span: raise --load"
        )


@dataclass(frozen=True, slots=True)
class WorkloadJob:
    """One job of a workload: the engine's Job, when it arrives, how long it trains."""

    job: Job
    arrival_s: float
    iterations: int


# --------------------------------------------------------------------------- reader


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(float(value))  # type: ignore[arg-type]


def _errors(exc: ValidationError) -> str:
    """pydantic's errors as `field: message; ...` (at most five)."""
    parts = []
    for err in exc.errors()[:5]:
        field = ".".join(str(x) for x in err.get("loc", ())) or "body"
        parts.append(f"{field}: {err.get('msg', '')}")
    return "; ".join(parts)


def parse_workload_job(data: object, where: str = "job", order: int = 0) -> WorkloadJob:
    """One workload entry (a decoded JSON object) as a WorkloadJob; WorkloadError if invalid.

    The job is the `POST /v1/jobs` body, validated by the API's own model; the
    entry adds `arrival_s` and `iterations`.
    """
    if not isinstance(data, dict):
        raise WorkloadError(f"{where}: expected a JSON object, got {type(data).__name__}")
    body = dict(data)
    for required in ("arrival_s", "iterations"):
        if required not in body:
            raise WorkloadError(f"{where}: missing required field {required}")
    arrival = body.pop("arrival_s")
    iterations = body.pop("iterations")
    job_id = body.get("job_id")
    if isinstance(job_id, str):
        where = f"{where} ({job_id})"
    try:
        # from JSON text, as the API reads a body (strict numbers, RFC 3339 deadlines)
        valid = JobIn.model_validate_json(json.dumps(body, allow_nan=True))
    except ValidationError as exc:
        raise WorkloadError(f"{where}: {_errors(exc)}") from None
    if not _is_number(arrival) or not 0 <= arrival <= MAX_ARRIVAL_S:
        raise WorkloadError(
            f"{where}: arrival_s must be a number from 0 to {MAX_ARRIVAL_S:g}, got {arrival!r}"
        )
    if not _is_int(iterations) or not 1 <= iterations <= MAX_ITERATIONS:
        shown = iterations if not _is_int(iterations) or iterations < 10**20 else "a larger one"
        raise WorkloadError(
            f"{where}: iterations must be an integer from 1 to {MAX_ITERATIONS:,}, got {shown!r}"
        )
    job = job_from_body(valid.job_id, valid.stored_body(), order)
    return WorkloadJob(job, float(arrival), int(iterations))


def read_workload(path: str | Path) -> list[WorkloadJob]:
    """A JSON Lines workload's jobs in arrival order (stable); WorkloadError if invalid.

    A path ending in `.gz` is read through gzip."""
    p = Path(path)
    try:
        # utf-8-sig: a byte-order mark (as some editors write) is not part of line 1
        if p.suffix == ".gz":
            with gzip.open(p, "rt", encoding="utf-8-sig") as f:
                text = f.read()
        else:
            text = p.read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise WorkloadError(f"cannot read workload {p}: {exc.strerror or exc}") from exc
    except (EOFError, UnicodeDecodeError) as exc:  # a truncated gzip, or not text
        raise WorkloadError(f"cannot read workload {p}: {exc}") from exc
    jobs: list[WorkloadJob] = []
    seen: set[str] = set()
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"{p}:{number}: not valid JSON ({exc.msg})") from exc
        except (ValueError, RecursionError) as exc:
            # an integer of more than 4300 digits, or arrays nested past the recursion limit
            raise WorkloadError(f"{p}:{number}: not valid JSON ({exc})") from None
        entry = parse_workload_job(data, f"{p}:{number}", order=len(jobs))
        if entry.job.job_id in seen:
            raise WorkloadError(f"{p}:{number}: duplicate job_id {entry.job.job_id}")
        seen.add(entry.job.job_id)
        jobs.append(entry)
    if not jobs:
        raise WorkloadError(f"{p}: the workload has no jobs")
    ordered = sorted(jobs, key=lambda w: (w.arrival_s, w.job.submitted_order))
    return ordered


def workload_job_to_dict(entry: WorkloadJob) -> dict[str, Any]:
    """The JSON Lines object of one job (POST /v1/jobs body + arrival_s + iterations)."""
    job = entry.job
    out: dict[str, Any] = {
        "job_id": job.job_id,
        "parallelism": {
            "dp": job.parallelism.dp,
            "pp": job.parallelism.pp,
            "ep": job.parallelism.ep,
        },
    }
    if job.model is not None:
        model = {f: getattr(job.model, f) for f in ModelIn.model_fields}
        out["model"] = {k: v for k, v in model.items() if v is not None}
    if job.compute is not None:
        compute = {f: getattr(job.compute, f) for f in ComputeIn.model_fields}
        out["compute"] = {k: v for k, v in compute.items() if v is not None}
    out["collective"] = job.collective.value
    out["priority"] = job.priority
    out["deadline"] = job.deadline
    if job.walltime_s is not None:
        out["walltime_s"] = job.walltime_s
    if job.schedule is not PipelineSchedule.GPIPE:
        out["schedule"] = job.schedule.value
    out["arrival_s"] = entry.arrival_s
    out["iterations"] = entry.iterations
    return out


def write_workload(path: str | Path, jobs: Iterable[WorkloadJob]) -> int:
    """Write jobs as JSON Lines (gzip'd for a path ending in `.gz`, as `read_workload`
    reads it); returns how many were written.

    Every entry is checked as `read_workload` will read it, so no file is written that
    `simulate` refuses (WorkloadError naming the first entry that would be)."""
    lines = []
    for number, entry in enumerate(jobs, 1):
        data = workload_job_to_dict(entry)
        parse_workload_job(data, f"job {number}", number)
        lines.append(json.dumps(data, separators=(",", ":")))
    text = "".join(line + "\n" for line in lines)
    p = Path(path)
    if p.suffix == ".gz":
        with gzip.open(p, "wt") as f:
            f.write(text)
    else:
        p.write_text(text)
    return len(lines)


# ------------------------------------------------------------------------- importer


@dataclass(frozen=True, slots=True)
class ModelRow:
    """One published configuration: model size, parallel plan and achieved throughput."""

    source: str
    gpus: int
    parameters: float
    hidden_size: int
    num_layers: int
    seq_len: int
    pp: int
    global_batch: int  # sequences per iteration
    tflops_per_gpu: float


def _num(text: str) -> float:
    return float(text.strip().rstrip("%").replace(",", ""))


def load_model_rows(tables_dir: str | Path = DEFAULT_TABLES) -> list[ModelRow]:
    """Rows of the Megatron-LM SC'21 Table 1 and Llama 3 405B Table 4 (data/tables)."""
    base = Path(tables_dir)
    rows: list[ModelRow] = []
    try:
        with open(base / "megatron_sc21_table1.csv", newline="") as f:
            for r in csv.DictReader(f):
                rows.append(
                    ModelRow(
                        "megatron-sc21",
                        int(_num(r["num_gpus"])),
                        _num(r["params_billion"]) * 1e9,
                        int(_num(r["hidden_size"])),
                        int(_num(r["num_layers"])),
                        int(_num(r["seq_len"])),
                        int(_num(r["pipeline_parallel"])),
                        int(_num(r["global_batch_size"])),
                        _num(r["achieved_tflops_per_gpu"]),
                    )
                )
        with open(base / "llama3_405b_table4.csv", newline="") as f:
            for r in csv.DictReader(f):
                if int(_num(r["cp"])) != 1:
                    continue  # context parallelism is not a degree Lightpath schedules
                dp = int(_num(r["dp"]))
                rows.append(
                    ModelRow(
                        "llama3-405b",
                        int(_num(r["gpus"])),
                        405e9,
                        16384,
                        126,
                        int(_num(r["seq_len"])),
                        int(_num(r["pp"])),
                        dp * int(_num(r["batch_size_per_dp"])),
                        _num(r["tflops_per_gpu"]),
                    )
                )
    except (OSError, KeyError, ValueError) as exc:
        raise WorkloadError(f"model tables under {base}: {exc}") from exc
    return rows


def _pick_row(rows: Sequence[ModelRow], gpus: int, rng: random.Random) -> ModelRow:
    """A row with exactly `gpus` GPUs, else the nearest on a log scale; seeded among equals."""
    best = min(abs(math.log(r.gpus / gpus)) for r in rows)
    candidates = [r for r in rows if abs(math.log(r.gpus / gpus)) <= best + 1e-12]
    return rng.choice(candidates)


def plan_for(row: ModelRow, servers: int) -> tuple[int, int, int]:
    """(dp, pp, microbatches) for `servers` servers: the row's PP cut to a divisor of servers."""
    pp = max(d for d in range(1, min(row.pp, servers) + 1) if servers % d == 0)
    dp = servers // pp
    # The row's global batch of sequences split over dp pipelines, micro-batch size 1;
    # at least pp micro-batches keep the GPipe pipeline full, at most 256 per iteration.
    microbatches = min(256, max(pp, round(row.global_batch / dp)))
    return dp, pp, microbatches


def job_from_row(job_id: str, row: ModelRow, servers: int, order: int) -> Job:
    """A Job for `servers` servers with the row's model and achieved throughput."""
    dp, pp, microbatches = plan_for(row, servers)
    model = ModelFacts(
        parameters=row.parameters,
        bytes_per_parameter=2.0,
        activation_bytes=float(row.hidden_size * row.seq_len * 2),  # bf16, micro-batch of 1
        microbatches=microbatches,
        hidden_size=row.hidden_size,
        num_layers=row.num_layers,
        seq_len=row.seq_len,
        microbatch_size=1,
        activation_checkpointing=True,
    )
    shell = Job(
        job_id,
        Parallelism(dp=dp, pp=pp, ep=1),
        model,
        submitted_order=order,
        schedule=MEGATRON_SCHEDULE,
    )
    forward, backward, optimizer = stage_compute(shell, tflops_per_gpu=row.tflops_per_gpu)
    compute = ComputeTimes(round(forward, 6), round(backward, 6), round(optimizer, 6))
    return replace(shell, compute=compute)


def read_trace_rows(path: Path) -> list[dict[str, str]]:
    """A CSV trace's rows; WorkloadError when it cannot be read as CSV text."""
    try:
        # utf-8-sig: a trace saved by a spreadsheet starts with a byte-order mark, which
        # read as part of the first column's name ("expected columns" for a good header)
        with open(path, newline="", encoding="utf-8-sig") as f:
            return list(csv.DictReader(f))
    except OSError as exc:
        raise WorkloadError(f"cannot read trace {path}: {exc.strerror or exc}") from exc
    except (UnicodeDecodeError, csv.Error) as exc:
        raise WorkloadError(f"cannot read trace {path}: not a CSV text file ({exc})") from exc


# a trace job's GPUs: past any cluster's (seed-15k has 15,000), a typo rather than a job
MAX_TRACE_GPUS = 1_000_000

# the third-party conversion of the same Kalos jobs (data/traces/converted_kalos_trace.csv)
_CONVERTED_COLUMNS = {"job_id", "arrival_time", "num_iteration", "gpu_workers", "gpu_per_worker"}
_CONVERTED_ITERATION_S = 0.5  # its run time is num_iteration x 0.5 s exactly (data/README)


def _normalised_kalos_row(row: dict[str, str]) -> dict[str, str]:
    """A row of the converted Kalos trace in the normalised columns; others as they are."""
    if not _CONVERTED_COLUMNS <= set(row) or "arrival_s" in row:
        return row
    try:
        duration = float(row["num_iteration"]) * _CONVERTED_ITERATION_S
        gpus = float(row["gpu_workers"]) * float(row["gpu_per_worker"])
    except (TypeError, ValueError):
        return row  # reported by the caller, which finds the normalised columns missing
    return {
        "job_id": row["job_id"],
        "arrival_s": row["arrival_time"],
        "duration_s": repr(duration),
        "num_gpus": repr(gpus),
    }


def from_kalos_trace(
    trace_path: str | Path,
    *,
    jobs: int | None = None,
    seed: int = 0,
    tables_dir: str | Path = DEFAULT_TABLES,
    gpus_per_server: int = 8,
) -> list[WorkloadJob]:
    """Workload jobs from the Kalos trace, in arrival order, the first `jobs` of them."""
    rows = load_model_rows(tables_dir)
    rng = random.Random(seed)
    path = Path(trace_path)
    records = [_normalised_kalos_row(r) for r in read_trace_rows(path)]
    needed = {"job_id", "arrival_s", "duration_s", "num_gpus"}
    if not records:
        raise WorkloadError(f"{path}: the trace holds no jobs (a header and no rows)")
    if not needed <= set(records[0]):
        raise WorkloadError(f"{path}: expected columns {', '.join(sorted(needed))}")
    parsed = []
    seen: set[str] = set()
    for number, r in enumerate(records, 2):
        where = f"{path}:{number}"
        trace_id = r["job_id"] or ""
        # every row becomes a workload line `simulate` reads back: the API's id rules
        if not re.fullmatch(JOB_ID_PATTERN, trace_id):
            raise WorkloadError(f"{where}: job_id {trace_id!r} is not a valid job id")
        if trace_id in seen:
            raise WorkloadError(f"{where}: duplicate job_id {trace_id}")
        seen.add(trace_id)
        missing = [c for c in sorted(needed) if not r.get(c)]
        if missing:
            raise WorkloadError(f"{where}: no value for {', '.join(missing)}")
        try:
            arrival, duration = float(r["arrival_s"]), float(r["duration_s"])
            gpus = float(r["num_gpus"])
        except (TypeError, ValueError) as exc:
            raise WorkloadError(f"{where}: {exc}") from exc
        if not 0 <= arrival <= MAX_ARRIVAL_S:
            raise WorkloadError(f"{where}: arrival_s must be a number from 0 to {MAX_ARRIVAL_S:g}")
        if not (math.isfinite(duration) and duration > 0):
            raise WorkloadError(f"{where}: duration_s must be a finite number > 0")
        if not (math.isfinite(gpus) and 1 <= gpus <= MAX_TRACE_GPUS):
            # (a number of 400 digits reads as inf: "at least 1" did not say what was wrong)
            raise WorkloadError(f"{where}: num_gpus must be a number from 1 to {MAX_TRACE_GPUS:,}")
        parsed.append((arrival, number, trace_id, duration, int(gpus)))
    parsed.sort()
    if jobs is not None:
        if jobs < 1:
            raise WorkloadError("--jobs must be at least 1")
        parsed = parsed[:jobs]
    start = parsed[0][0] if parsed else 0.0
    out = []
    for order, (arrival, _, trace_id, duration, gpus) in enumerate(parsed):
        servers = max(1, math.ceil(gpus / gpus_per_server))
        row = _pick_row(rows, servers * gpus_per_server, rng)
        job = job_from_row(trace_id, row, servers, order)
        iteration_s = ideal_iteration_estimate_s(job)
        iterations = max(1, round(duration / iteration_s))
        out.append(WorkloadJob(job, arrival - start, iterations))
    return out


__all__ = [
    "DEFAULT_GPU_TFLOPS",
    "MAX_ARRIVAL_S",
    "ModelRow",
    "WorkloadError",
    "WorkloadJob",
    "from_kalos_trace",
    "job_from_row",
    "load_model_rows",
    "parse_workload_job",
    "plan_for",
    "read_workload",
    "workload_job_to_dict",
    "write_workload",
]

"""Workload files for `lightpath simulate`, and the importer from a public cluster trace.

A workload is JSON Lines, one job per line: the body of `POST /v1/jobs` (API.md)
plus `arrival_s` (seconds from the start) and `iterations` (training iterations
the job runs). `read_workload` checks every line the way the API checks a body
(unknown fields refused, strict integers, finite numbers) and says which line
and field are wrong.

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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.engine.job import (
    MAX_ACTIVATION_BYTES,
    MAX_BYTES_PER_PARAMETER,
    MAX_COMPUTE_S,
    MAX_PARAMETERS,
    Collective,
    ComputeTimes,
    Job,
    ModelFacts,
    Parallelism,
)

from .timing import DEFAULT_GPU_TFLOPS, ideal_iteration_estimate_s, stage_compute

JOB_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@/+-]{0,199}$")
_TOP_FIELDS = {
    "job_id",
    "parallelism",
    "model",
    "compute",
    "collective",
    "priority",
    "deadline",
    "arrival_s",
    "iterations",
}
_PAR_FIELDS = {"dp", "pp", "ep"}
_MODEL_INT = {"microbatches", "hidden_size", "num_layers", "seq_len", "microbatch_size"}
_MODEL_FLOAT = {"parameters", "bytes_per_parameter", "activation_bytes"}
_MODEL_OTHER = {"optimizer", "activation_checkpointing"}
_COMPUTE_FIELDS = {"microbatch_forward_s", "microbatch_backward_s", "optimizer_s"}

# The model tables vendored in the repository's data/.
DEFAULT_TABLES = Path(__file__).resolve().parents[2] / "data" / "tables"


class WorkloadError(ValueError):
    """A workload file or trace cannot be read; the message names the line and field."""


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


def _unknown(where: str, data: Mapping[str, Any], known: set[str]) -> None:
    extra = sorted(set(data) - known)
    if extra:
        raise WorkloadError(f"{where}: unknown field(s) {', '.join(extra)}")


def _int_field(
    where: str, data: Mapping[str, Any], name: str, low: int, default: int | None
) -> int | None:
    value = data.get(name, default)
    if value is None:
        return None
    if not _is_int(value) or value < low:
        raise WorkloadError(f"{where}: {name} must be an integer >= {low}, got {value!r}")
    return int(value)


_FLOAT_MAX = {
    "parameters": MAX_PARAMETERS,
    "bytes_per_parameter": MAX_BYTES_PER_PARAMETER,
    "activation_bytes": MAX_ACTIVATION_BYTES,
    "microbatch_forward_s": MAX_COMPUTE_S,
    "microbatch_backward_s": MAX_COMPUTE_S,
    "optimizer_s": MAX_COMPUTE_S,
}


def _float_field(where: str, data: Mapping[str, Any], name: str, positive: bool) -> float | None:
    value = data.get(name)
    if value is None:
        return None
    if not _is_number(value) or value < 0 or (positive and value == 0):
        kind = "a positive" if positive else "a non-negative"
        raise WorkloadError(f"{where}: {name} must be {kind} finite number, got {value!r}")
    if value > _FLOAT_MAX[name]:
        raise WorkloadError(f"{where}: {name} must be at most {_FLOAT_MAX[name]:g}, got {value!r}")
    return float(value)


def _object(where: str, data: Mapping[str, Any], name: str) -> Mapping[str, Any] | None:
    value = data.get(name)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise WorkloadError(f"{where}: {name} must be an object")
    return value


def parse_workload_job(data: object, where: str = "job", order: int = 0) -> WorkloadJob:
    """One workload entry (a decoded JSON object) as a WorkloadJob; WorkloadError if invalid."""
    if not isinstance(data, dict):
        raise WorkloadError(f"{where}: expected a JSON object, got {type(data).__name__}")
    _unknown(where, data, _TOP_FIELDS)
    for required in ("job_id", "parallelism", "arrival_s", "iterations"):
        if required not in data:
            raise WorkloadError(f"{where}: missing required field {required}")
    job_id = data["job_id"]
    if not isinstance(job_id, str) or not JOB_ID_PATTERN.match(job_id):
        raise WorkloadError(f"{where}: job_id {job_id!r} is not a valid job id")
    where = f"{where} ({job_id})"
    par = _object(where, data, "parallelism")
    if par is None:
        raise WorkloadError(f"{where}: parallelism must be an object")
    _unknown(f"{where}: parallelism", par, _PAR_FIELDS)
    if "dp" not in par or "pp" not in par:
        raise WorkloadError(f"{where}: parallelism needs dp and pp")
    dp = _int_field(where, par, "dp", 1, None)
    pp = _int_field(where, par, "pp", 1, None)
    ep = _int_field(where, par, "ep", 1, 1)
    assert dp is not None and pp is not None and ep is not None
    model = None
    raw_model = _object(where, data, "model")
    if raw_model is not None:
        _unknown(f"{where}: model", raw_model, _MODEL_INT | _MODEL_FLOAT | _MODEL_OTHER)
        ints = {k: _int_field(where, raw_model, k, 1, None) for k in sorted(_MODEL_INT)}
        floats: dict[str, Any] = {
            k: _float_field(where, raw_model, k, positive=k != "activation_bytes")
            for k in sorted(_MODEL_FLOAT)
        }
        optimizer = raw_model.get("optimizer")
        if optimizer not in (None, "adam", "sgd"):
            raise WorkloadError(f"{where}: model.optimizer must be adam or sgd")
        ckpt = raw_model.get("activation_checkpointing")
        if ckpt is not None and not isinstance(ckpt, bool):
            raise WorkloadError(f"{where}: model.activation_checkpointing must be a boolean")
        model = ModelFacts(**ints, **floats, optimizer=optimizer, activation_checkpointing=ckpt)
    compute = None
    raw_compute = _object(where, data, "compute")
    if raw_compute is not None:
        _unknown(f"{where}: compute", raw_compute, _COMPUTE_FIELDS)
        compute = ComputeTimes(
            **{k: _float_field(where, raw_compute, k, False) for k in sorted(_COMPUTE_FIELDS)}
        )
    try:
        collective = Collective(data.get("collective", "auto"))
    except ValueError:
        known = "|".join(c.value for c in Collective)
        raise WorkloadError(f"{where}: collective must be one of {known}") from None
    priority = data.get("priority", 0)
    if not _is_int(priority) or not -1000 <= priority <= 1000:
        raise WorkloadError(f"{where}: priority must be an integer in [-1000, 1000]")
    deadline = data.get("deadline")
    if deadline is not None and not _is_number(deadline):
        raise WorkloadError(f"{where}: deadline must be a finite number (epoch seconds) or null")
    arrival = data["arrival_s"]
    if not _is_number(arrival) or arrival < 0:
        raise WorkloadError(f"{where}: arrival_s must be a finite number >= 0, got {arrival!r}")
    iterations = data["iterations"]
    if not _is_int(iterations) or iterations < 1:
        raise WorkloadError(f"{where}: iterations must be an integer >= 1, got {iterations!r}")
    job = Job(
        job_id,
        Parallelism(dp=dp, pp=pp, ep=ep),
        model,
        compute,
        collective,
        int(priority),
        None if deadline is None else float(deadline),
        submitted_order=order,
    )
    return WorkloadJob(job, float(arrival), int(iterations))


def read_workload(path: str | Path) -> list[WorkloadJob]:
    """A JSON Lines workload's jobs in arrival order (stable); WorkloadError if invalid.

    A path ending in `.gz` is read through gzip."""
    p = Path(path)
    try:
        if p.suffix == ".gz":
            with gzip.open(p, "rt") as f:
                text = f.read()
        else:
            text = p.read_text()
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
        out["model"] = {
            k: getattr(job.model, k)
            for k in sorted(_MODEL_INT | _MODEL_FLOAT | _MODEL_OTHER)
            if getattr(job.model, k) is not None
        }
    if job.compute is not None:
        out["compute"] = {
            k: getattr(job.compute, k)
            for k in sorted(_COMPUTE_FIELDS)
            if getattr(job.compute, k) is not None
        }
    out["collective"] = job.collective.value
    out["priority"] = job.priority
    out["deadline"] = job.deadline
    out["arrival_s"] = entry.arrival_s
    out["iterations"] = entry.iterations
    return out


def write_workload(path: str | Path, jobs: Iterable[WorkloadJob]) -> int:
    """Write jobs as JSON Lines; returns how many were written."""
    lines = [json.dumps(workload_job_to_dict(j), separators=(",", ":")) for j in jobs]
    Path(path).write_text("".join(line + "\n" for line in lines))
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
    )
    shell = Job(job_id, Parallelism(dp=dp, pp=pp, ep=1), model, submitted_order=order)
    forward, backward, optimizer = stage_compute(shell, tflops_per_gpu=row.tflops_per_gpu)
    compute = ComputeTimes(round(forward, 6), round(backward, 6), round(optimizer, 6))
    return Job(job_id, shell.parallelism, model, compute, submitted_order=order)


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
    try:
        with open(path, newline="") as f:
            records = list(csv.DictReader(f))
    except OSError as exc:
        raise WorkloadError(f"cannot read trace {path}: {exc.strerror or exc}") from exc
    needed = {"job_id", "arrival_s", "duration_s", "num_gpus"}
    if not records or not needed <= set(records[0]):
        raise WorkloadError(f"{path}: expected columns {', '.join(sorted(needed))}")
    parsed = []
    for number, r in enumerate(records, 2):
        try:
            parsed.append(
                (
                    float(r["arrival_s"]),
                    number,
                    r["job_id"],
                    float(r["duration_s"]),
                    int(float(r["num_gpus"])),
                )
            )
        except ValueError as exc:
            raise WorkloadError(f"{path}:{number}: {exc}") from exc
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

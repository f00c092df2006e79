"""Synthetic workload families for the evaluation (`lightpath workload generate`).

Every family draws (GPU count, run time) pairs from the pre-training jobs of
the Acme Kalos trace that ran at least `MIN_DURATION_S` (data/traces,
CC BY 4.0), and Poisson arrivals whose rate makes the offered load `load`
times the cluster: rate = load x servers / E[servers x run time]. A job's
iterations are its run time over its ideal iteration estimate.

- `dense`: GPT configurations of Megatron-LM SC'21 Table 1 and Llama 3 405B
  (data/tables), the row nearest the job's GPU count, micro-batches from the
  row's global batch (bf16, recomputation).
- `bigspan`: the same models at twice the trace's largest sizes (jobs of 512
  GPUs or more, doubled): most jobs span 2-4 pods.
- `moe`: public MoE shapes (Mixtral 8x7B and 8x22B: hidden size, layers, total
  parameters), expert parallelism over 2-8 servers.
- `comm-heavy`: small and mid Table 1 models with pipeline depth 1-2, small
  per-replica batches and fp32 gradients; meant for fast GPUs
  (`lightpath simulate --gpu b200`), where DP is 10-40% of an iteration.
- `fleet`: the design notes' scale, about 300 jobs running at once on seed-15k:
  GPU counts and run times of the trace's fine-tuning and other jobs that ran
  at least `MIN_DURATION_S` (1-64 GPUs, 10 minutes to 2 days), drawn
  independently (in the trace its 64-GPU jobs are also its longest; drawn as
  pairs they leave about 230 jobs running), with the `comm-heavy`
  configurations (B200). Fragmentation spreads many of them over several pods,
  so the fabric carries hundreds of small cross-pod rings.
- `fleet-stress`: the same configurations, but not from the trace: servers drawn
  from (1, 2, 4, 4, 8, 8, 16, 16) and run times uniform in 1-6 hours. Fewer
  one-server jobs fill the holes others leave, so fragmentation scatters more
  jobs over pods and their circuits fill the pods' uplinks: a stress test of
  where a job may span, not a measured workload.

Deterministic for a seed. Imports no web, database or bus code.
"""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Sequence
from pathlib import Path

from app.engine.cluster import Cluster
from app.engine.gpu_profiles import gpu_profile
from app.engine.job import Job, ModelFacts, Parallelism
from app.engine.memory import DEFAULT_ZERO_STAGE
from app.engine.placement import refusals

from .timing import ideal_iteration_estimate_s
from .workload import (
    DEFAULT_TABLES,
    MEGATRON_SCHEDULE,
    ModelRow,
    WorkloadError,
    WorkloadJob,
    check_span,
    load_model_rows,
    read_trace_rows,
)

FAMILIES = ("dense", "bigspan", "moe", "comm-heavy", "fleet", "fleet-stress")
DEFAULT_TRACE = (
    Path(__file__).resolve().parents[2] / "data" / "traces" / "acme_kalos_completed_llm_jobs.csv"
)
MIN_DURATION_S = 600.0
MAX_DURATION_S = 48 * 3600.0
# the GPU a family is meant for
FAMILY_GPU = {"comm-heavy": "b200", "fleet": "b200", "fleet-stress": "b200"}
STRESS_SERVERS = (1, 2, 4, 4, 8, 8, 16, 16)
STRESS_RUN_S = (3600.0, 6 * 3600.0)
# draws for a job the cluster would refuse before the family is said not to fit it
REDRAWS = 100
# Every family's jobs run as Megatron-LM runs them: `workload.MEGATRON_SCHEDULE`,
# with activation recomputation.

# (name, hidden size, layers, total parameters, experts)
MOE_SHAPES = (
    ("mixtral-8x7b", 4096, 32, 46.7e9, 8),
    ("mixtral-8x22b", 6144, 56, 141e9, 8),
)


def _trace_jobs(trace: Path, pretrain: bool = True) -> list[tuple[int, float]]:
    rows = read_trace_rows(trace)
    out = []
    for r in rows:
        if (r.get("job_type") == "Pretrain") != pretrain:
            continue
        duration = float(r["duration_s"])
        if duration >= MIN_DURATION_S:
            out.append((int(float(r["num_gpus"])), min(duration, MAX_DURATION_S)))
    if not out:
        kind = "pre-training" if pretrain else "fine-tuning or other"
        raise WorkloadError(f"{trace}: no {kind} jobs of {MIN_DURATION_S:.0f} s or more")
    return out


def _nearest(rows: Sequence[ModelRow], gpus: int, rng: random.Random) -> ModelRow:
    best = min(abs(math.log(r.gpus / gpus)) for r in rows)
    return rng.choice([r for r in rows if abs(math.log(r.gpus / gpus)) <= best + 1e-12])


def _pp_for(servers: int, want: int) -> int:
    return max(d for d in range(1, min(want, servers) + 1) if servers % d == 0)


def _dense_job(job_id: str, row: ModelRow, servers: int) -> Job:
    pp = _pp_for(servers, row.pp)
    dp = servers // pp
    m = max(pp, round(row.global_batch / dp))
    model = ModelFacts(
        parameters=row.parameters,
        bytes_per_parameter=2.0,
        activation_bytes=float(row.hidden_size * row.seq_len * 2),
        microbatches=m,
        hidden_size=row.hidden_size,
        num_layers=row.num_layers,
        seq_len=row.seq_len,
        microbatch_size=1,
        activation_checkpointing=True,
    )
    return Job(job_id, Parallelism(dp=dp, pp=pp), model, schedule=MEGATRON_SCHEDULE)


def _moe_job(job_id: str, servers: int, rng: random.Random) -> Job:
    name, h, layers, params, experts = rng.choice(MOE_SHAPES)
    ep = next(e for e in (8, 4, 2, 1) if servers % e == 0 and e <= experts)
    rest = servers // ep
    pp = _pp_for(rest, 4)
    dp = rest // pp
    seq = 4096
    model = ModelFacts(
        parameters=params,
        bytes_per_parameter=2.0,
        activation_bytes=float(h * seq * 2),
        microbatches=max(pp, round(1024 / (dp * ep))),
        hidden_size=h,
        num_layers=layers,
        seq_len=seq,
        microbatch_size=1,
        activation_checkpointing=True,
    )
    return Job(job_id, Parallelism(dp=dp, pp=pp, ep=ep), model, schedule=MEGATRON_SCHEDULE)


def _comm_heavy_job(job_id: str, rows: Sequence[ModelRow], servers: int, rng: random.Random) -> Job:
    small = [r for r in rows if r.source == "megatron-sc21" and r.parameters <= 40e9]
    row = rng.choice(small)
    pp = _pp_for(servers, rng.choice((1, 2)))
    dp = servers // pp
    model = ModelFacts(
        parameters=row.parameters,
        bytes_per_parameter=4.0,  # fp32 gradients
        activation_bytes=float(row.hidden_size * row.seq_len * 2 * 2),  # bf16, 2 sequences
        microbatches=max(pp, rng.choice((4, 8, 16))),
        hidden_size=row.hidden_size,
        num_layers=row.num_layers,
        seq_len=row.seq_len,
        microbatch_size=2,
        activation_checkpointing=True,
    )
    return Job(job_id, Parallelism(dp=dp, pp=pp), model, schedule=MEGATRON_SCHEDULE)


def generate(
    family: str,
    cluster: Cluster,
    *,
    load: float,
    jobs: int,
    seed: int,
    trace: Path = DEFAULT_TRACE,
    tables_dir: Path = DEFAULT_TABLES,
) -> list[WorkloadJob]:
    """`jobs` jobs of `family` arriving at offered load `load` on `cluster`, seeded."""
    if family not in FAMILIES:
        raise WorkloadError(f"unknown family {family!r}; known: {', '.join(FAMILIES)}")
    if not load > 0 or not math.isfinite(load):
        raise WorkloadError("--load must be a positive number")
    if jobs < 1:
        raise WorkloadError("--jobs must be at least 1")
    rng = random.Random(f"{family}:{seed}")
    pool = _trace_jobs(trace, pretrain=family != "fleet")
    if family == "bigspan":
        pool = [(g * 2, d) for g, d in pool if g >= 512]
    gpus_per_server = cluster.gpus_per_server
    # a job spans pods of one joined set at most (`Cluster.joined_pod_sets`): on a file
    # of two OXC islands of 16 servers, 39 of 40 jobs drawn for the whole cluster's 32
    # could never run
    pods = cluster.pods_by_id
    limit = max(sum(len(pods[p].servers) for p in s) for s in cluster.joined_pod_sets)
    pool = [(g, d) for g, d in pool if math.ceil(g / gpus_per_server) <= limit]
    if not pool and family != "fleet-stress":
        raise WorkloadError(
            f"no {family} job of the trace fits this cluster ({limit} servers of "
            f"{gpus_per_server} GPUs): use a larger cluster or another family"
        )
    rows = load_model_rows(tables_dir)
    gpu = FAMILY_GPU.get(family, cluster.gpu_model)

    def draw() -> tuple[float, float]:
        if family == "fleet":  # sizes and run times drawn independently (module doc)
            return rng.choice(pool)[0], rng.choice(pool)[1]
        if family == "fleet-stress":
            servers = min(rng.choice(STRESS_SERVERS), limit)
            return servers * gpus_per_server, rng.uniform(*STRESS_RUN_S)
        return rng.choice(pool)

    def build(job_id: str, gpus: float) -> Job:
        servers = max(1, math.ceil(gpus / gpus_per_server))
        if family == "moe":
            return _moe_job(job_id, servers, rng)
        if family in ("comm-heavy", "fleet", "fleet-stress"):
            return _comm_heavy_job(job_id, rows, servers, rng)
        return _dense_job(job_id, _nearest(rows, servers * gpus_per_server, rng), servers)

    drawn = [draw() for _ in range(jobs)]
    mean_work = sum(math.ceil(g / gpus_per_server) * d for g, d in drawn) / jobs
    rate = load * cluster.server_count / mean_work  # arrivals per second
    memory = gpu_profile(gpu).memory_bytes
    t = 0.0
    out = []
    for i, (gpus, duration) in enumerate(drawn):
        job_id = f"{family}-{seed}-{i}"
        job = build(job_id, gpus)
        # a job `simulate` would refuse on this cluster (an EP group wider than its pods,
        # too few uplinks to join its pods, GPU memory) is drawn again: on a file of
        # 4-server pods 19 of 20 moe jobs were refused (none is on the presets)
        redraws = 0
        while reasons := refusals(cluster, job, memory, DEFAULT_ZERO_STAGE):
            redraws += 1
            if redraws > REDRAWS:
                raise WorkloadError(
                    f"no {family} job drawn {REDRAWS} times fits this cluster "
                    f"({reasons[0]}): use a larger cluster or another family"
                )
            gpus, duration = draw()
            job = build(job_id, gpus)
        iteration = ideal_iteration_estimate_s(job, cluster.server_gbps, gpu=gpu)
        out.append(WorkloadJob(job, round(t, 3), max(1, round(duration / iteration))))
        t += rng.expovariate(rate)
    check_span(out, f"--load {load:g}")
    return out


def jitter(workload: Sequence[WorkloadJob], seed: int) -> list[WorkloadJob]:
    """The same jobs with arrivals and iteration counts jittered for `seed` (0: unchanged).

    Arrivals move by up to half the mean inter-arrival time; each job's work is
    scaled by the mean of 20 consecutive iteration times of a real job's worker
    (Alibaba PAI 2020, data/traces/iteration_jitter), over that job's median.
    """
    if seed == 0 or not workload:
        return list(workload)
    rng = random.Random(f"jitter:{seed}")
    samples = _pai_samples()
    span = max(w.arrival_s for w in workload) - min(w.arrival_s for w in workload)
    gap = span / max(1, len(workload) - 1)
    out = []
    for w in workload:
        arrival = max(0.0, w.arrival_s + rng.uniform(-gap / 2, gap / 2))
        series = rng.choice(samples)
        k = rng.randrange(0, max(1, len(series) - 20))
        window = series[k : k + 20]
        factor = sum(window) / len(window)
        out.append(WorkloadJob(w.job, round(arrival, 3), max(1, round(w.iterations * factor))))
    return sorted(out, key=lambda w: (w.arrival_s, w.job.job_id))


_PAI: list[list[float]] = []


def _pai_samples() -> list[list[float]]:
    """Per-job, per-iteration time over that job's median (PAI 2020 iteration jitter)."""
    if _PAI:
        return _PAI
    base = DEFAULT_TRACE.parent / "iteration_jitter"
    for path in sorted(base.glob("job_*_norm.csv")):
        with open(path, newline="") as f:
            values = [float(r["batch_time_norm"]) for r in csv.DictReader(f)]
        values = [v for v in values if v > 0]
        if not values:
            continue
        median = sorted(values)[len(values) // 2]
        _PAI.append([v / median for v in values])
    if not _PAI:
        _PAI.append([1.0])
    return _PAI


__all__ = ["FAMILIES", "FAMILY_GPU", "generate", "jitter"]

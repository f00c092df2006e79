"""Compute and pipeline timing of one job's iteration (GPipe), independent of the fabric.

Per iteration every pipeline runs m micro-batches forward then backward through
p stages (GPipe), then each stage's DP group AllReduces its gradients, then the
optimizer steps. With f, b the forward/backward compute of one micro-batch on
one stage (EP AllToAll inside the ToR included) and s the time of one
micro-batch's activation send between adjacent stages, the pipeline is a line of
2p-1 servers (p compute stages, p-1 links) and its span is the classic

    span = [p*f + (p-1)*s + (m-1)*max(f, s)] + [p*b + (p-1)*s + (m-1)*max(b, s)]

(p = 1: m*(f+b), no sends). The network is idle before the first send (the
optimizer step and the first forward: the DP -> PP rewiring window) and after
the last gradient send (the last backward on stage 0: the PP -> DP window).

When the job states no compute times they are derived from the model size at a
stated GPU throughput: a micro-batch of t tokens costs 2*N/p*t FLOPs forward and
twice that backward on the stage's server (TP over its GPUs), at
`DEFAULT_GPU_TFLOPS` per GPU (the median achieved rate of Megatron-LM SC'21
Table 1, data/tables/megatron_sc21_table1.csv); the optimizer step is
memory-bound, 16 bytes per parameter (ZeRO's mixed-precision Adam accounting)
through HBM at `HBM_BYTES_PER_S` per GPU.

Pure functions; no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from app.engine.collective import ALPHA_RING_S, gbps_to_bytes_per_s, ring_time_s
from app.engine.gpu_profiles import forward_share, gpu_profile, megatron_flops
from app.engine.job import ComputeTimes, Job
from app.engine.traffic import gradient_bytes, resolve_facts

DEFAULT_GPU_TFLOPS = 140.0  # the from-trace importer's rate when a row states none
DP_BUCKET_PARAMETERS = 40e6  # Megatron-LM's DDP gradient bucket (40M parameters)
DEFAULT_SEQ_LEN = 2048
OPTIMIZER_BYTES_PER_PARAMETER = 16.0
HBM_BYTES_PER_S = 2.0e12
DEFAULT_GPUS_PER_SERVER = 8
DEFAULT_SERVER_GBPS = 3200.0


def stage_compute(
    job: Job,
    *,
    tflops_per_gpu: float | None = None,
    gpus_per_server: int = DEFAULT_GPUS_PER_SERVER,
    gpu: str | None = None,
) -> tuple[float, float, float]:
    """(forward, backward, optimizer) seconds of one micro-batch / step on one stage.

    With the model's shape (hidden size, layers, sequence length) the Megatron-LM
    FLOPs formula (`gpu_profiles.megatron_flops`, with activation recomputation
    unless the job turns it off) at the GPU profile's achieved rate for that
    width; else 2N FLOPs per token forward, 4N backward. `tflops_per_gpu` forces
    a rate. Stated compute times win over both.
    """
    c = job.compute
    m = job.model
    facts = resolve_facts(job)
    par = job.parallelism
    profile = gpu_profile(gpu)
    seq = m.seq_len if m and m.seq_len else DEFAULT_SEQ_LEN
    mbs = m.microbatch_size if m and m.microbatch_size else 1
    hidden = m.hidden_size if m else None
    rate = tflops_per_gpu if tflops_per_gpu is not None else profile.achieved_tflops(hidden)
    flops_per_s = rate * 1e12 * gpus_per_server
    # experts split the MoE layers over ep servers; dense layers are replicated, so
    # a server holds parameters / (pp * ep) of the (sparse) model's weights
    stage_params = facts.parameters / (par.pp * par.ep)
    if m is not None and m.hidden_size and m.num_layers:
        recompute = m.activation_checkpointing is not False
        flops = megatron_flops(mbs, seq, m.num_layers, m.hidden_size, recompute=recompute)
        share = forward_share(recompute)
        forward = flops * share / par.pp / flops_per_s
        backward = flops * (1.0 - share) / par.pp / flops_per_s
    else:
        forward = 2.0 * stage_params * seq * mbs / flops_per_s
        backward = 2.0 * forward
    optimizer = (
        stage_params / gpus_per_server * OPTIMIZER_BYTES_PER_PARAMETER / profile.hbm_bytes_per_s
    )
    if c is not None:
        forward = c.microbatch_forward_s if c.microbatch_forward_s is not None else forward
        backward = c.microbatch_backward_s if c.microbatch_backward_s is not None else backward
        optimizer = c.optimizer_s if c.optimizer_s is not None else optimizer
    return forward, backward, optimizer


def with_stated_compute(
    job: Job, gpus_per_server: int = DEFAULT_GPUS_PER_SERVER, gpu: str | None = None
) -> Job:
    """The job as a launcher that profiled its step submits it: compute times stated.

    The times are `stage_compute`'s, so the simulated iteration does not change;
    the fabric controller sees them as the live service would (`POST /v1/jobs`
    `compute`) and weighs each job's network time against its compute.
    """
    forward, backward, optimizer = stage_compute(job, gpus_per_server=gpus_per_server, gpu=gpu)
    return replace(job, compute=ComputeTimes(forward, backward, optimizer))


@dataclass(frozen=True, slots=True)
class JobTiming:
    """Fabric-independent times of one job's iteration, in seconds."""

    forward_s: float  # one micro-batch on one stage, EP AllToAll included
    backward_s: float
    optimizer_s: float
    microbatches: int
    stages: int
    compute_s: float  # GPU busy time per iteration: m*(f+b) + optimizer (EP excluded)
    send_ideal_s: float  # one activation send at the server's full NIC rate
    activation_bytes: float
    gradient_bytes: float
    buckets: int = 1  # DP gradient buckets, AllReduced as the backward pass fills them

    def dp_exposed_s(self, dp_s: float) -> float:
        """The AllReduce time not hidden under the last micro-batch's backward pass.

        Buckets go out as the backward pass fills them, so all but the last
        bucket overlap the last backward on the stage; the last one cannot.
        """
        if dp_s <= 0:
            return 0.0
        return max(dp_s / self.buckets, dp_s - self.backward_s * (1 - 1 / self.buckets))

    @property
    def gap_before_pp_s(self) -> float:
        """Network idle before the first send: optimizer step plus the first forward."""
        return self.optimizer_s + self.forward_s

    @property
    def gap_before_dp_s(self) -> float:
        """Network idle after the last gradient send: the last backward on stage 0."""
        return self.backward_s


def job_timing(
    job: Job,
    server_gbps: float = DEFAULT_SERVER_GBPS,
    gpus_per_server: int = DEFAULT_GPUS_PER_SERVER,
    gpu: str | None = None,
    ep_gbps: float | None = None,
) -> JobTiming:
    """The job's compute times, EP AllToAll and ideal send time.

    EP all-to-all runs at the server's rate under its ToR, or at `ep_gbps` per
    server when the placement spreads an EP group over ToRs (the caller's view of
    the fabric beyond the ToR).
    """
    forward, backward, optimizer = stage_compute(job, gpus_per_server=gpus_per_server, gpu=gpu)
    facts = resolve_facts(job)
    par = job.parallelism
    server_bps = gbps_to_bytes_per_s(server_gbps)
    ep_s = 0.0
    if par.ep > 1:
        # dispatch + combine, forward + backward: 4 transfers of (ep-1)/ep of the
        # micro-batch's activations per server, at the server's rate under its ToR
        ep_bps = gbps_to_bytes_per_s(ep_gbps) if ep_gbps is not None else server_bps
        ep_s = 4 * facts.activation_bytes * (par.ep - 1) / par.ep / min(server_bps, ep_bps)
    m = facts.microbatches
    stage_params = facts.parameters / (par.pp * par.ep)
    buckets = max(1, min(64, math.ceil(stage_params / DP_BUCKET_PARAMETERS)))
    return JobTiming(
        forward_s=forward + ep_s / 2,
        backward_s=backward + ep_s / 2,
        optimizer_s=optimizer,
        microbatches=m,
        stages=par.pp,
        compute_s=m * (forward + backward) + optimizer,
        send_ideal_s=ALPHA_RING_S + facts.activation_bytes / server_bps,
        activation_bytes=facts.activation_bytes,
        gradient_bytes=gradient_bytes(job),
        buckets=buckets,
    )


def pipeline_span_s(t: JobTiming, send_s: float) -> float:
    """GPipe forward + backward span with per-send time `send_s` (see module docstring)."""
    m, p, f, b = t.microbatches, t.stages, t.forward_s, t.backward_s
    if p <= 1:
        return m * (f + b)
    fwd = p * f + (p - 1) * send_s + (m - 1) * max(f, send_s)
    bwd = p * b + (p - 1) * send_s + (m - 1) * max(b, send_s)
    return fwd + bwd


def pp_window_s(t: JobTiming, send_s: float) -> float:
    """How long the PP phase holds the network: the span less the first f and last b."""
    if t.stages <= 1:
        return 0.0
    return pipeline_span_s(t, send_s) - t.forward_s - t.backward_s


def ideal_iteration_estimate_s(
    job: Job, server_gbps: float = DEFAULT_SERVER_GBPS, gpu: str | None = None
) -> float:
    """Placement-free iteration estimate: pipeline at NIC rate plus a ring AllReduce."""
    t = job_timing(job, server_gbps, gpu=gpu)
    dp = ring_time_s(job.parallelism.dp, t.gradient_bytes, gbps_to_bytes_per_s(server_gbps))
    return pipeline_span_s(t, t.send_ideal_s) + t.dp_exposed_s(dp) + t.optimizer_s

"""GPU memory per device as a function of the micro-batch: the batch-size note's M(b).

M(b) = M_fixed + M_activation(b) + M_gradient per GPU (seeds/004; SPEC section 6).
Pure functions; this module must not import anything that does I/O (no FastAPI,
SQLAlchemy, Redis, pydantic).

Sources of the accounting:

- Model states: Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training
  Trillion Parameter Models", SC'20 (arXiv:1910.02054), section 3.1: mixed
  precision Adam holds 2 bytes of fp16 weights + 2 of fp16 gradients + K = 12 of
  fp32 master weights, momentum and variance per parameter (16 bytes), and ZeRO
  stages 1/2/3 shard the optimizer states / gradients / weights over the DP
  degree (their Figure 1: 7.5B parameters, DP 64 -> 120, 31.4, 16.6, 1.9 GB).
- Activations: Korthikanti et al., "Reducing Activation Recomputation in Large
  Transformer Models", MLSys'23 (arXiv:2205.05198), eq. (1) and Table 2: per
  transformer layer and micro-batch, s*b*h*(34 + 5*a*s/h) bytes with 16-bit
  activations; with tensor parallelism t, s*b*h*(10 + 24/t + 5*a*s/(h*t)), and
  with sequence parallelism as well s*b*h/t*(34 + 5*a*s/h); full recomputation
  keeps only each layer's input, 2*s*b*h bytes (divided by t under sequence
  parallelism). With 1F1B the first stage holds pp micro-batches of its L/pp
  layers, so L layers' worth in all (their eq. 5, small embedding terms left out).
  GPipe (Huang et al., NeurIPS'19) runs all m forward passes before the
  backward passes, so its first stage holds all m micro-batches (`in_flight`).

The note's M_gradient(b) grows with b; parameter gradients do not (their size is
the parameter count), and the activation gradients of the backward pass are the
activations' own memory, so here gradients are a fixed term reported apart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from .job import Job, PipelineSchedule
from .traffic import MICROBATCHES_PER_STAGE

# Megatron's GPT configurations use 128-wide attention heads from 7.5B upward
# (data/tables/megatron_sc21_table1.csv); used when heads are not given.
DEFAULT_HEAD_DIM = 128
# The largest micro-batch `max_microbatch` searches; beyond it nothing is gained.
MAX_MICROBATCH = 1 << 16

NOT_ENOUGH_MEMORY = "the stated plan does not fit GPU memory"
# ZeRO stage assumed when a job states none: 1, Megatron's distributed optimizer
DEFAULT_ZERO_STAGE = 1


class Optimizer(StrEnum):
    """Optimizers whose state the model knows."""

    ADAM = "adam"
    SGD = "sgd"


@dataclass(frozen=True, slots=True)
class MemorySetup:
    """Model facts and parallel split that fix M(b); sizes in bytes, counts as given."""

    parameters: float
    bytes_per_parameter: float = 2.0
    hidden_size: int | None = None
    num_layers: int | None = None
    seq_len: int | None = None
    attention_heads: int | None = None
    optimizer: Optimizer = Optimizer.ADAM
    activation_checkpointing: bool = False
    tp: int = 1
    pp: int = 1
    dp: int = 1
    # Expert parallelism: the experts are split over ep servers. As in the
    # simulator's timing model, a GPU holds parameters / (tp x pp x ep): the expert
    # layers hold most of a sparse model's weights (Mixtral 8x22B: ~136 of 141B),
    # and the replicated dense layers' own share is not counted apart.
    ep: int = 1
    zero_stage: int = 0
    # Megatron turns sequence parallelism on with tensor parallelism; it shards
    # the layer-norm and dropout activations over t as well (Korthikanti section 4.2.2).
    sequence_parallel: bool = True
    # Micro-batches whose activations the first stage holds; None: pp (1F1B). GPipe
    # holds all of the iteration's micro-batches (`in_flight` computes it).
    microbatches_in_flight: int | None = None
    # The job's stated pipeline-boundary activation (`model.activation_bytes`): one
    # micro-batch of `stage_input_microbatch` samples entering a stage. Every layer
    # keeps at least its input for the backward pass, so with or without the layer
    # facts a GPU holds at least this / tp per layer and micro-batch in flight.
    stage_input_bytes: float | None = None
    stage_input_microbatch: int = 1

    def __post_init__(self) -> None:
        if self.parameters <= 0 or self.bytes_per_parameter <= 0:
            raise ValueError("parameters and bytes_per_parameter must be positive")
        if min(self.tp, self.pp, self.dp, self.ep) < 1:
            raise ValueError("parallel degrees must be positive")
        if self.zero_stage not in (0, 1, 2, 3):
            raise ValueError("zero_stage is 0, 1, 2 or 3")

    @property
    def knows_activations(self) -> bool:
        """Whether hidden size, layers and sequence length are all known."""
        return None not in (self.hidden_size, self.num_layers, self.seq_len)

    @property
    def activations_grow(self) -> bool:
        """Whether anything known about the activations grows with the micro-batch."""
        return self.knows_activations or bool(self.stage_input_bytes)


@dataclass(frozen=True, slots=True)
class MemoryBreakdown:
    """Bytes per GPU: the response's `memory_bytes`."""

    fixed: int
    activations: int
    gradients: int

    @property
    def total(self) -> int:
        return self.fixed + self.activations + self.gradients

    def as_dict(self) -> dict[str, int]:
        """The `memory_bytes` object of POST /v1/advice/batch-size."""
        return {
            "fixed": self.fixed,
            "activations": self.activations,
            "gradients": self.gradients,
            "total": self.total,
        }


@dataclass(frozen=True, slots=True)
class BatchAdvice:
    """The largest micro-batch that fits, its memory, and whether any fits at all.

    When nothing fits, `max_microbatch` is 0 and `memory_bytes` is M(1).
    """

    max_microbatch: int
    memory_bytes: MemoryBreakdown
    fits: bool


@dataclass(frozen=True, slots=True)
class MemoryCheck:
    """Admission verdict for a job's stated plan: fits, or reasons and the breakdown."""

    fits: bool
    reasons: tuple[str, ...]
    memory_bytes: MemoryBreakdown
    microbatch: int


def _optimizer_bytes_per_parameter(setup: MemorySetup) -> float:
    """Adam: two fp32 moments; SGD: one fp32 momentum; plus an fp32 master copy
    when the weights are kept in lower precision (ZeRO's K = 12 for mixed Adam)."""
    states = 8.0 if setup.optimizer is Optimizer.ADAM else 4.0
    master = 4.0 if setup.bytes_per_parameter < 4 else 0.0
    return states + master


def _model_states(setup: MemorySetup) -> tuple[float, float]:
    """(weights + optimizer states, gradients) per GPU, ZeRO sharding applied."""
    per_gpu = setup.parameters / (setup.tp * setup.pp * setup.ep)
    weights = per_gpu * setup.bytes_per_parameter
    grads = per_gpu * setup.bytes_per_parameter
    optim = per_gpu * _optimizer_bytes_per_parameter(setup)
    if setup.zero_stage >= 1:
        optim /= setup.dp
    if setup.zero_stage >= 2:
        grads /= setup.dp
    if setup.zero_stage >= 3:
        weights /= setup.dp
    return weights + optim, grads


def layer_activation_bytes(setup: MemorySetup, microbatch: int) -> float:
    """Korthikanti eq. (1)/Table 2: one layer's stored activations for one micro-batch."""
    if not setup.knows_activations:
        return 0.0
    assert setup.hidden_size and setup.seq_len  # knows_activations checked them
    h, s, b, t = setup.hidden_size, setup.seq_len, microbatch, setup.tp
    a = setup.attention_heads or max(1, h // DEFAULT_HEAD_DIM)
    sbh = s * b * h
    if t == 1:
        per_layer = sbh * (34 + 5 * a * s / h)
    elif setup.sequence_parallel:
        per_layer = sbh / t * (34 + 5 * a * s / h)
    else:
        per_layer = sbh * (10 + 24 / t + 5 * a * s / (h * t))
    # The coefficients count 2-byte activations (1-byte dropout masks); fp32
    # training doubles them.
    return per_layer * max(1.0, setup.bytes_per_parameter / 2)


def memory_bytes(setup: MemorySetup, microbatch: int) -> MemoryBreakdown:
    """M(b) per GPU of the first pipeline stage (the one holding the most activations)."""
    if microbatch < 1:
        raise ValueError("microbatch must be at least 1")
    fixed, grads = _model_states(setup)
    activations = 0.0
    if setup.knows_activations:
        assert setup.num_layers and setup.hidden_size and setup.seq_len
        layers_per_stage = math.ceil(setup.num_layers / setup.pp)
        in_flight = setup.microbatches_in_flight or setup.pp
        full_layer = layer_activation_bytes(setup, microbatch)
        if setup.activation_checkpointing:
            shard = setup.tp if setup.sequence_parallel else 1
            kept = 2 * setup.seq_len * microbatch * setup.hidden_size / shard
            kept *= max(1.0, setup.bytes_per_parameter / 2)
            # Checkpoints of every layer in flight, plus one layer rematerialised
            # in full while its backward runs.
            activations = kept * layers_per_stage * in_flight + full_layer
        else:
            activations = full_layer * layers_per_stage * in_flight
    return MemoryBreakdown(
        round(fixed), round(max(activations, _stage_inputs(setup, microbatch))), round(grads)
    )


def _stage_inputs(setup: MemorySetup, microbatch: int) -> float:
    """The least the first stage's GPU keeps of the stated boundary activation: every
    layer's input (one layer when the layer count is unknown), a tp-th of it (the
    sequence-parallel shard), for each micro-batch in flight."""
    if not setup.stage_input_bytes:
        return 0.0
    layers = math.ceil(setup.num_layers / setup.pp) if setup.num_layers else 1
    per_sample = setup.stage_input_bytes / setup.stage_input_microbatch
    flight = setup.microbatches_in_flight or setup.pp
    return per_sample * microbatch / setup.tp * layers * flight


def in_flight(schedule: PipelineSchedule, pp: int, microbatches: int | None) -> int:
    """Micro-batches whose activations the first stage holds at the peak.

    GPipe: every micro-batch of the iteration (forward passes all run before the
    first backward); 1F1B: at most pp (the warm-up depth), fewer if the
    iteration has fewer micro-batches. Micro-batches default to 4 * pp. Without a
    pipeline (pp = 1) micro-batches are gradient-accumulation steps: one at a time.
    """
    if pp <= 1:
        return 1
    m = microbatches or MICROBATCHES_PER_STAGE * pp
    return m if schedule is PipelineSchedule.GPIPE else min(pp, m)


def max_microbatch(
    setup: MemorySetup, gpu_memory_bytes: float, *, limit: int = MAX_MICROBATCH
) -> BatchAdvice:
    """The largest micro-batch b with M(b) <= gpu_memory_bytes (M grows with b)."""
    first = memory_bytes(setup, 1)
    if first.total > gpu_memory_bytes:
        return BatchAdvice(0, first, False)
    if not setup.activations_grow:
        raise ValueError("nothing known of the activations: M(b) does not depend on b")
    lo, hi = 1, limit  # invariant: M(lo) fits; find the last fitting b by bisection
    if memory_bytes(setup, hi).total <= gpu_memory_bytes:
        return BatchAdvice(hi, memory_bytes(setup, hi), True)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if memory_bytes(setup, mid).total <= gpu_memory_bytes:
            lo = mid
        else:
            hi = mid
    return BatchAdvice(lo, memory_bytes(setup, lo), True)


def setup_for_job(job: Job, *, tp: int, zero_stage: int = 0) -> MemorySetup | None:
    """The memory setup a job's stated facts imply, or None when parameters are unknown."""
    model = job.model
    if model is None or not model.parameters:
        return None
    try:
        optimizer = Optimizer(model.optimizer or Optimizer.ADAM)
    except ValueError:
        optimizer = Optimizer.ADAM  # an unknown optimizer is judged like Adam (the usual)
    par = job.parallelism
    flight = in_flight(job.schedule, par.pp, model.microbatches)
    return MemorySetup(
        parameters=model.parameters,
        bytes_per_parameter=model.bytes_per_parameter or 2.0,
        hidden_size=model.hidden_size,
        num_layers=model.num_layers,
        seq_len=model.seq_len,
        attention_heads=model.attention_heads,
        optimizer=optimizer,
        activation_checkpointing=bool(model.activation_checkpointing),
        tp=tp,
        pp=par.pp,
        dp=par.dp,
        ep=par.ep,
        zero_stage=zero_stage,
        microbatches_in_flight=flight,
        stage_input_bytes=model.activation_bytes,
        stage_input_microbatch=model.microbatch_size or 1,
    )


def check_job_memory(
    job: Job, gpu_memory_bytes: float, *, tp: int, zero_stage: int = DEFAULT_ZERO_STAGE
) -> MemoryCheck | None:
    """Admission: does the job's stated plan fit GPU memory? None when it states too little.

    The one check the service (`POST /v1/jobs`) and the simulator both apply. TP
    is the server (pass the cluster's GPUs per server). `zero_stage` applies when
    the job states none. The stated micro-batch (default 1) is judged; a refusal
    names the largest micro-batch that would fit.
    """
    if job.model is not None and job.model.zero_stage is not None:
        zero_stage = job.model.zero_stage
    setup = setup_for_job(job, tp=tp, zero_stage=zero_stage)
    if setup is None:
        return None
    microbatch = (job.model.microbatch_size if job.model else None) or 1
    breakdown = memory_bytes(setup, microbatch)
    if breakdown.total <= gpu_memory_bytes:
        return MemoryCheck(True, (), breakdown, microbatch)
    gib = 1 << 30
    reason = (
        f"{NOT_ENOUGH_MEMORY}: micro-batch {microbatch} needs "
        f"{breakdown.total / gib:.1f} GiB per GPU, {gpu_memory_bytes / gib:.1f} GiB available"
    )
    advice = max_microbatch(setup, gpu_memory_bytes)
    hint = (
        f"largest micro-batch that fits: {advice.max_microbatch}"
        if advice.fits
        else "even micro-batch 1 does not fit: raise pp or tp, or shard with ZeRO"
    )
    return MemoryCheck(False, (reason, hint), breakdown, microbatch)

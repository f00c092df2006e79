"""Jobs, their parallel units and where those units run.

Pure values only; must not import anything that does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

# The largest model facts a job may state. Each is far beyond any real model (a
# quadrillion parameters, 10 TB of activations per micro-batch, a day per
# micro-batch), and within them every product the engine forms (bytes per
# iteration, compute seconds, slowdowns) stays finite: a stated 1e308 would make
# them infinite and the port allocation's arithmetic NaN.
MAX_PARAMETERS = 1e15
MAX_BYTES_PER_PARAMETER = 16.0  # fp64 gradients with fp64 master weights
MAX_ACTIVATION_BYTES = 1e13
MAX_COMPUTE_S = 86_400.0
# Shape facts, as far past real models (hidden 16,384 to 25,600, ~100-200 layers,
# contexts of 10M tokens); within them the memory model's products stay finite.
MAX_HIDDEN_SIZE = 1 << 20
MAX_LAYERS = 1 << 16
MAX_SEQ_LEN = 1 << 24
MAX_MICROBATCH_SIZE = 1 << 16
MAX_ATTENTION_HEADS = 1 << 16


class Collective(StrEnum):
    """The AllReduce algorithm a launcher may force; `auto` lets the engine choose."""

    AUTO = "auto"
    INC = "inc"
    RING = "ring"
    TREE = "tree"
    HIERARCHICAL_RING = "hierarchical_ring"


class PipelineSchedule(StrEnum):
    """How a job runs its micro-batches through the pipeline (the design notes' default: GPipe).

    GPipe runs every micro-batch's forward pass before the backward passes, so
    the first stage holds all of the iteration's micro-batches' activations;
    1F1B alternates once the pipeline is full and holds at most pp of them.
    """

    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"


class JobState(StrEnum):
    QUEUED = "queued"
    PLACED = "placed"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def ended(self) -> bool:
        return self in (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED)


@dataclass(frozen=True, slots=True)
class Parallelism:
    """Degrees Lightpath schedules: a job needs ep*dp*pp servers (TP is the server)."""

    dp: int
    pp: int
    ep: int = 1

    def __post_init__(self) -> None:
        if self.dp < 1 or self.pp < 1 or self.ep < 1:
            raise ValueError("parallel degrees must be positive")

    @property
    def servers(self) -> int:
        return self.dp * self.pp * self.ep


@dataclass(frozen=True, slots=True)
class ModelFacts:
    """What the launcher knows of the model; any field may be unknown (None)."""

    parameters: float | None = None
    bytes_per_parameter: float | None = None
    activation_bytes: float | None = None
    microbatches: int | None = None
    hidden_size: int | None = None
    num_layers: int | None = None
    seq_len: int | None = None
    microbatch_size: int | None = None
    attention_heads: int | None = None
    optimizer: str | None = None
    activation_checkpointing: bool | None = None
    zero_stage: int | None = None


@dataclass(frozen=True, slots=True)
class ComputeTimes:
    """Measured or estimated compute times of one micro-batch and the optimizer step."""

    microbatch_forward_s: float | None = None
    microbatch_backward_s: float | None = None
    optimizer_s: float | None = None


@dataclass(frozen=True, slots=True)
class Job:
    """A training job as the launcher described it."""

    job_id: str
    parallelism: Parallelism
    model: ModelFacts | None = None
    compute: ComputeTimes | None = None
    collective: Collective = Collective.AUTO
    priority: int = 0
    deadline: float | None = None  # seconds since the epoch
    submitted_order: int = 0  # arrival order, ties broken by it in every queue policy
    walltime_s: float | None = None  # the launcher's runtime estimate, for EASY backfill
    schedule: PipelineSchedule = PipelineSchedule.GPIPE

    @property
    def servers_needed(self) -> int:
        return self.parallelism.servers


@dataclass(frozen=True, slots=True)
class Unit:
    """One parallel unit of a job: (stage, dp_rank, ep_rank) on one server."""

    server: str
    stage: int
    dp_rank: int
    ep_rank: int


@dataclass(frozen=True, slots=True)
class Placement:
    """Where every unit of a job runs, and why it was laid out this way."""

    job_id: str
    units: tuple[Unit, ...]
    reason: str = ""

    @property
    def servers(self) -> tuple[str, ...]:
        return tuple(u.server for u in self.units)


@dataclass(frozen=True, slots=True)
class Unplaceable:
    """A job that cannot be placed now (`never_fits` False) or ever (True), with reasons."""

    job_id: str
    reasons: tuple[str, ...]
    never_fits: bool = False

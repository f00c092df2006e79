"""Request and response bodies of the REST API (pydantic; the edge of the system).

The job body itself (`JobIn`) lives in `app.job_body`, shared with workload files.
Request models forbid unknown fields (a typo like `paralellism` must not be
silently ignored), use strict integers (no "8", no 8.5, no true) and refuse
NaN and infinities.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

from app.job_body import (  # the job body is shared with workload files
    JOB_ID_PATTERN,
    SCHEDULE_DESCRIPTION,
    BytesPerParameter,
    Degree,
    Microbatches,
    MicrobatchSize,
    ModelIn,
    Number,
    ParallelismIn,
    Parameters,
    Schedule,
    StrictModel,
    ZeroStage,
)

# 10 TB of memory per GPU: far past any GPU, and the memory model stays finite
MAX_GPU_MEMORY_BYTES = 1e13
JobState = Literal["queued", "placed", "completed", "failed", "cancelled"]


class UnitOut(BaseModel):
    server: str
    stage: int
    dp_rank: int
    ep_rank: int


class PlacementOut(BaseModel):
    units: list[UnitOut]
    reason: str = ""


class CollectiveOut(BaseModel):
    algorithm: str
    inc: bool
    aggregators: list[str]
    estimated_allreduce_s: float | None = None
    reason: str | None = None


class NetworkOut(BaseModel):
    """How a placed job's cross-pod traffic is served now."""

    mode: Literal["isolated", "shared", "electrical", "none"] = Field(
        description="own circuits, turns on ports shared with other jobs, the electrical "
        "layer, or no cross-pod traffic"
    )
    pod_ports: dict[str, int] = Field(description="uplink ports per pod it holds or takes turns on")
    estimated_slowdown: float | None = Field(
        None,
        description="iteration time on this allocation over a non-blocking one (estimate, at "
        "least 1); the non-blocking iteration is fixed at arrival, so failed ports only raise "
        "it, and moves only when the job's traffic reports teach the demand or compute time "
        "its launcher did not state",
    )
    reason: str = ""


class JobOut(BaseModel):
    """A job as Lightpath sees it now."""

    job_id: str
    state: JobState
    submitted_at: dt.datetime
    placed_at: dt.datetime | None
    completed_at: dt.datetime | None = Field(description="when it ended (any ended state)")
    parallelism: ParallelismIn
    priority: int = 0
    deadline: float | None = None
    queue_reason: str | None = Field(
        None,
        description="why a queued job waits: too few free servers (or whole EP groups in "
        "pods), behind the head's reservation, or, for a small job, free servers that would "
        "scatter it over pods whose uplinks are taken (it waits for a compact layout; "
        "LIGHTPATH_MAX_EXTRA_PODS)",
    )
    placement: PlacementOut | None = None
    collective: CollectiveOut | None = Field(
        None,
        description="null until the fabric pass has planned the placed job (tens of ms after "
        "`placed`: the 201 of POST /v1/jobs and a long-poll's answer may still carry null)",
    )
    network: NetworkOut | None = Field(
        None,
        description="placed jobs only; null until the fabric pass has planned the job, as "
        "`collective`",
    )
    exit_code: int | None = Field(None, description="the launcher's exit code (failed jobs)")
    end_reason: str | None = Field(
        None, description="why it failed or was cancelled, e.g. lease_expired"
    )
    lease_s: float | None = None
    lease_expires_at: dt.datetime | None = Field(
        None, description="a placed job with a lease is failed if not heard from by then"
    )
    walltime_s: float | None = None
    schedule: Schedule = Field("gpipe", description=SCHEDULE_DESCRIPTION)


class EmptyIn(StrictModel):
    """The body of `complete`, `heartbeat` and `DELETE`: none, or `{}`."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{}]})


class FailIn(StrictModel):
    """`POST /v1/jobs/{job_id}/fail`: the launcher's command failed."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"exit_code": 137, "reason": "oom"}]}
    )

    exit_code: Annotated[StrictInt, Field(ge=-255, le=255)] | None = Field(
        None, description="exit status (negative: killed by that signal)"
    )
    # no NUL: PostgreSQL text cannot hold it (a 500 there, kept as given on SQLite)
    reason: str | None = Field(
        None, max_length=500, pattern=r"^[^\x00]*$", description="free text, e.g. oom"
    )


class JobListOut(BaseModel):
    jobs: list[JobOut]
    next: int | None = Field(
        None, description="pass as `after` for the next page; null on the last page"
    )


class HandoverOut(BaseModel):
    ports: tuple[int, int] = Field(description="the port pair, joined before and after")
    from_job: str = Field(description="the job whose circuit it was")


class OxcChangeOut(BaseModel):
    """Port pairs one OXC connects and disconnects, and circuits it keeps that pass to
    this entry's job."""

    id: str = Field(description="the OXC")
    connect: list[tuple[int, int]] = Field(description="port pairs to join")
    disconnect: list[tuple[int, int]] = Field(description="port pairs to release")
    handover: list[HandoverOut] | None = Field(
        default=None,
        description="present only when some: cross-connects that stay joined (nothing "
        "changes on the switch) and become this entry's job's, taken over from "
        "`from_job` (a job ended and the next one kept its circuit)",
    )


class RouteOut(BaseModel):
    src: str
    dst: str
    path: list[str] = Field(description="pod ids the flow crosses, in order")


class RoutingOut(BaseModel):
    """One job's header for one phase."""

    phase: str = Field(description="pp or dp")
    algorithm: str
    inc: bool
    aggregators: list[str]
    routes: list[RouteOut]
    layer: Literal["optical", "electrical"] = Field(
        "optical", description="`optical`: circuits; `electrical`: the cluster's electrical core"
    )


class DecisionOut(BaseModel):
    seq: int
    at: dt.datetime
    kind: Literal["placement", "oxc", "routing"]
    job_id: str | None
    reason: Literal["arrival", "completion", "phase", "prediction", "reconcile"]
    placement: PlacementOut | None = Field(
        None, description="kind placement: where it runs (null for the other kinds)"
    )
    oxc: OxcChangeOut | None = Field(
        None,
        description="kind oxc: one switch's changes for `job_id`; where a change moves "
        "ports between jobs, the jobs losing ports come first with their disconnects, then "
        "the jobs gaining them with their connects (null for the other kinds)",
    )
    routing: RoutingOut | None = Field(
        None, description="kind routing: one job's header (null for the other kinds)"
    )


class DecisionPage(BaseModel):
    decisions: list[DecisionOut]
    next: int = Field(
        description="pass as `after` for the next page: the last seq in this page, or the "
        "`after` asked for when the page is empty (the log may grow: ask again later)"
    )


class DemandIn(StrictModel):
    """Bytes one server sent another during the phase."""

    src: str = Field(min_length=1, max_length=200)
    dst: str = Field(min_length=1, max_length=200)
    bytes: Annotated[Number, Field(ge=0)]


class ReportIn(StrictModel):
    """One communication phase as the network saw it."""

    job_id: str | None = Field(
        None,
        pattern=JOB_ID_PATTERN,
        description=(
            "when the network knows it; a report naming no placed job (unknown, queued "
            "or ended) is set aside as a dead letter (GET /v1/traffic/dead-letters)"
        ),
    )
    phase_started_at: Annotated[Number, Field(ge=0)] = Field(
        description=(
            "epoch seconds when the phase's first bytes were seen, on the reporter's "
            "clock; a start later than when Lightpath saw the report is taken as that "
            "time and never scored a hit"
        )
    )
    demands: list[DemandIn] = Field(min_length=1, max_length=100_000)


TRAFFIC_EXAMPLE: dict[str, Any] = {
    "reports": [
        {
            "job_id": "gpt3-175b-7",
            "phase_started_at": 1763812345.125,
            "demands": [{"src": "pod-0/tor-0/srv-0", "dst": "pod-2/tor-1/srv-3", "bytes": 1.2e9}],
        }
    ]
}


class TrafficIn(StrictModel):
    """`POST /v1/traffic`: a batch, accepted or refused as a whole."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [TRAFFIC_EXAMPLE]})

    reports: list[ReportIn] = Field(min_length=1, max_length=10_000)


class TrafficAccepted(BaseModel):
    accepted: int
    last_seq: int


class DeadLetterOut(BaseModel):
    """A traffic report the worker set aside, and why."""

    ord: int = Field(description="its place in the ingest order; the cursor of this list")
    job_id: str | None
    reason: str
    report: dict[str, Any] = Field(description="the report as it was posted")
    at: dt.datetime | None


class DeadLetterPage(BaseModel):
    dead_letters: list[DeadLetterOut]
    next: int | None = Field(
        None, description="pass as `after` for the next page; null on the last page"
    )


class PredictionOut(BaseModel):
    job_id: str
    algorithm: str
    period: int | None
    cycle_count: int
    queue: list[str]
    next_plan: str | None
    installed_plan: str | None = Field(
        None, description="what the job's circuits are for now (a plan id or plan-held)"
    )
    hits: int = Field(
        description="phases whose planned topology the switches confirmed before they began"
    )
    misses: int = Field(description="phases that were neither hits nor held")
    held: int = Field(0, description="phases that ran on a topology the controller kept")
    exposed_reconfig_s: float | None = Field(
        None,
        description="seconds phases waited on circuits still being switched (a moment "
        "several phases waited through counts once)",
    )


class AdviceModelIn(ModelIn):
    """A job body's `model` with its parameter count required (the same fields and
    bounds, so advice answers for any model admission judges)."""

    parameters: Parameters
    bytes_per_parameter: BytesPerParameter = 2.0
    microbatches: Microbatches | None = Field(
        None, description="micro-batches per iteration (default 4 x pp); GPipe holds them all"
    )
    microbatch_size: MicrobatchSize | None = Field(
        None,
        description="the micro-batch `activation_bytes` was measured at (default 1); the "
        "answer is the largest micro-batch that fits",
    )
    optimizer: Literal["adam", "sgd"] = "adam"
    activation_checkpointing: StrictBool = False
    zero_stage: ZeroStage | None = Field(
        None,
        description="ZeRO stage; default the one admission assumes for a job that states "
        "none (LIGHTPATH_DEFAULT_ZERO_STAGE, 1)",
    )


class AdviceParallelismIn(StrictModel):
    # a job body has no `tp`: admission runs tensor parallelism across a server's GPUs,
    # and so does the advice unless told otherwise (it assumed 1: a 13B job advised
    # "does not fit" at 256 GB was admitted)
    tp: Degree | None = Field(
        None, description="tensor-parallel degree; default: the cluster's GPUs per server"
    )
    pp: Degree = 1
    dp: Degree = 1
    ep: Degree = 1


ADVICE_EXAMPLE: dict[str, Any] = {
    "model": {
        "parameters": 13_000_000_000,
        "bytes_per_parameter": 2,
        "hidden_size": 5120,
        "num_layers": 40,
        "seq_len": 2048,
        "optimizer": "adam",
        "activation_checkpointing": False,
    },
    "parallelism": {"tp": 8, "pp": 2, "dp": 16, "ep": 1},
    "gpu_memory_bytes": 85_899_345_920,
}


class AdviceIn(StrictModel):
    """`POST /v1/advice/batch-size`: the largest micro-batch that fits GPU memory."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [ADVICE_EXAMPLE]})

    model: AdviceModelIn
    parallelism: AdviceParallelismIn
    gpu_memory_bytes: Annotated[Number, Field(gt=0, le=MAX_GPU_MEMORY_BYTES)] | None = Field(
        None,
        description="memory per GPU; default what admission assumes (LIGHTPATH_GPU_MEMORY_BYTES, "
        "else the cluster's GPU model's)",
    )
    schedule: Schedule = Field("gpipe", description=SCHEDULE_DESCRIPTION)


class MemoryOut(BaseModel):
    fixed: float
    activations: float
    gradients: float
    total: float


class AdviceOut(BaseModel):
    max_microbatch: int
    memory_bytes: MemoryOut
    fits: bool
    activations_known: bool = Field(
        True,
        description="false when the model states neither the layer facts nor anything else "
        "that grows with the micro-batch: memory then bounds none (max_microbatch 65536)",
    )
    detail: str | None = Field(None, description="why the answer sets no bound, when it does not")


class ServerOut(BaseModel):
    id: str
    free: bool
    job_id: str | None = Field(None, description="the job holding it")


class TorOut(BaseModel):
    id: str
    aggregator_gbps: float = Field(description="in-network aggregation capacity")
    aggregator_used_gbps: float = Field(0.0, description="granted to placed jobs")
    servers: list[ServerOut]


class PodOut(BaseModel):
    id: str
    uplink_ports: int = Field(description="uplinks into the optical layer")
    aggregator_gbps: float = Field(
        0.0, description="the pod spine's in-network aggregation (second INC level)"
    )
    electrical_gbps: float = Field(
        0.0,
        description="capacity into an electrical packet-switched core beside the optical "
        "layer, each way (0: none); jobs without circuits may send there",
    )
    tors: list[TorOut]


class OxcOut(BaseModel):
    id: str
    ports: int
    reconfig_ms: float
    pod_ports: dict[str, list[int]] = Field(description="this switch's ports wired to each pod")


class PodFragmentationOut(BaseModel):
    free_servers: int
    largest_free_tor_block: int = Field(description="most free servers under one ToR")
    free_whole_tors: int


class ClusterSummaryOut(BaseModel):
    servers: int
    free_servers: int
    gpus: int
    queued_jobs: int
    placed_jobs: int


class ClusterOut(BaseModel):
    """`GET /v1/cluster`: the cluster file's fields plus live free/used state."""

    name: str
    gpus_per_server: int
    nic_gbps: float
    pods: list[PodOut]
    oxcs: list[OxcOut]
    fragmentation: dict[str, PodFragmentationOut] = Field(description="per pod")
    summary: ClusterSummaryOut


class CrossConnectOut(BaseModel):
    a: int
    b: int
    job_id: str | None = Field(description="the job this circuit serves")


class OxcStateOut(BaseModel):
    id: str
    cross_connects: list[CrossConnectOut]


class ConfirmedOxcOut(OxcStateOut):
    """An OXC as the switches last confirmed it."""

    stale: bool = Field(
        description="the switch controller's last pass could not read this OXC: "
        "`cross_connects` is its last read, not necessarily what it holds now"
    )
    unreachable_since: str | None = Field(
        description="when the OXC stopped answering (RFC 3339), null while it answers"
    )


class DesiredTopologyOut(BaseModel):
    pod_circuits: dict[str, dict[str, int]]
    oxcs: list[OxcStateOut]


class TopologyOut(BaseModel):
    """`GET /v1/topology`: what the switches confirmed, and `desired` where it differs."""

    pod_circuits: dict[str, dict[str, int]] = Field(
        description="circuits between pods (both directions listed)"
    )
    oxcs: list[ConfirmedOxcOut]
    stale: bool = Field(description="some OXC could not be read: see each OXC's `stale`")
    failed_ports: dict[str, list[int]] = Field(description="per OXC, ports without light")
    mlu: float | None = Field(
        None,
        description="max link utilisation of the last plan; null before the first plan "
        "and while some job's traffic has no circuit to run on (a pod cut off by failed "
        "ports)",
    )
    time_division: list[Any] = Field(
        default_factory=list, description="jobs taking turns on shared ports, in turn order"
    )
    desired: DesiredTopologyOut | None = Field(
        None, description="present while the switches do not yet hold the desired state"
    )


class HealthOut(BaseModel):
    status: Literal["ok"]


class ReadyOut(BaseModel):
    """`GET /readyz` when every check is ok (otherwise a 503 problem with `checks`)."""

    status: Literal["ready"]
    checks: dict[str, str] = Field(
        description="database, bus and (with a southbound) southbound: ok or unreachable: ..."
    )

"""The job body of `POST /v1/jobs`: its validation, and the engine Job it describes.

One definition for every door a job comes in by: the REST API validates request
bodies with `JobIn`, and workload files for `lightpath simulate` (the same body
plus `arrival_s` and `iterations`) are read with it too, so a body the service
takes is a workload line the simulator takes, field for field. `job_from_body`
turns a validated body into the engine's `Job` for the API, the store and the
simulator alike.

Request models forbid unknown fields (a typo like `paralellism` must not be
silently ignored), use strict integers (no "8", no 8.5, no true) and refuse
NaN and infinities. pydantic only: no web framework.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    StrictBool,
    StrictInt,
    field_validator,
    model_validator,
)

from app.engine.job import (
    MAX_ACTIVATION_BYTES,
    MAX_ATTENTION_HEADS,
    MAX_BYTES_PER_PARAMETER,
    MAX_COMPUTE_S,
    MAX_HIDDEN_SIZE,
    MAX_LAYERS,
    MAX_MICROBATCH_SIZE,
    MAX_PARAMETERS,
    MAX_SEQ_LEN,
    Collective,
    ComputeTimes,
    Job,
    ModelFacts,
    Parallelism,
    PipelineSchedule,
)

Degree = Annotated[StrictInt, Field(ge=1, le=65536)]
# a JSON number (an integer is fine); not true/false and not a numeric string
Number = Annotated[float, Strict(), Field(allow_inf_nan=False)]
Parameters = Annotated[Number, Field(gt=0, le=MAX_PARAMETERS)]
BytesPerParameter = Annotated[Number, Field(gt=0, le=MAX_BYTES_PER_PARAMETER)]
ComputeSeconds = Annotated[Number, Field(ge=0, le=MAX_COMPUTE_S)]
ActivationBytes = Annotated[Number, Field(ge=0, le=MAX_ACTIVATION_BYTES)]
Microbatches = Annotated[StrictInt, Field(ge=1, le=1_000_000)]
HiddenSize = Annotated[StrictInt, Field(ge=1, le=MAX_HIDDEN_SIZE)]
Layers = Annotated[StrictInt, Field(ge=1, le=MAX_LAYERS)]
SeqLen = Annotated[StrictInt, Field(ge=1, le=MAX_SEQ_LEN)]
MicrobatchSize = Annotated[StrictInt, Field(ge=1, le=MAX_MICROBATCH_SIZE)]
AttentionHeads = Annotated[StrictInt, Field(ge=1, le=MAX_ATTENTION_HEADS)]
ZeroStage = Annotated[StrictInt, Field(ge=0, le=3)]
# No "/" (nor anything else a path segment would have to escape): every id the
# pattern admits is addressable, raw or percent-encoded, by every route.
JOB_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@+-]{0,199}$"
Schedule = Literal["gpipe", "1f1b"]
SCHEDULE_DESCRIPTION = (
    "pipeline schedule (default gpipe): GPipe keeps every micro-batch's activations "
    "in flight, 1F1B at most pp; the memory check and batch-size advice use it"
)


class StrictModel(BaseModel):
    """A request body: unknown fields are refused (a typo must not pass unnoticed)."""

    model_config = ConfigDict(extra="forbid")


class ParallelismIn(StrictModel):
    """Parallel degrees; the job needs ep*dp*pp servers of 8 GPUs (TP is the server)."""

    dp: Degree = Field(description="data-parallel degree")
    pp: Degree = Field(description="pipeline stages")
    ep: Degree = Field(1, description="expert-parallel degree (EP group under one ToR)")


class ModelIn(StrictModel):
    """What the launcher knows of the model; every field is optional. The facts size
    the GPU-memory check and the job's circuits; where traffic facts are left out,
    defaults stand in (a 7B model) until traffic reports show the job sends more."""

    parameters: Parameters | None = Field(None, description="parameter count (at most 1e15)")
    bytes_per_parameter: BytesPerParameter | None = None
    activation_bytes: ActivationBytes | None = Field(
        None, description="pipeline-boundary activation bytes per micro-batch (at most 1e13)"
    )
    microbatches: Microbatches | None = Field(
        None, description="micro-batches per iteration (GPipe)"
    )
    hidden_size: HiddenSize | None = None
    num_layers: Layers | None = None
    seq_len: SeqLen | None = None
    microbatch_size: MicrobatchSize | None = None
    attention_heads: AttentionHeads | None = Field(
        None, description="for the memory model (default hidden_size / 128)"
    )
    optimizer: Literal["adam", "sgd"] | None = None
    activation_checkpointing: StrictBool | None = None
    zero_stage: ZeroStage | None = Field(
        None, description="ZeRO stage for the memory check (default LIGHTPATH_DEFAULT_ZERO_STAGE)"
    )

    @model_validator(mode="after")
    def _implied_activation_in_range(self) -> ModelIn:
        # without activation_bytes the traffic model takes hidden x tokens x micro-batch
        # size x bytes per value as the boundary activation: it is bounded like a stated one
        if self.activation_bytes is None and self.hidden_size and self.seq_len:
            implied = (
                self.hidden_size
                * self.seq_len
                * (self.microbatch_size or 1)
                * (self.bytes_per_parameter or 2.0)
            )
            if implied > MAX_ACTIVATION_BYTES:
                raise ValueError(
                    f"hidden_size x seq_len x microbatch_size x bytes_per_parameter (the "
                    f"activation per micro-batch these imply, {implied:.3g} bytes) must be at "
                    f"most {MAX_ACTIVATION_BYTES:.0e}"
                )
        return self


class ComputeIn(StrictModel):
    """Compute times of one micro-batch and of the optimizer step, in seconds. Without
    them the job's compute per iteration is learned from its traffic reports' period."""

    microbatch_forward_s: ComputeSeconds | None = None
    microbatch_backward_s: ComputeSeconds | None = None
    optimizer_s: ComputeSeconds | None = None


JOB_EXAMPLE: dict[str, Any] = {
    "job_id": "gpt3-175b-7",
    "parallelism": {"dp": 8, "pp": 4, "ep": 1},
    "model": {
        "parameters": 175_000_000_000,
        "bytes_per_parameter": 2,
        "activation_bytes": 50_331_648,
        "microbatches": 16,
    },
    "compute": {"microbatch_forward_s": 0.01, "microbatch_backward_s": 0.02, "optimizer_s": 0.05},
    "collective": "auto",
    "priority": 0,
    "deadline": None,
    "lease_s": 60,
    "walltime_s": 86400,
}


# RFC 3339 date-time (a missing offset is read as UTC)
# deadlines run from the epoch to the end of 9999-12-31 (UTC), exclusive
DEADLINE_END_S = 253_402_300_800.0
_LAST_MICROSECOND = dt.datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=dt.UTC)
_LEAP_SECOND = re.compile(r"(\d{2}:\d{2}):60(?:\.\d+)?")
_DATE_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})?$")


class JobIn(StrictModel):
    """`POST /v1/jobs`: a job arrival. `job_id` makes the call idempotent."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [JOB_EXAMPLE]})

    job_id: str = Field(pattern=JOB_ID_PATTERN, description="chosen by the launcher")
    parallelism: ParallelismIn
    model: ModelIn | None = None
    compute: ComputeIn | None = None
    collective: Collective = Field(Collective.AUTO, description="auto lets Lightpath choose")
    priority: Annotated[StrictInt, Field(ge=-1000, le=1000)] = 0
    deadline: float | dt.datetime | None = Field(
        None,
        description="epoch seconds or RFC 3339 time, from 1970 to 9999 (UTC); "
        "used by the edf queue policy",
    )
    lease_s: Annotated[Number, Field(ge=1, le=86400)] | None = Field(
        None,
        description="heartbeat lease: a placed job not heard from (placement, then "
        "POST /v1/jobs/{job_id}/heartbeat) for this long is failed with reason lease_expired",
    )
    walltime_s: Annotated[Number, Field(gt=0, le=31_536_000)] | None = Field(
        None,
        description="runtime estimate; EASY backfill starts this job ahead of a blocked head "
        "only if it ends before the head's reserved start (or avoids its servers)",
    )
    schedule: Schedule | None = Field(None, description=SCHEDULE_DESCRIPTION)

    @field_validator("deadline", mode="before")
    @classmethod
    def _deadline_not_bool(cls, value: Any) -> Any:
        # JSON true/false would pass as the number 1/0 (lax floats), and pydantic reads a
        # numeric string or a bare date as a time: a typo, not a time
        if isinstance(value, bool) or (isinstance(value, str) and not _DATE_TIME.match(value)):
            raise ValueError(
                "deadline must be epoch seconds (a JSON number) or an RFC 3339 date-time"
            )
        if isinstance(value, str):
            # RFC 3339 allows a leap second (23:59:60), which datetime cannot hold: the
            # last microsecond before the next minute stands for it
            value = _LEAP_SECOND.sub(r"\1:59.999999", value)
        return value

    @field_validator("deadline")
    @classmethod
    def _deadline_epoch(cls, value: float | dt.datetime | None) -> float | None:
        if isinstance(value, dt.datetime):
            if value.tzinfo is None:
                value = value.replace(tzinfo=dt.UTC)
            stamp = value.timestamp()
            if stamp == DEADLINE_END_S and value <= _LAST_MICROSECOND:
                # 9999-12-31T23:59:59.999999Z is the end itself as a float
                stamp = math.nextafter(DEADLINE_END_S, 0.0)
            value = stamp
        if value is None:
            return None
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError("deadline must be a finite number")
        if not 0 <= value < DEADLINE_END_S:
            raise ValueError("deadline must fall between 1970-01-01 and 9999-12-31 (UTC)")
        return value

    def stored_body(self) -> dict[str, Any]:
        """The canonical body we keep and compare for idempotency.

        Optional fields added later are left out when unset, so a body stored
        before they existed still matches the same resubmitted body; a schedule
        equal to the default (gpipe) is left out too, so stating the default
        matches a body that did not, and an empty `model` or `compute` object one that
        left it out.
        """
        body = self.model_dump(mode="json", exclude={"job_id"})
        for late in ("lease_s", "walltime_s", "schedule"):
            if body.get(late) is None:
                body.pop(late, None)
        if body.get("schedule") == "gpipe":
            body.pop("schedule")
        model = body.get("model")
        if isinstance(model, dict) and model.get("attention_heads") is None:
            model.pop("attention_heads", None)  # a model field added later
        for facts in ("model", "compute"):
            # `"model": {}` states nothing, as an omitted model does
            if isinstance(body.get(facts), dict) and all(v is None for v in body[facts].values()):
                body[facts] = None
        return body


def job_from_body(job_id: str, body: dict[str, Any], submitted_order: int) -> Job:
    """The engine's Job for a validated `POST /v1/jobs` body (`JobIn.stored_body()`)."""
    par = body["parallelism"]
    model = body.get("model")
    compute = body.get("compute")
    return Job(
        job_id=job_id,
        parallelism=Parallelism(dp=par["dp"], pp=par["pp"], ep=par.get("ep", 1)),
        model=ModelFacts(**{k: v for k, v in model.items() if v is not None}) if model else None,
        compute=ComputeTimes(**compute) if compute else None,
        collective=Collective(body.get("collective", "auto")),
        priority=body.get("priority", 0),
        deadline=body.get("deadline"),
        submitted_order=submitted_order,
        walltime_s=body.get("walltime_s"),
        schedule=PipelineSchedule(body.get("schedule") or "gpipe"),
    )

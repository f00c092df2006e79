"""Resource advice from the memory model of the batch-size note (seeds/004)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from app.engine.gpu_profiles import gpu_profile
from app.engine.job import Job, ModelFacts, Parallelism, PipelineSchedule
from app.engine.memory import (
    MAX_MICROBATCH,
    check_job_memory,
    max_microbatch,
    memory_bytes,
    setup_for_job,
)

from ..deps import Services, ServicesDep, require
from ..problems import Problem
from ..schemas import AdviceIn, AdviceOut

router = APIRouter(prefix="/v1/advice", tags=["advice"])


@contextmanager
def numbers_in_range() -> Iterator[None]:
    """Each number may be finite while the memory model's products are not (e.g.
    `parameters: 1e308` times bytes per parameter): that is the caller's input, a 422."""
    try:
        yield
    except (OverflowError, ZeroDivisionError) as exc:
        detail = f"the memory model overflows with these numbers ({exc}); use realistic sizes"
        raise Problem(
            422,
            "Numbers out of range",
            detail,
            kind="out-of-range",
            extra={"errors": [{"field": "body.model", "message": detail, "type": "out_of_range"}]},
        ) from exc


@router.post(
    "/batch-size",
    response_model=AdviceOut,
    summary="Largest micro-batch that fits",
    operation_id="adviseBatchSize",
)
async def advise_batch_size(
    body: AdviceIn, services: ServicesDep, _scope: Annotated[Any, require("launcher")]
) -> JSONResponse:
    """M(b) = M_fixed + M_activation(b) + M_gradient(b) per GPU; the largest b that fits.

    When even b = 1 does not fit, `fits` is false, `max_microbatch` 0 and the
    breakdown is that of b = 1. Activations follow the pipeline `schedule`:
    GPipe (the default) holds every micro-batch of the iteration in flight, 1F1B
    at most pp. Without `model.hidden_size`, `num_layers` and `seq_len` nothing in
    M(b) grows with b: the answer is then `max_microbatch` 65,536 (no bound from
    memory), `activations_known: false` and a `detail` naming the missing facts.
    """
    m, par = body.model, body.parallelism
    # the job this model and split describe, judged as admission judges it (TP across the
    # server's GPUs unless the body says otherwise)
    job = Job(
        "advice",
        Parallelism(dp=par.dp, pp=par.pp, ep=par.ep),
        model=ModelFacts(**m.model_dump(exclude_none=True)),
        schedule=PipelineSchedule(body.schedule),
    )
    zero_stage = m.zero_stage if m.zero_stage is not None else services.settings.default_zero_stage
    tp = par.tp if par.tp is not None else services.cluster.gpus_per_server
    setup = setup_for_job(job, tp=tp, zero_stage=zero_stage)
    assert setup is not None  # parameters are required here
    gpu_memory = body.gpu_memory_bytes or gpu_memory_bytes(services)
    with numbers_in_range():
        first = memory_bytes(setup, 1)
        if not setup.activations_grow and first.total <= gpu_memory:
            # nothing known grows with b: memory sets no bound (and the answer says so,
            # naming the facts that would give one; it used to answer 65,536 silently)
            missing = [f for f in ("hidden_size", "num_layers", "seq_len") if getattr(m, f) is None]
            return JSONResponse(
                {
                    "max_microbatch": MAX_MICROBATCH,
                    "memory_bytes": first.as_dict(),
                    "fits": True,
                    "activations_known": False,
                    "detail": "activations unknown: memory bounds no micro-batch; state "
                    + ", ".join(f"model.{f}" for f in missing)
                    + " for a bound",
                }
            )
        advice = max_microbatch(setup, gpu_memory)
    return JSONResponse(
        {
            "max_microbatch": advice.max_microbatch,
            "memory_bytes": advice.memory_bytes.as_dict(),
            "fits": advice.fits,
            "activations_known": setup.activations_grow,
        }
    )


def gpu_memory_bytes(services: Services) -> float:
    """Memory per GPU admission assumes: LIGHTPATH_GPU_MEMORY_BYTES, else the GPU model's."""
    stated = services.settings.gpu_memory_bytes
    return stated or gpu_profile(services.cluster.gpu_model).memory_bytes


def refuse_if_out_of_memory(services: Services, job: Job) -> None:
    """Admission: a job whose stated plan cannot fit GPU memory gets 422 and the breakdown."""
    settings = services.settings
    gpu_memory = gpu_memory_bytes(services)
    with numbers_in_range():
        check = check_job_memory(
            job,
            gpu_memory,
            tp=services.cluster.gpus_per_server,
            zero_stage=settings.default_zero_stage,
        )
    if check is None or check.fits:
        return
    raise Problem(
        422,
        "Job does not fit GPU memory",
        "; ".join(check.reasons),
        kind="out-of-memory",
        extra={
            "reasons": list(check.reasons),
            "errors": [
                {"field": "body.model", "message": check.reasons[0], "type": "out_of_memory"}
            ],
            "memory_bytes": check.memory_bytes.as_dict(),
            "gpu_memory_bytes": gpu_memory,
            "microbatch": check.microbatch,
        },
    )

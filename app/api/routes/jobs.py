"""Job lifecycle: arrival, status (with long-poll), listing, completion."""

from __future__ import annotations

import hashlib
import json
import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from app.engine.placement import never_fits
from app.store import JobRecord
from app.store.mapping import job_from_body

from ..deps import Services, ServicesDep, require
from ..problems import Problem
from ..schemas import JOB_ID_PATTERN, JobIn, JobListOut, JobOut
from .advice import refuse_if_out_of_memory

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

JobIdPath = Annotated[str, Path(pattern=JOB_ID_PATTERN, description="the launcher's job id")]
_STATE_RANK = {"queued": 0, "placed": 1, "completed": 2, "failed": 2}
_PROBLEMS = {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}


def _iso(value: Any) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value is not None else None


def render_job(record: JobRecord) -> dict[str, Any]:
    """The `GET /v1/jobs/{id}` body for a stored job."""
    body = record.body
    return {
        "job_id": record.job_id,
        "state": record.state,
        "submitted_at": _iso(record.submitted_at),
        "placed_at": _iso(record.placed_at),
        "completed_at": _iso(record.completed_at),
        "parallelism": body["parallelism"],
        "priority": body.get("priority", 0),
        "deadline": body.get("deadline"),
        "queue_reason": record.queue_reason if record.state == "queued" else None,
        "placement": record.placement,
        "collective": _public_collective(record.collective),
        "network": (record.collective or {}).get("network") if record.state == "placed" else None,
    }


def _public_collective(stored: dict[str, Any] | None) -> dict[str, Any] | None:
    """The stored collective without the worker's bookkeeping (grants, network view)."""
    if stored is None:
        return None
    return {k: v for k, v in stored.items() if k not in ("aggregator_grants", "network", "fabric")}


def body_hash(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


async def wait_for_job(
    services: Services, job_id: str, reached: Any, timeout_s: float
) -> JobRecord | None:
    """Re-read the job until `reached(record)` or the timeout; woken by worker notices."""
    deadline = time.monotonic() + timeout_s
    poll_s = 0.02
    while True:
        record = await run_in_threadpool(services.store.get_job, job_id)
        remaining = deadline - time.monotonic()
        if record is None or reached(record) or remaining <= 0:
            return record
        await services.waiters.wait(job_id, min(remaining, poll_s))
        poll_s = min(poll_s * 2, 0.5)


@router.post(
    "",
    status_code=201,
    response_model=JobOut,
    summary="A job arrives",
    responses={
        200: {"model": JobOut, "description": "this job_id exists with the same body"},
        202: {"model": JobOut, "description": "accepted and queued"},
        409: {"description": "this job_id exists with a different body", "content": _PROBLEMS},
        422: {"description": "invalid, or can never fit this cluster", "content": _PROBLEMS},
    },
)
async def submit_job(
    job: JobIn, services: ServicesDep, _scope: Annotated[Any, require("launcher")]
) -> JSONResponse:
    """Submit a job; 201 if placed at once, 202 if queued, idempotent by `job_id`.

    The request is durable once answered. The call waits briefly (at most
    `LIGHTPATH_ADMIT_WAIT_S`) for the scheduler's first decision.
    """
    body = job.stored_body()
    digest = body_hash(body)
    engine_job = job_from_body(job.job_id, body, 0)
    reasons = never_fits(services.cluster, engine_job)
    if reasons:
        raise Problem(
            422,
            "Job can never fit",
            "; ".join(reasons),
            kind="never-fits",
            extra={
                "reasons": list(reasons),
                "servers_needed": engine_job.servers_needed,
                "cluster_servers": services.cluster.server_count,
            },
        )
    refuse_if_out_of_memory(services, engine_job)
    record, created = await run_in_threadpool(
        services.store.submit_job,
        job.job_id,
        body,
        digest,
        servers_needed=engine_job.servers_needed,
        priority=job.priority,
        deadline=body.get("deadline"),
    )
    if not created:
        if record.body_hash != digest:
            raise Problem(
                409,
                "Job id in use",
                f"job {job.job_id} exists with a different body; choose a new job_id",
                kind="conflict",
            )
        return JSONResponse(render_job(record), status_code=200)
    services.extras["kick_relay"]()
    settled = await wait_for_job(
        services,
        job.job_id,
        lambda r: r.state != "queued" or r.examined,
        services.settings.admit_wait_s,
    )
    assert settled is not None
    return JSONResponse(render_job(settled), status_code=201 if settled.state == "placed" else 202)


@router.get(
    "/{job_id}",
    response_model=JobOut,
    summary="A job's state, optionally long-polled",
    responses={404: {"description": "unknown job", "content": _PROBLEMS}},
)
async def get_job(
    job_id: JobIdPath,
    services: ServicesDep,
    _scope: Annotated[Any, require("launcher")],
    wait_for: Annotated[
        Literal["placed", "completed", "failed"] | None,
        Query(description="answer as soon as the job reaches this state (or later)"),
    ] = None,
    timeout_s: Annotated[float, Query(ge=0, le=300, allow_inf_nan=False)] = 30.0,
) -> Response:
    """The job now, or, with `wait_for`, as soon as it reaches that state or at the timeout."""
    if wait_for is None:
        cache = services.read_cache
        cached = cache.get(job_id)
        if cached is not None:
            return Response(cached, media_type="application/json")
        generation = cache.generation()
        record = services.store.get_job(job_id)
        if record is not None:
            view = json.dumps(render_job(record), separators=(",", ":")).encode()
            cache.put(job_id, view, generation)
            return Response(view, media_type="application/json")
    else:
        target = _STATE_RANK[wait_for]
        record = await wait_for_job(
            services, job_id, lambda r: _STATE_RANK[r.state] >= target, timeout_s
        )
        services.read_cache.invalidate([job_id])  # this read is newer than any cached view
    if record is None:
        raise Problem(404, "Not found", f"no job {job_id}", kind="unknown-job")
    return JSONResponse(render_job(record))


@router.get("", response_model=JobListOut, summary="Jobs, optionally by state")
async def list_jobs(
    services: ServicesDep,
    _scope: Annotated[Any, require("launcher")],
    state: Literal["queued", "placed", "completed", "failed"] | None = None,
    after: Annotated[int, Query(ge=0, description="submission order to start after")] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> JSONResponse:
    """Jobs in submission order, a page at a time."""
    records = await run_in_threadpool(
        services.store.list_jobs, state, after_order=after, limit=limit
    )
    next_after = records[-1].submitted_order if len(records) == limit else None
    return JSONResponse({"jobs": [render_job(r) for r in records], "next": next_after})


@router.post(
    "/{job_id}/complete",
    response_model=JobOut,
    summary="A job finished",
    responses={404: {"description": "unknown job", "content": _PROBLEMS}},
)
async def complete_job(
    job_id: JobIdPath, services: ServicesDep, _scope: Annotated[Any, require("launcher")]
) -> JSONResponse:
    """Free the job's servers, ports and aggregators and let queued jobs in. Idempotent."""
    record = await run_in_threadpool(services.store.complete_job, job_id)
    services.read_cache.invalidate([job_id])
    if record is None:
        raise Problem(404, "Not found", f"no job {job_id}", kind="unknown-job")
    services.extras["kick_relay"]()
    return JSONResponse(render_job(record))

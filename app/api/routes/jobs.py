"""Job lifecycle: arrival, status (with long-poll), listing, and its endings.

A job ends once: completed (its command exited 0), failed (a non-zero exit,
or a heartbeat lease that ran out), or cancelled (DELETE). Every ending frees
the job's servers in the same transaction and is idempotent: asking for the
ending a job already has answers 200 with the job unchanged; asking for a
different one answers 409 with the job's state.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Annotated, Any, Literal
from urllib.parse import quote

from fastapi import APIRouter, Body, Path, Query, Request
from fastapi.responses import JSONResponse, Response
from sqlalchemy.exc import OperationalError
from starlette.concurrency import run_in_threadpool

from app.engine.job import Job, JobState
from app.engine.job_lease import JobLease, lease_deadline
from app.engine.placement import never_fits
from app.engine.queue import needs_servers
from app.job_body import JOB_ID_PATTERN, JobIn, job_from_body
from app.store import JobRecord

from ..deps import Services, ServicesDep, require
from ..problems import Problem
from ..schemas import EmptyIn, FailIn, JobListOut, JobOut
from ..waiters import Watch
from .advice import refuse_if_out_of_memory

log = logging.getLogger("lightpath.api")

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

JobIdPath = Annotated[
    str,
    Path(
        pattern=JOB_ID_PATTERN,
        description="the launcher's job id (raw or percent-encoded; never contains /)",
    ),
]
_STATE_RANK = {"queued": 0, "placed": 1, "completed": 2, "failed": 2, "cancelled": 2}
_ENDED = 2
ENDED_MAX_POLL_S = 2.0
_PROBLEMS = {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}
_ENDING_RESPONSES: dict[int | str, dict[str, Any]] = {
    403: {"description": "a launcher token that did not submit this job", "content": _PROBLEMS},
    404: {"description": "unknown job", "content": _PROBLEMS},
    409: {"description": "the job already ended differently", "content": _PROBLEMS},
}


def job_location(job_id: str) -> str:
    """The job's URL path, as the `Location` header of 201/202 carries it."""
    return "/v1/jobs/" + quote(job_id, safe=":@+")


def token_owner(request: Request) -> str | None:
    """A fingerprint of the caller's bearer token (never the token itself); None without one."""
    scheme, _, presented = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not presented.strip():
        return None
    return hashlib.sha256(presented.strip().encode()).hexdigest()[:32]


def _iso(value: Any) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value is not None else None


def render_job(record: JobRecord) -> dict[str, Any]:
    """The `GET /v1/jobs/{id}` body for a stored job."""
    body = record.body
    expires = None
    if record.lease_s is not None and record.state == "placed" and record.placed_at is not None:
        lease = JobLease(
            record.job_id,
            record.lease_s,
            record.placed_at.timestamp(),
            record.heartbeat_at.timestamp() if record.heartbeat_at is not None else None,
        )
        expires = dt.datetime.fromtimestamp(lease_deadline(lease), dt.UTC)
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
        "exit_code": record.exit_code,
        "end_reason": record.end_reason,
        "lease_s": record.lease_s,
        "lease_expires_at": _iso(expires),
        "walltime_s": body.get("walltime_s"),
        "schedule": body.get("schedule") or "gpipe",
    }


def _public_collective(stored: dict[str, Any] | None) -> dict[str, Any] | None:
    """The stored collective without the worker's bookkeeping (grants, network view)."""
    if stored is None:
        return None
    return {k: v for k, v in stored.items() if k not in ("aggregator_grants", "network", "fabric")}


def body_hash(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


async def wait_for_job(
    services: Services,
    job_id: str,
    reached: Any,
    timeout_s: float,
    *,
    known: JobRecord | None = None,
    watch: Watch | None = None,
    max_poll_s: float = 0.5,
) -> JobRecord | None:
    """Re-read the job until `reached(record)` or the timeout; woken by worker notices.

    Subscribed before the first read (or by the caller, `watch`, before its own
    write), so a notice between a read and the wait is not lost. `known`: the
    job as it stands now, saving the first read. Without a notice the job is
    re-read after 0.05 s, then at doubling intervals up to `max_poll_s` (a
    fallback for a lost notice: it bounds the answer's lateness then).
    """
    if watch is None:
        with services.waiters.watch(job_id) as watch:
            return await wait_for_job(
                services,
                job_id,
                reached,
                timeout_s,
                known=known,
                watch=watch,
                max_poll_s=max_poll_s,
            )
    deadline = time.monotonic() + timeout_s
    poll_s = 0.05  # a fallback: notices wake the waiter sooner
    record = known
    while True:
        if record is None:
            record = await run_in_threadpool(services.store.get_job, job_id)
        remaining = deadline - time.monotonic()
        if record is None or reached(record) or remaining <= 0 or services.waiters.closing:
            return record
        await watch.wait(min(remaining, poll_s))
        poll_s = min(poll_s * 2, max_poll_s)
        record = None


_LOCATION = {"Location": {"description": "the job's URL", "schema": {"type": "string"}}}
_SUBMITTED = {
    **_LOCATION,
    "Server-Timing": {
        "description": "milliseconds this API spent on the request: `store` (the durable "
        "write) and `decide` (waiting for the scheduler's first decision)",
        "schema": {"type": "string"},
    },
}


@router.post(
    "",
    status_code=201,
    response_model=JobOut,
    summary="A job arrives",
    operation_id="submitJob",
    responses={
        200: {"model": JobOut, "description": "this job_id exists with the same body"},
        201: {
            "description": "placed at once; `collective` and `network` are null until the "
            "fabric pass, tens of milliseconds later (`GET ...?wait_for=placed` waits for "
            "them)",
            "headers": _SUBMITTED,
        },
        202: {"model": JobOut, "description": "accepted and queued", "headers": _SUBMITTED},
        403: {
            "description": "this job_id exists, submitted with another launcher token",
            "content": _PROBLEMS,
        },
        409: {"description": "this job_id exists with a different body", "content": _PROBLEMS},
        422: {"description": "invalid, or can never fit this cluster", "content": _PROBLEMS},
    },
)
async def submit_job(
    job: JobIn,
    request: Request,
    services: ServicesDep,
    scope: Annotated[Any, require("launcher")],
) -> JSONResponse:
    """Submit a job; 201 if placed at once, 202 if queued, idempotent by `job_id`
    (200: the job as it stands; 403 `not-owner` to a launcher token other than the one
    that submitted it, which would otherwise run ranks on the same servers).

    The request is durable once answered. The call waits briefly (at most
    `LIGHTPATH_ADMIT_WAIT_S`) for the scheduler's first decision, except for a job
    needing more servers than are free now: 202 at once, `queue_reason` saying so.
    """
    body = job.stored_body()
    digest = body_hash(body)
    engine_job = job_from_body(job.job_id, body, 0)
    try:
        _refuse_if_it_cannot_run(services, engine_job)
    except Problem:
        # a job stored before (on a larger cluster: the service restarted on another
        # file) is answered as it stands, as any submit of an existing id is
        existing = await run_in_threadpool(services.store.get_job, job.job_id)
        if existing is None:
            raise
        return _resubmitted(existing, digest, request, scope)
    # subscribed before the write: the worker may place the job before we wait
    sender = services.direct_sender()
    started = time.perf_counter()
    with services.waiters.watch(job.job_id) as placed:
        record, created = await run_in_threadpool(
            partial(
                services.store.submit_job,
                job.job_id,
                body,
                digest,
                servers_needed=engine_job.servers_needed,
                priority=job.priority,
                deadline=body.get("deadline"),
                owner=token_owner(request) if scope is not None else None,
                publish=sender,
            )
        )
        if not created:
            return _resubmitted(record, digest, request, scope)
        if sender is None:
            services.kick_relay()
        stored = time.perf_counter()
        try:
            settled = await _first_decision(services, record, engine_job, placed)
        except OperationalError as exc:
            # the job is stored: a read after the commit that fails (a dropped pooled
            # connection) must not answer 503 "nothing was done"; the job as written
            log.warning(
                "job stored; its first decision not read",
                extra={"job_id": job.job_id, "error": type(exc).__name__},
            )
            settled = record
    decided = time.perf_counter()
    return JSONResponse(
        render_job(settled),
        status_code=201 if settled.state == "placed" else 202,
        headers={
            "Location": job_location(job.job_id),
            # where the time went: the durable write, then the wait for the scheduler
            "Server-Timing": f"store;dur={(stored - started) * 1000:.1f}, "
            f"decide;dur={(decided - stored) * 1000:.1f}",
        },
    )


def _refuse_if_it_cannot_run(services: Services, engine_job: Job) -> None:
    """422 for a job this cluster can never hold, or whose stated plan cannot fit GPU
    memory."""
    reasons = never_fits(services.cluster, engine_job)
    if reasons:
        raise Problem(
            422,
            "Job can never fit",
            "; ".join(reasons),
            kind="never-fits",
            extra={
                "reason": "; ".join(reasons),  # the contract's "422 and a reason"
                "reasons": list(reasons),
                "errors": [
                    {"field": "body.parallelism", "message": r, "type": "never_fits"}
                    for r in reasons
                ],
                "servers_needed": engine_job.servers_needed,
                "cluster_servers": services.cluster.server_count,
            },
        )
    refuse_if_out_of_memory(services, engine_job)


def _resubmitted(record: JobRecord, digest: str, request: Request, scope: Any) -> JSONResponse:
    """A submit of an id already stored: 200 with the job as it stands for the same body,
    403 to another launcher, 409 for a different body."""
    _refuse_foreign(record, request, scope)
    if record.body_hash != digest:
        raise Problem(
            409,
            "Job id in use",
            f"job {record.job_id} exists with a different body; choose a new job_id",
            kind="conflict",
        )
    return JSONResponse(render_job(record), status_code=200)


async def _first_decision(
    services: Services, record: JobRecord, engine_job: Job, placed: Watch
) -> JobRecord:
    """The new job after the scheduler's first look, waited for at most
    `admit_wait_s`; at once when too few servers are free for it (it is queued
    whatever a pass would add; the worker still gets its message). A placed job's
    `collective` and `network` come with the fabric pass, tens of milliseconds
    later: waiting for them here cost every arrival 15 ms (bench_api.py's p50 at 300
    running went 6.2 -> 22.6 ms); `wait_for=placed` waits for them."""
    job_id = record.job_id
    now, free = await run_in_threadpool(
        services.store.job_and_free_servers, job_id, services.cluster.server_count
    )
    if now is not None and now.state == "queued" and free < engine_job.servers_needed:
        return replace(
            now, queue_reason=now.queue_reason or needs_servers(engine_job.servers_needed, free)
        )
    settled = await wait_for_job(
        services,
        job_id,
        lambda r: r.state != "queued" or r.examined,
        services.settings.admit_wait_s,
        known=now or record,
        watch=placed,
    )
    return settled or record


@router.get(
    "/{job_id}",
    response_model=JobOut,
    summary="A job's state, optionally long-polled",
    operation_id="getJob",
    responses={404: {"description": "unknown job", "content": _PROBLEMS}},
)
async def get_job(
    job_id: JobIdPath,
    services: ServicesDep,
    _scope: Annotated[Any, require("launcher")],
    wait_for: Annotated[
        Literal["queued", "placed", "completed", "failed", "cancelled"] | None,
        Query(
            description="answer as soon as the job reaches this state or later (any ended "
            "state counts for completed, failed and cancelled; every state is `queued` or "
            "later, so `queued` answers at once; `placed` also waits, at most "
            "2 s, for the fabric pass's `collective` and `network`); may answer earlier, at "
            "timeout_s, with the state then: loop until the state or your own deadline"
        ),
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
        record = await run_in_threadpool(services.store.get_job, job_id)
        if record is not None:
            view = json.dumps(render_job(record), separators=(",", ":")).encode()
            cache.put(job_id, view, generation)
            return Response(view, media_type="application/json")
    else:
        # a launcher's heartbeat holds a long-poll for its job's end all the job's life
        # (one per running job): those re-read the job less often without a notice
        max_poll_s = 0.5 if _STATE_RANK[wait_for] < _ENDED else ENDED_MAX_POLL_S
        record = await wait_for_job(
            services, job_id, _reached(wait_for), timeout_s, max_poll_s=max_poll_s
        )
        services.read_cache.invalidate([job_id])  # this read is newer than any cached view
    if record is None:
        raise Problem(404, "Not found", f"no job {job_id}", kind="unknown-job")
    return JSONResponse(render_job(record))


# a just-placed job's `collective` and `network` come from the fabric pass tens of
# milliseconds after its placement: `wait_for=placed` waits this long for them
PLAN_WAIT_S = 2.0


def _reached(wait_for: str) -> Callable[[JobRecord], bool]:
    """Whether a record answers `wait_for`: that state or a later one; for `placed`,
    with the fabric pass's plan (`collective`, `network`) or after PLAN_WAIT_S
    without it (a fabric process that is down must not hold the launcher)."""
    target = _STATE_RANK[wait_for]
    placed_seen: float | None = None

    def reached(record: JobRecord) -> bool:
        nonlocal placed_seen
        if _STATE_RANK[record.state] < target:
            return False
        if wait_for != "placed" or record.state != "placed" or record.collective is not None:
            return True
        now = time.monotonic()
        placed_seen = now if placed_seen is None else placed_seen
        return now - placed_seen >= PLAN_WAIT_S

    return reached


@router.get(
    "", response_model=JobListOut, summary="Jobs, optionally by state", operation_id="listJobs"
)
async def list_jobs(
    services: ServicesDep,
    _scope: Annotated[Any, require("launcher")],
    state: Literal["queued", "placed", "completed", "failed", "cancelled"] | None = None,
    after: Annotated[
        int, Query(ge=0, le=2**63 - 1, description="submission order to start after")
    ] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> JSONResponse:
    """Jobs in submission order (the order they were stored, the queue's first-come
    order), a page at a time. `submitted_at` is read when a request arrives, so jobs
    sent together by several launchers can list a few ms out of `submitted_at` order."""
    # one row past the page says whether another page follows: `next` is null on the last
    records = await run_in_threadpool(
        services.store.list_jobs, state, after_order=after, limit=limit + 1
    )
    page = records[:limit]
    next_after = page[-1].submitted_order if len(records) > limit else None
    return JSONResponse({"jobs": [render_job(r) for r in page], "next": next_after})


def _refuse_foreign(record: JobRecord, request: Request, scope: str | None) -> None:
    """403 when a launcher token acts on a job another token submitted (operators may)."""
    if scope not in (None, "operator") and record.owner not in (None, token_owner(request)):
        raise Problem(
            403,
            "Forbidden",
            f"job {record.job_id} was submitted with another token",
            kind="not-owner",
        )


async def _check_owner(
    services: Services, request: Request, scope: str | None, job_id: str
) -> None:
    """404 for an unknown job; 403 when a launcher token ends a job another token submitted."""
    record = await run_in_threadpool(services.store.get_job, job_id)
    if record is None:
        raise Problem(404, "Not found", f"no job {job_id}", kind="unknown-job")
    _refuse_foreign(record, request, scope)


async def _end(
    services: Services,
    request: Request,
    scope: str | None,
    job_id: str,
    state: JobState,
    *,
    from_states: tuple[JobState, ...] = (JobState.QUEUED, JobState.PLACED),
    exit_code: int | None = None,
    reason: str | None = None,
) -> JSONResponse:
    """End a job once (see the module doc); launcher tokens may end only their own jobs."""
    await _check_owner(services, request, scope, job_id)
    record = await run_in_threadpool(
        services.store.end_job,
        job_id,
        state,
        from_states=from_states,
        exit_code=exit_code,
        reason=reason,
    )
    services.read_cache.invalidate([job_id])
    assert record is not None
    if record.state != state.value:
        if record.state == JobState.QUEUED.value:
            detail = f"job {job_id} is queued and never ran; DELETE /v1/jobs/{job_id} cancels it"
        else:
            detail = f"job {job_id} already ended: {record.state}"
        raise Problem(
            409, "Job state conflict", detail, kind="job-state", extra={"job": render_job(record)}
        )
    services.kick_relay()
    return JSONResponse(render_job(record))


@router.post(
    "/{job_id}/complete",
    response_model=JobOut,
    summary="A job finished",
    operation_id="completeJob",
    responses=_ENDING_RESPONSES,
)
async def complete_job(
    job_id: JobIdPath,
    request: Request,
    services: ServicesDep,
    scope: Annotated[Any, require("launcher")],
    _body: Annotated[EmptyIn | None, Body()] = None,
) -> JSONResponse:
    """Free the placed job's servers, ports and aggregators and let queued jobs in.

    Idempotent. A queued job cannot complete (409: cancel it with DELETE). No body,
    or `{}` (malformed JSON 400, fields 422).
    """
    return await _end(
        services, request, scope, job_id, JobState.COMPLETED, from_states=(JobState.PLACED,)
    )


@router.delete(
    "/{job_id}",
    response_model=JobOut,
    summary="Cancel a queued or placed job",
    operation_id="cancelJob",
    responses=_ENDING_RESPONSES,
)
async def cancel_job(
    job_id: JobIdPath,
    request: Request,
    services: ServicesDep,
    scope: Annotated[Any, require("launcher")],
    _body: Annotated[EmptyIn | None, Body()] = None,
) -> JSONResponse:
    """State `cancelled`; a placed job's servers, ports and aggregators are freed. Idempotent.
    No body, or `{}` (malformed JSON 400, fields 422: the job is not cancelled)."""
    return await _end(services, request, scope, job_id, JobState.CANCELLED, reason="cancelled")


@router.post(
    "/{job_id}/fail",
    response_model=JobOut,
    summary="A job's command failed",
    operation_id="failJob",
    responses=_ENDING_RESPONSES,
)
async def fail_job(
    job_id: JobIdPath,
    request: Request,
    services: ServicesDep,
    scope: Annotated[Any, require("launcher")],
    body: Annotated[FailIn | None, Body()] = None,
) -> JSONResponse:
    """State `failed` with the exit code and reason (both optional, the body too); resources
    freed. Idempotent (the first exit code and reason stay)."""
    body = body or FailIn()
    return await _end(
        services,
        request,
        scope,
        job_id,
        JobState.FAILED,
        exit_code=body.exit_code,
        reason=body.reason or (f"exit {body.exit_code}" if body.exit_code is not None else None),
    )


@router.post(
    "/{job_id}/heartbeat",
    response_model=JobOut,
    summary="The launcher is alive: renew the job's lease",
    operation_id="heartbeatJob",
    responses=_ENDING_RESPONSES,
)
async def heartbeat_job(
    job_id: JobIdPath,
    request: Request,
    services: ServicesDep,
    scope: Annotated[Any, require("launcher")],
    _body: Annotated[EmptyIn | None, Body()] = None,
) -> JSONResponse:
    """Renews `lease_s` from now. 409 once the job ended (e.g. its lease ran out, or an operator
    cancelled it): the launcher should stop its command. No body, or `{}` (malformed JSON
    400, fields 422)."""
    await _check_owner(services, request, scope, job_id)
    record = await run_in_threadpool(services.store.heartbeat_job, job_id)
    services.read_cache.invalidate([job_id])
    assert record is not None
    if JobState(record.state).ended:
        raise Problem(
            409,
            "Job state conflict",
            f"job {job_id} already ended: {record.state}"
            + (f" ({record.end_reason})" if record.end_reason else ""),
            kind="job-state",
            extra={"job": render_job(record)},
        )
    return JSONResponse(render_job(record))

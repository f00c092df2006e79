"""Traffic-demand reports from the network, and what the cycle predictor made of them."""

from __future__ import annotations

import asyncio
import math
import operator
from typing import Annotated, Any, NoReturn

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from app.store.traffic_repository import IdempotencyConflict, Replayed

from ..bodies import read_json_body
from ..deps import ServicesDep, require
from ..openapi import json_body
from ..problems import Problem
from ..schemas import DeadLetterPage, PredictionOut, TrafficAccepted, TrafficIn
from .jobs import JobIdPath

router = APIRouter(prefix="/v1", tags=["telemetry"])


# A phase's bytes, summed over its demands, must stay far from float overflow: the
# engine sums them per pod pair and divides and takes logs of the sums. 1e30 bytes
# (a million yottabytes) is beyond any real phase.
MAX_REPORT_BYTES = 1e30


def _stored_reports(known: frozenset[str], batch: TrafficIn) -> list[dict[str, Any]]:
    """Each report as stored (demands as (src, dst, bytes) tuples); refuses the batch on
    unknown servers, a demand from a server to itself, or bytes summing past
    `MAX_REPORT_BYTES`.

    A report is checked with set and sequence operations over its columns (no
    Python step per demand); only a refused batch is walked demand by demand to
    name every offending field.
    """
    reports = []
    for report in batch.reports:
        demands = [(d.src, d.dst, d.bytes) for d in report.demands]
        srcs, dsts, sizes = zip(*demands, strict=True)
        total = sum(sizes)  # inf past float range
        if not (
            total <= MAX_REPORT_BYTES
            and known.issuperset(srcs)
            and known.issuperset(dsts)
            and not any(map(operator.eq, srcs, dsts))
        ):
            _refuse(known, batch)
        reports.append(
            {
                "job_id": report.job_id,
                "phase_started_at": report.phase_started_at,
                "demands": demands,
            }
        )
    return reports


def _refuse(known: frozenset[str], batch: TrafficIn) -> NoReturn:
    """422 naming every demand of `batch` that names an unknown server or a server to
    itself, and every report whose bytes sum past `MAX_REPORT_BYTES`."""
    errors = []
    for i, report in enumerate(batch.reports):
        total = sum(d.bytes for d in report.demands)  # inf past float range
        if not total <= MAX_REPORT_BYTES:
            errors.append(
                {
                    "field": f"body.reports.{i}.demands",
                    "message": f"the report's bytes sum to {total:g}, over {MAX_REPORT_BYTES:g}",
                    "type": "too_many_bytes",
                }
            )
        for k, d in enumerate(report.demands):
            for end in ("src", "dst"):
                if getattr(d, end) not in known:
                    errors.append(
                        {
                            "field": f"body.reports.{i}.demands.{k}.{end}",
                            "message": f"unknown server {getattr(d, end)!r}",
                            "type": "unknown_server",
                        }
                    )
            if d.src == d.dst:
                errors.append(
                    {
                        "field": f"body.reports.{i}.demands.{k}",
                        "message": "a demand joins two different servers",
                        "type": "same_server",
                    }
                )
    raise Problem(
        422,
        "Invalid request",
        f"{len(errors)} demand(s) name unknown servers or a server to itself, or a "
        "report's bytes are out of range; the batch was refused whole",
        kind="validation",
        extra={"errors": errors[:100]},
    )


@router.post(
    "/traffic",
    status_code=202,
    response_model=TrafficAccepted,
    summary="Traffic-demand reports (one report = one communication phase)",
    operation_id="reportTraffic",
    responses={
        202: {"description": "stored durably (a batch is not addressable: no `Location`)"},
        409: {"description": "the `Idempotency-Key` was used before with another batch"},
        422: {"description": "invalid fields, unknown servers; the batch is refused whole"},
    },
    # the body is read from its bytes by pydantic's parser (`read_json_body`), not by a
    # body parameter: json.loads plus validating its objects was ~40% of the API's CPU
    # on a 100 x 10 batch
    openapi_extra=json_body(TrafficIn),
)
async def report_traffic(
    request: Request,
    services: ServicesDep,
    _scope: Annotated[Any, require("telemetry")],
    idempotency_key: Annotated[
        str | None,
        Header(
            min_length=1,
            max_length=200,
            description="retrying a batch with the same key returns the first answer "
            "instead of storing the reports twice",
        ),
    ] = None,
) -> JSONResponse:
    """Store a batch durably and hand it to the worker; accepted or refused as a whole."""
    batch = await read_json_body(request, TrafficIn)
    reports = _stored_reports(services.server_ids, batch)
    metrics = services.metrics
    # group commit: batches arriving together share one transaction and one wake-up
    stored = services.traffic.submit(reports, idempotency_key, services.wake_worker)
    try:
        answer = await asyncio.wrap_future(stored)
    except IdempotencyConflict as exc:
        raise Problem(409, "Idempotency key reused", str(exc), kind="idempotency-conflict") from exc
    count, last = answer
    if not isinstance(answer, Replayed):  # a retry's reports were counted the first time
        metrics.traffic_reports.inc(count)
        metrics.traffic_demands.inc(sum(len(r["demands"]) for r in reports))
    return JSONResponse({"accepted": count, "last_seq": last}, status_code=202)


@router.get(
    "/traffic/dead-letters",
    response_model=DeadLetterPage,
    summary="Traffic reports the engine could not use, with the reason",
    operation_id="listDeadLetters",
)
async def list_dead_letters(
    services: ServicesDep,
    _scope: Annotated[Any, require("telemetry")],
    after: Annotated[int, Query(ge=0, le=2**63 - 1, description="last ord already seen")] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> JSONResponse:
    """Reports set aside by the worker (its cursor moved past them), oldest first."""
    # one row past the page says whether another page follows: `next` is null on the last
    rows = await run_in_threadpool(services.traffic.dead_letters, after, limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    return JSONResponse(
        {
            "dead_letters": [
                {
                    "ord": r.ord,
                    "job_id": r.job_id,
                    "reason": r.reason,
                    "report": _as_posted(r.report),
                    "at": r.at.isoformat().replace("+00:00", "Z") if r.at else None,
                }
                for r in rows
            ],
            "next": rows[-1].ord if more else None,
        }
    )


def _as_posted(report: Any) -> Any:
    """A stored report in the shape it was posted: demands as {src, dst, bytes} objects
    (they are stored as [src, dst, bytes] rows)."""
    if not isinstance(report, dict) or not isinstance(report.get("demands"), list):
        return report
    demands = [
        {"src": d[0], "dst": d[1], "bytes": d[2]} if isinstance(d, list) and len(d) == 3 else d
        for d in report["demands"]
    ]
    return {**report, "demands": demands}


@router.get(
    "/predictions/{job_id}",
    response_model=PredictionOut,
    summary="A job's learned communication cycle",
    operation_id="getPrediction",
)
async def get_prediction(
    job_id: JobIdPath, services: ServicesDep, _scope: Annotated[Any, require()]
) -> JSONResponse:
    """Period, queue of plans, the next plan, and its phases as the switches served them.

    A phase is a hit when the switches had confirmed the topology planned for it
    before it started, held when it ran on a topology the controller chose to
    keep, a miss otherwise; `exposed_reconfig_s` is time phases waited on circuits
    still being switched. A switch that cannot be read confirms nothing, and while
    the switches no longer hold circuits they had confirmed for the job (a switch
    dead or restarted empty) its phases are misses until the circuits are back.
    """
    record = await run_in_threadpool(services.store.get_job, job_id)
    if record is None:
        raise Problem(404, "Not found", f"no job {job_id}", kind="unknown-job")
    row = await run_in_threadpool(services.traffic.prediction, job_id)
    state = row.state if row else {}
    exposed = row.exposed_reconfig_s if row else 0.0
    return JSONResponse(
        {
            "job_id": job_id,
            "algorithm": row.algorithm if row else services.settings.predictor,
            "period": state.get("period"),
            "cycle_count": state.get("cycle_count", 0),
            "queue": state.get("queue", []),
            "next_plan": state.get("next_plan"),
            "installed_plan": state.get("installed_plan"),
            "hits": row.hits if row else 0,
            "misses": row.misses if row else 0,
            "held": int(state.get("held", 0)),
            "exposed_reconfig_s": exposed if math.isfinite(exposed) else None,
        }
    )

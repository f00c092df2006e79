"""The fabric as Lightpath sees it: cluster state and the decision log."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from app.engine.cluster import cluster_to_dict
from app.store import DecisionRecord

from ..deps import ServicesDep, require
from ..schemas import DecisionPage

router = APIRouter(prefix="/v1", tags=["fabric"])


def render_decision(d: DecisionRecord) -> dict[str, Any]:
    out: dict[str, Any] = {
        "seq": d.seq,
        "at": d.at.isoformat().replace("+00:00", "Z"),
        "kind": d.kind,
        "job_id": d.job_id,
        "reason": d.reason,
    }
    out.update(d.payload)
    return out


@router.get("/cluster", summary="The cluster with live free/used state")
async def get_cluster(services: ServicesDep, _scope: Annotated[Any, require()]) -> JSONResponse:
    """Pods, ToRs, servers (free or held by which job) and OXCs, plus totals."""
    snapshot = await run_in_threadpool(services.store.load_snapshot)
    body = cluster_to_dict(services.cluster, snapshot.used)
    total = services.cluster.server_count
    body["summary"] = {
        "servers": total,
        "free_servers": total - len(snapshot.used),
        "gpus": services.cluster.gpu_count,
        "queued_jobs": len(snapshot.queued),
        "placed_jobs": len(snapshot.placed),
    }
    return JSONResponse(body)


@router.get("/decisions", response_model=DecisionPage, summary="The decision log, in seq order")
async def list_decisions(
    services: ServicesDep,
    _scope: Annotated[Any, require()],
    after: Annotated[int, Query(ge=0, description="last seq already processed")] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> JSONResponse:
    """Decisions with seq > `after`, gap-free.

    `next` is the first seq not in this page (the last one + 1): resume with
    `after=next-1`, i.e. the last seq you processed.
    """
    records = await run_in_threadpool(services.store.decisions_after, after, limit)
    next_after = (records[-1].seq if records else after) + 1
    return JSONResponse({"decisions": [render_decision(d) for d in records], "next": next_after})

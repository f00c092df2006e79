"""Mapping between stored JSON and engine values, in one place."""

from __future__ import annotations

from typing import Any

from app.engine.job import (
    Collective,
    ComputeTimes,
    Job,
    ModelFacts,
    Parallelism,
    PipelineSchedule,
    Placement,
    Unit,
)


def job_from_body(job_id: str, body: dict[str, Any], submitted_order: int) -> Job:
    """The engine's Job for a validated `POST /v1/jobs` body."""
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


def placement_to_json(placement: Placement) -> dict[str, Any]:
    return {
        "units": [
            {"server": u.server, "stage": u.stage, "dp_rank": u.dp_rank, "ep_rank": u.ep_rank}
            for u in placement.units
        ],
        "reason": placement.reason,
    }


def placement_from_json(job_id: str, data: dict[str, Any]) -> Placement:
    return Placement(
        job_id,
        tuple(Unit(u["server"], u["stage"], u["dp_rank"], u["ep_rank"]) for u in data["units"]),
        data.get("reason", ""),
    )

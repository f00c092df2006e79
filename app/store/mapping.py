"""Mapping between stored JSON and engine values, in one place."""

from __future__ import annotations

from typing import Any

from app.engine.job import Placement, Unit
from app.job_body import job_from_body

__all__ = ["job_from_body", "placement_from_json", "placement_to_json"]


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

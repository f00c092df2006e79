"""The fabric as Lightpath sees it: cluster state and the decision log."""

from __future__ import annotations

import math
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from app.engine.cluster import cluster_to_dict
from app.engine.cross_connects import CrossConnect, realised_circuits
from app.store import DecisionRecord

from ..deps import Services, ServicesDep, require
from ..schemas import ClusterOut, DecisionPage, TopologyOut

router = APIRouter(prefix="/v1", tags=["fabric"])


def fragmentation_view(cluster: Any, used: dict[str, str]) -> dict[str, Any]:
    """Per pod: free servers, the largest free run inside one ToR, whole free ToRs."""
    out = {}
    for pod in cluster.pods:
        free_per_tor = [sum(1 for s in t.servers if s.id not in used) for t in pod.tors]
        out[pod.id] = {
            "free_servers": sum(free_per_tor),
            "largest_free_tor_block": max(free_per_tor, default=0),
            "free_whole_tors": sum(
                1 for t, n in zip(pod.tors, free_per_tor, strict=True) if n == len(t.servers)
            ),
        }
    return out


def render_decision(d: DecisionRecord) -> dict[str, Any]:
    out: dict[str, Any] = {
        "seq": d.seq,
        "at": d.at.isoformat().replace("+00:00", "Z"),
        "kind": d.kind,
        "job_id": d.job_id,
        "reason": d.reason,
        # every entry has every kind's key, null but its own (a client reading `oxc` of
        # each entry, as the contract's example shows them, met a KeyError)
        "placement": None,
        "oxc": None,
        "routing": None,
    }
    out.update(d.payload)
    return out


@router.get(
    "/cluster",
    response_model=ClusterOut,
    summary="The cluster with live free/used state",
    operation_id="getCluster",
)
async def get_cluster(services: ServicesDep, _scope: Annotated[Any, require()]) -> JSONResponse:
    """Pods, ToRs, servers (free or held by which job) and OXCs, plus totals."""
    snapshot = await run_in_threadpool(services.store.load_snapshot)
    body = cluster_to_dict(services.cluster, snapshot.used)
    total = services.cluster.server_count
    for pod in body["pods"]:
        for tor in pod["tors"]:
            used = snapshot.aggregator_used_gbps.get(tor["id"], 0.0)
            tor["aggregator_used_gbps"] = round(used, 3)
    body["fragmentation"] = fragmentation_view(services.cluster, snapshot.used)
    body["summary"] = {
        "servers": total,
        "free_servers": total - len(snapshot.used),
        "gpus": services.cluster.gpu_count,
        "queued_jobs": len(snapshot.queued),
        "placed_jobs": len(snapshot.placed),
    }
    return JSONResponse(body)


@router.get(
    "/decisions",
    response_model=DecisionPage,
    summary="The decision log, in seq order",
    operation_id="listDecisions",
)
async def list_decisions(
    services: ServicesDep,
    _scope: Annotated[Any, require()],
    after: Annotated[int, Query(ge=0, le=2**63 - 1, description="last seq already processed")] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> JSONResponse:
    """Decisions with seq > `after`, gap-free.

    `next` is the `after` to pass for the next page: the last seq in this page
    (the `after` asked for when there is nothing newer yet).
    """
    records = await run_in_threadpool(services.store.decisions_after, after, limit)
    next_after = records[-1].seq if records else after
    return JSONResponse({"decisions": [render_decision(d) for d in records], "next": next_after})


def _oxc_view(
    pairs: dict[str, list[tuple[int, int, str | None]]],
    health: dict[str, dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    out = []
    for oxc_id, cc in sorted(pairs.items()):
        view: dict[str, Any] = {
            "id": oxc_id,
            "cross_connects": [{"a": a, "b": b, "job_id": job} for a, b, job in sorted(cc)],
        }
        if health is not None:
            # the switch controller's last pass could not read it: these pairs are its
            # last read, not necessarily what it holds now
            since = health.get("unreachable", {}).get(oxc_id)
            view["stale"] = since is not None
            view["unreachable_since"] = since.replace("+00:00", "Z") if since else None
        out.append(view)
    return out


def topology_view(services: Services) -> dict[str, Any]:
    """Confirmed cross-connects (with the job each serves) and desired where they differ."""
    repo = services.fabric
    cluster = services.cluster
    desired = repo.load_desired()
    owner = {cc.key: cc.job_id for cc in desired}
    confirmed = repo.load_confirmed()
    confirmed_ccs = [
        CrossConnect(o, a, b, owner.get((o, a, b), ""))
        for o, c in confirmed.items()
        for a, b in c.cross_connects
    ]
    confirmed_pairs: dict[str, list[tuple[int, int, str | None]]] = {o.id: [] for o in cluster.oxcs}
    for cc in confirmed_ccs:  # a switch the cluster lost is shown until the worker forgets it
        confirmed_pairs.setdefault(cc.oxc_id, []).append((cc.port_a, cc.port_b, cc.job_id or None))
    health = repo.fact("switches") or {}
    oxcs = _oxc_view(confirmed_pairs, health)
    body: dict[str, Any] = {
        "pod_circuits": realised_circuits(cluster, confirmed_ccs).to_dict(),
        "oxcs": oxcs,
        "stale": any(o["stale"] for o in oxcs),
        "failed_ports": {o: sorted(c.failed_ports) for o, c in confirmed.items() if c.failed_ports},
    }
    facts = repo.fact("fabric") or {}
    mlu = facts.get("mlu")
    # a fact stored before infinity was kept out of it (JSON has none)
    body["mlu"] = mlu if isinstance(mlu, int | float) and math.isfinite(mlu) else None
    body["time_division"] = facts.get("time_division", [])
    if {cc.key for cc in desired} != {cc.key for cc in confirmed_ccs}:
        desired_pairs: dict[str, list[tuple[int, int, str | None]]] = {
            o.id: [] for o in cluster.oxcs
        }
        for cc in desired:
            desired_pairs.setdefault(cc.oxc_id, []).append((cc.port_a, cc.port_b, cc.job_id))
        body["desired"] = {
            "pod_circuits": realised_circuits(cluster, desired).to_dict(),
            "oxcs": _oxc_view(desired_pairs),
        }
    return body


@router.get(
    "/topology",
    response_model=TopologyOut,
    summary="Cross-connects the switches confirmed, and desired ones",
    operation_id="getTopology",
)
async def get_topology(services: ServicesDep, _scope: Annotated[Any, require()]) -> JSONResponse:
    """What the OXCs hold now (as last confirmed), `desired` where it differs, MLU."""
    return JSONResponse(await run_in_threadpool(topology_view, services))

"""The fabric handler: after placements change, plan collectives, circuits and routing.

Level-triggered like the scheduler: it compares the placed jobs and failed
ports it reads now with those of its last pass and re-plans only when they
differ. The previous plan is kept in memory so unchanged jobs keep their
cross-connects; after a restart the desired state in the database plays that
role (the engine changes as few cross-connects as possible relative to it).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from app.engine.circuits import PodCircuits
from app.engine.cluster import Cluster, without_failed_ports
from app.engine.collective import AggregatorGrant, AggregatorLedger, CollectiveChoice
from app.engine.fabric import Decision, FabricPlan, PlacedJob, diff_plans, plan_fabric
from app.store import NewDecision
from app.store.fabric_repository import FabricRepository, PlacedJobRow

log = logging.getLogger("lightpath.worker")


@dataclass(frozen=True, slots=True)
class FabricPassResult:
    planned: bool
    decision_seqs: tuple[int, ...]
    changed_jobs: tuple[str, ...]


def collective_json(choice: CollectiveChoice, job_mode: str, why: str) -> dict[str, Any]:
    """The job's `collective` field, with the aggregator grants that back it."""
    out = choice.to_dict()
    out["aggregator_grants"] = [{"tor": g.tor_id, "gbps": g.gbps} for g in choice.grants]
    out["fabric"] = {"mode": job_mode, "reason": why}
    return out


def _ledger_from_rows(rows: list[PlacedJobRow]) -> AggregatorLedger:
    grants = []
    for row in rows:
        for g in (row.collective or {}).get("aggregator_grants", []):
            grants.append(AggregatorGrant(g["tor"], row.job.job_id, float(g["gbps"])))
    return AggregatorLedger(tuple(grants))


def decision_payload(d: Decision) -> NewDecision:
    payload: dict[str, Any] = {}
    if d.oxc is not None:
        payload["oxc"] = d.oxc.to_dict()
    if d.routing is not None:
        payload["routing"] = d.routing.to_dict()
    return NewDecision(d.kind, d.job_id, d.reason, payload)


class FabricPlanner:
    """Holds the last plan of this worker; one instance per leader."""

    def __init__(self, repo: FabricRepository, cluster: Cluster) -> None:
        self.repo = repo
        self.cluster = cluster
        self.previous: FabricPlan | None = None
        self._seen: tuple[Any, ...] | None = None

    def reset(self) -> None:
        """Drop the in-memory plan; the next pass starts from the stored desired state."""
        self.previous = None
        self._seen = None

    def run(self, reason: str, *, force: bool = False) -> FabricPassResult:
        rows = self.repo.load_placed_jobs()
        failed = self.repo.load_failed_ports()
        seen = (
            tuple((r.job.job_id, r.placement.servers) for r in rows),
            tuple(sorted((o, tuple(sorted(p))) for o, p in failed.items())),
        )
        if seen == self._seen and not force:
            return FabricPassResult(False, (), ())
        cluster = without_failed_ports(self.cluster, failed)
        stored = self.repo.load_desired()
        usable = tuple(
            cc
            for cc in stored
            if cc.port_a not in failed.get(cc.oxc_id, ())
            and cc.port_b not in failed.get(cc.oxc_id, ())
        )
        previous = self.previous
        if previous is not None and len(usable) != len(stored):
            # jobs that lost a circuit to a failed port are planned afresh
            kept = set(usable)
            hit = {cc.job_id for cc in stored if cc not in kept}
            previous = FabricPlan(
                tuple(j for j in previous.jobs if j.job_id not in hit),
                previous.cross_connects,
                previous.pod_circuits,
                previous.mlu,
                previous.aggregators,
                previous.time_division,
                previous.unmapped,
            )
        ledger = previous.aggregators if previous is not None else _ledger_from_rows(rows)
        plan = plan_fabric(
            cluster,
            [PlacedJob(r.job, r.placement) for r in rows],
            usable,
            ledger,
            previous,
        )
        before = self.previous or FabricPlan((), stored, PodCircuits((), ()), 0.0, ledger, (), ())
        decisions = diff_plans(before, plan, reason)
        old = {j.job_id: j.collective for j in (self.previous.jobs if self.previous else ())}
        stored_collective = {r.job.job_id: r.collective for r in rows}
        collectives = {
            j.job_id: collective_json(j.collective, j.slice.mode, j.slice.reason)
            for j in plan.jobs
            if old.get(j.job_id) != j.collective or stored_collective.get(j.job_id) is None
        }
        facts = {
            "mlu": plan.mlu,
            "pod_circuits": plan.pod_circuits.to_dict(),
            "time_division": list(plan.time_division),
            "unmapped": [list(u) for u in plan.unmapped],
        }
        seqs = self.repo.record_fabric(
            plan.cross_connects, collectives, [decision_payload(d) for d in decisions], facts
        )
        self.previous = plan
        self._seen = seen
        if decisions:
            log.info(
                "fabric planned",
                extra={
                    "reason": reason,
                    "decisions": len(decisions),
                    "first_seq": seqs[0] if seqs else None,
                    "cross_connects": len(plan.cross_connects),
                    "mlu": round(plan.mlu, 4),
                },
            )
        return FabricPassResult(True, tuple(seqs), tuple(collectives))

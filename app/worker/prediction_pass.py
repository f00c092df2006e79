"""The predictor handler: traffic reports in, per-job cycle predictions and rewiring out.

For each stored report after the cursor: attribute its demands to jobs (by the
report's `job_id`, else by our own placement), reduce them to a pod-level plan
id, step the job's predictor, and, when the predicted next plan differs from the
one installed and the reconfiguration fits in the compute gap before the next
phase, rewire the job's slice for it (decisions with `reason=prediction`).
Predictions, the decisions and the cursor are committed together, so a report
takes effect exactly once; after a restart the in-memory predictor states are
rebuilt by replaying the reports already consumed (the engine is deterministic).
"""

from __future__ import annotations

import dataclasses
import logging
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from app.bus.messages import Message, ReportTraffic
from app.engine.cluster import Cluster
from app.engine.cross_connects import (
    CrossConnect,
    diff_cross_connects,
    map_cross_connects,
    realised_circuits,
)
from app.engine.fabric import MODE_ISOLATED, plan_topology
from app.engine.plan_signature import (
    Demand,
    PlanCatalog,
    PodDemand,
    aggregate_pod_demand,
    attribute_demands,
    classify_plan,
)
from app.engine.predictor import PredictorState, new_predictor, step
from app.engine.preinstall import exposed_reconfig_s, should_preinstall
from app.engine.traffic import DemandMatrix
from app.store import NewDecision
from app.store.fabric_repository import FabricRepository
from app.store.traffic_repository import PredictionRow, ReportRow, TrafficRepository

from .fabric_pass import FabricPlanner
from .metrics import WorkerMetrics

log = logging.getLogger("lightpath.predictor")

ARRIVALS_KEPT = 512
BATCH = 2000
MAX_BATCHES_PER_PASS = 25


@dataclass
class JobCycle:
    """One job's predictor, plan catalogue and phase timing (worker memory)."""

    state: PredictorState
    catalog: PlanCatalog = field(default_factory=PlanCatalog)
    arrivals: deque[float] = field(default_factory=lambda: deque(maxlen=ARRIVALS_KEPT))
    demands: dict[str, PodDemand] = field(default_factory=dict)
    installed: str | None = None
    exposed_s: float = 0.0
    last_gap_s: float = 0.0
    preinstalled: bool = False

    def summary(self, job_id: str) -> PredictionRow:
        s = self.state
        return PredictionRow(
            job_id,
            s.algorithm,
            {
                "period": s.period,
                "cycle_count": s.cycle_count,
                "queue": list(s.queue),
                "next_plan": s.next_plan,
                "installed_plan": self.installed,
            },
            s.hits,
            s.misses,
            self.exposed_s,
        )


def _demands(report: ReportRow) -> list[Demand]:
    return [Demand(str(src), str(dst), float(size)) for src, dst, size in report.demands]


class PredictionHandler:
    def __init__(
        self,
        traffic: TrafficRepository,
        fabric: FabricRepository,
        planner: FabricPlanner,
        cluster: Cluster,
        metrics: WorkerMetrics,
        algorithm: str,
    ) -> None:
        self.traffic = traffic
        self.fabric = fabric
        self.planner = planner
        self.cluster = cluster
        self.metrics = metrics
        self.algorithm = algorithm
        self.jobs: dict[str, JobCycle] = {}
        self.cursor: int | None = None
        self.on_rewire: list[Callable[[], None]] = []
        self._pending_desired: tuple[CrossConnect, ...] | None = None

    # --- one report ---------------------------------------------------------

    def _observe(
        self, job_id: str, demands: Iterable[Demand], at_s: float, live: bool
    ) -> list[NewDecision]:
        cycle = self.jobs.get(job_id)
        if cycle is None:
            cycle = self.jobs[job_id] = JobCycle(new_predictor(self.algorithm))
        pod_demand = aggregate_pod_demand(self.cluster, demands)
        cycle.catalog, plan_id = classify_plan(cycle.catalog, pod_demand)
        cycle.demands.setdefault(plan_id, pod_demand)
        cycle.state, outcome = step(cycle.state, plan_id)
        exposed = exposed_reconfig_s(
            self.cluster.reconfig_ms,
            cycle.last_gap_s,
            preinstalled=cycle.preinstalled,
            installed_plan=outcome.installed_before,
            demanded_plan=plan_id,
        )
        if outcome.installed_before is None and cycle.installed is None:
            exposed = 0.0  # first phase of the job: its topology came with placement
        cycle.exposed_s += exposed
        cycle.arrivals.append(at_s)
        cycle.installed = plan_id
        cycle.preinstalled = False
        if live:
            (self.metrics.prediction_hits if outcome.hit else self.metrics.prediction_misses).inc()
            self.metrics.exposed_reconfig.inc(exposed)
        nxt = cycle.state.next_plan
        if nxt is None or nxt == plan_id:
            return []
        decision = should_preinstall(
            list(cycle.arrivals), at_s, self.cluster.reconfig_ms, cycle.state.period
        )
        cycle.last_gap_s = decision.gap_s
        if not decision.fits:
            return []  # keep the current topology: rewiring would be exposed anyway
        cycle.installed = nxt
        cycle.preinstalled = True
        return self._rewire(job_id, cycle.demands.get(nxt)) if live else []

    def _rewire(self, job_id: str, pod_demand: PodDemand | None) -> list[NewDecision]:
        """Re-plan the job's circuits inside its slice for the predicted phase."""
        plan = self.planner.previous
        job = plan.job(job_id) if plan else None
        if plan is None or job is None or job.slice.mode != MODE_ISOLATED or pod_demand is None:
            return []  # no slice of its own (time division or no inter-pod traffic)
        pods = tuple(p.id for p in self.cluster.pods)
        matrix = DemandMatrix.from_entries(pods, pod_demand.pairs)
        circuits = plan_topology(self.cluster, matrix, dict(job.slice.pod_ports)).circuits
        wanted = {
            j.job_id: realised_circuits(self.cluster, plan.cross_connects, j.job_id)
            for j in plan.jobs
        }
        wanted[job_id] = circuits
        mapping = map_cross_connects(self.cluster, wanted, plan.cross_connects)
        changes = diff_cross_connects(plan.cross_connects, mapping.cross_connects)
        if not changes:
            return []
        self.planner.previous = dataclasses.replace(plan, cross_connects=mapping.cross_connects)
        self._pending_desired = mapping.cross_connects
        return [
            NewDecision("oxc", job_id, "prediction", {"oxc": change.to_dict()})
            for change in changes
        ]

    # --- the handler ------------------------------------------------------

    def reset(self) -> None:
        """Forget in-memory states; the next pass replays the consumed reports."""
        self.jobs.clear()
        self.cursor = None

    def _replay(self) -> None:
        """Rebuild predictor states of placed jobs from the reports already consumed."""
        self.cursor = self.traffic.cursor()
        rows = self.fabric.load_placed_jobs()
        if not rows or self.cursor == 0:
            return
        by_server = {s: r.job.job_id for r in rows for s in r.placement.servers}
        for report in self.traffic.reports_of_jobs(list({r.job.job_id for r in rows}), self.cursor):
            # only what the report did when it was consumed: a report that came
            # before its job was placed was dropped then and stays dropped now
            did = set(report.attributed or ())
            for job_id, demands in self._groups(report, by_server).items():
                if job_id in did:
                    self._observe(job_id, demands, report.phase_started_at, live=False)
        log.info("predictor states replayed", extra={"jobs": len(self.jobs), "cursor": self.cursor})

    @staticmethod
    def _groups(report: ReportRow, by_server: dict[str, str]) -> dict[str, tuple[Demand, ...]]:
        demands = _demands(report)
        if report.job_id is not None:
            placed = set(by_server.values())
            return {report.job_id: tuple(demands)} if report.job_id in placed else {}
        return attribute_demands(by_server, demands)

    def __call__(self, messages: list[Message]) -> set[str]:
        if self.cursor is None:
            self._replay()
        assert self.cursor is not None
        if not any(isinstance(m, ReportTraffic) for m in messages) and messages:
            return set()
        for _batch in range(MAX_BATCHES_PER_PASS):
            if not self._consume_batch():
                break
        return set()

    def _consume_batch(self) -> bool:
        """Consume up to BATCH reports; False when there were none."""
        assert self.cursor is not None
        reports = self.traffic.reports_after(self.cursor, BATCH)
        if not reports:
            return False
        rows = self.fabric.load_placed_jobs()
        by_server = {s: r.job.job_id for r in rows for s in r.placement.servers}
        placed = {r.job.job_id for r in rows}
        for gone in set(self.jobs) - placed:
            del self.jobs[gone]  # completed jobs: their predictions are final
        decisions: list[NewDecision] = []
        touched: set[str] = set()
        attributed: dict[int, tuple[str, ...]] = {}
        self._pending_desired = None
        for report in reports:
            groups = self._groups(report, by_server)
            attributed[report.seq] = tuple(sorted(groups))
            for job_id, demands in groups.items():
                decisions.extend(self._observe(job_id, demands, report.phase_started_at, True))
                touched.add(job_id)
        cursor = reports[-1].seq
        self.traffic.commit_predictions(
            cursor,
            [self.jobs[j].summary(j) for j in sorted(touched)],
            decisions,
            desired=self._pending_desired,
            attributed=attributed,
        )
        self.cursor = cursor
        self.metrics.traffic_reports.inc(len(reports))
        if decisions:
            for callback in self.on_rewire:
                callback()
        return True

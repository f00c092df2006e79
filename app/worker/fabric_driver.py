"""The worker's fabric handlers: events from the database and switches into the controller.

Every fabric decision is `app.engine.controller`'s; this module only turns what
the database and the southbound say into controller events, and writes the
decisions, desired cross-connects, job `collective`/`network` views and
prediction summaries back, each batch in one transaction:

- placed jobs that appeared or left since the last pass -> `JobPlaced` /
  `JobCompleted`; a change of failed ports -> `PortsChanged`;
- traffic reports after the cursor -> `PhaseObserved` (attributed by the
  report's `job_id`, else by our own placement);
- what the switch controller confirmed, with when -> `SwitchConfirmed`;
- the clock -> `Tick` (turns on shared ports rotate).

The worker memory (`WorkerMemory`) holds the controller state, the placed jobs
it knows and the traffic cursor. A new leader starts from the durable state: the
jobs placed now, the desired cross-connects stored (kept where they still serve
their jobs), and the stored accounting; predictor states are learnt afresh (a
few periods), so a takeover never replays the traffic history.
"""

from __future__ import annotations

import gc
import logging
import math
import queue
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from app.engine.cluster import Cluster, without_failed_ports
from app.engine.collective import CollectiveChoice
from app.engine.controller import (
    NETWORK_SHARED,
    Accounting,
    ControllerConfig,
    ControllerState,
    Event,
    JobCompleted,
    JobCycle,
    JobPlaced,
    PhaseObserved,
    PortsChanged,
    SwitchConfirmed,
    Tick,
    network_view,
    new_controller,
    restore,
    step,
)
from app.engine.cross_connects import CrossConnect, realised_circuits
from app.engine.fabric import Decision
from app.engine.plan_signature import Demand, aggregate_pod_demand, attribute_demands
from app.engine.traffic import Flow
from app.store import NewDecision
from app.store.fabric_repository import FabricRepository, PlacedJobRow
from app.store.retention import Retention
from app.store.traffic_repository import (
    DeadLetter,
    PredictionRow,
    ReportRow,
    TrafficRepository,
)

from .metrics import WorkerMetrics

log = logging.getLogger("lightpath.worker")

BATCH = 500
MAX_BATCHES_PER_PASS = 25
PASS_BUDGET_S = 0.25  # traffic consumed per pass before admission gets its turn


def collective_json(choice: CollectiveChoice, network: dict[str, Any] | None) -> dict[str, Any]:
    """The job's stored `collective`, with its aggregator grants and `network` view."""
    out = choice.to_dict()
    out["aggregator_grants"] = [{"tor": g.tor_id, "gbps": g.gbps} for g in choice.grants]
    out["network"] = network
    return out


def decision_payload(d: Decision) -> NewDecision:
    payload: dict[str, Any] = {}
    if d.oxc is not None:
        payload["oxc"] = d.oxc.to_dict()
    if d.routing is not None:
        payload["routing"] = d.routing.to_dict()
    return NewDecision(d.kind, d.job_id, d.reason, payload)


@dataclass(frozen=True, slots=True)
class FabricPassResult:
    planned: bool
    decision_seqs: tuple[int, ...]
    changed_jobs: tuple[str, ...]


@dataclass
class WorkerMemory:
    """What the leader keeps between passes: controller state, known jobs, cursor."""

    state: ControllerState
    placed: dict[str, tuple[str, ...]] = field(default_factory=dict)  # job -> servers
    failed: dict[str, frozenset[int]] = field(default_factory=dict)
    cursor: int | None = None
    base: dict[str, Accounting] = field(default_factory=dict)  # stored counts at takeover
    views: dict[str, Any] = field(default_factory=dict)  # last written collective per job
    # placed jobs decoded once when they appear (a pass reads only the ids and the new rows)
    rows: dict[str, PlacedJobRow] = field(default_factory=dict)
    unviewed: set[str] = field(default_factory=set)  # jobs whose stored collective is null
    # the desired cross-connects as stored (None: unknown, read the table when writing)
    written: tuple[CrossConnect, ...] | None = None
    # what each stored view was computed from: a job whose fabric entry, turn sharers
    # and cluster are the same objects as last pass keeps its view without recomputing
    view_inputs: dict[str, tuple[Any, int, Any, Any]] = field(default_factory=dict)


class FabricDriver:
    """Drives the fabric controller from the database and the switches (leader only)."""

    def __init__(
        self,
        fabric: FabricRepository,
        traffic: TrafficRepository,
        cluster: Cluster,
        config: ControllerConfig,
        metrics: WorkerMetrics,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.fabric = fabric
        self.traffic = traffic
        self.cluster = cluster
        self.config = config
        self.metrics = metrics
        self.clock = clock
        self.confirmations: queue.SimpleQueue[SwitchConfirmed] = queue.SimpleQueue()
        self.memory: WorkerMemory | None = None
        self.backlog = False  # the last pass left reports after the cursor
        # the desired cross-connects last committed, for the switch controller (None: unknown)
        self.committed: tuple[CrossConnect, ...] | None = None
        # told the collectives written by a pass (the scheduler's aggregator totals follow them)
        self.on_views: Callable[[Mapping[str, dict[str, Any]]], None] | None = None
        # called between the steps of a pass: lets an admission under way finish first
        self.yield_to: Callable[[], None] = lambda: None
        self.retention: Retention | None = None  # set by the wiring; run from the tick
        self.retention_interval_s = 60.0
        self._retained_at = float("-inf")
        # jobs that ended in this pass with phases still waiting, and their last cycle
        self.ended: list[tuple[str, JobCycle]] = []
        self._servers = frozenset(cluster.server_ids)
        # phases scored by steps whose pass has not committed yet: counted in the
        # metrics once it has (a pass that fails is replayed, and scored again)
        self._scores: list[tuple[Accounting, Accounting]] = []

    # --- memory ---------------------------------------------------------------

    def reset(self) -> None:
        """Forget the memory; the next pass starts from the durable state."""
        self.memory = None
        self.committed = None
        self._scores.clear()  # not committed: the next pass scores those phases again

    def confirmed(self, held: Iterable[tuple[str, int, int]], at_s: float | None = None) -> None:
        """Called by the switch controller (any thread) with what the switches hold."""
        at = self.clock() if at_s is None else at_s
        self.confirmations.put(SwitchConfirmed(frozenset(held), at))

    @property
    def state(self) -> ControllerState | None:
        return self.memory.state if self.memory is not None else None

    def _load(self) -> WorkerMemory:
        state = new_controller(self.cluster, self.config)
        stored = self.fabric.load_desired()
        # the stored desired state plays the last plan: kept where it still serves
        state = replace(state, desired=stored)
        memory = WorkerMemory(state)
        memory.cursor = self.traffic.cursor()
        memory.written = stored
        self.committed = stored
        return memory

    # --- one pass ----------------------------------------------------------------

    def sync(self, reason: str, *, force: bool = False) -> FabricPassResult:
        """Placements, failed ports, confirmations and the clock into the controller."""
        loading = self.memory is None
        if self.memory is None:
            self.memory = self._load()
            force = True
        memory = self.memory
        now = self.clock()
        events: list[Event] = self._drain()
        ids = self.fabric.placed_job_ids()
        failed = self.fabric.load_failed_ports()
        if failed != memory.failed:
            memory.failed = failed
            events.append(PortsChanged(without_failed_ports(self.cluster, failed), now))
        current = set(ids)
        for gone in [j for j in memory.placed if j not in current]:
            events.append(JobCompleted(gone, now))
            del memory.placed[gone]
            memory.views.pop(gone, None)
            memory.view_inputs.pop(gone, None)
            memory.rows.pop(gone, None)
            memory.unviewed.discard(gone)
        new_ids = [j for j in ids if j not in memory.placed]
        fresh = self.fabric.load_placed_jobs(new_ids) if new_ids else []
        # a job on servers the cluster file no longer has is left out: the scheduler
        # fails it (`Worker.retire_orphans`), and until then it must not fail the pass
        servers = self._servers
        fresh = [r for r in fresh if servers.issuperset(r.placement.servers)]
        for row in fresh:
            events.append(JobPlaced(row.job, row.placement, now))
            memory.placed[row.job.job_id] = row.placement.servers
            memory.rows[row.job.job_id] = row
            if row.collective is None:
                memory.unviewed.add(row.job.job_id)
        if fresh:
            self._take_stored_counts(memory, [r.job.job_id for r in fresh])
        events.append(Tick(now))
        self.yield_to()
        # a new leader's first pass: the jobs a previous pass had viewed (a stored
        # collective) are reconciled with the stored plan, not arrivals
        restored = {r.job.job_id for r in fresh if r.collective is not None} if loading else None
        sharers = {  # of those, the ones that took turns on shared ports
            r.job.job_id
            for r in fresh
            if r.collective is not None
            and (r.collective.get("network") or {}).get("mode") == NETWORK_SHARED
        }
        self.ended.clear()
        decisions, scored = self._apply(events, restored=restored, sharers=sharers)
        # phases the confirmations scored (they wait for the switches): stored now, not
        # at the job's next report (a job whose last phase waited read one phase short,
        # for good once it ended, and /metrics disagreed with the API)
        rows = [self.summary(j) for j in sorted(scored)]
        rows += [self.summary(j, cycle) for j, cycle in self.ended]
        self.ended.clear()
        if rows:
            self.traffic.save_predictions(rows)
            # committed: counted now (a failure below is replayed from these rows, and the
            # confirmations that scored them are not drained again)
            self._count_scores()
        if loading:
            # every placed job's plan is now in memory for the leader's lifetime: take
            # it out of the collector's generations so full collections stay short
            gc.freeze()
        changed_views = self._views()
        if not decisions and not changed_views and not force:
            self._committed(())
            return FabricPassResult(False, (), ())
        state = memory.state
        facts = {
            # null while some job's traffic has no circuit to run on (a pod cut off by
            # failed ports): JSON has no infinity, and GET /v1/topology answered 500
            "mlu": _finite_or_none(state.fabric.mlu) if state.fabric else 0.0,
            "pod_circuits": realised_circuits(state.cluster, state.desired).to_dict(),
            "time_division": list(state.turn_order),
            "unmapped": [list(u) for u in state.fabric.unmapped] if state.fabric else [],
        }
        self.yield_to()
        seqs = self.fabric.record_fabric(
            state.desired,
            changed_views,
            [decision_payload(d) for d in decisions],
            facts,
            previous=memory.written,
        )
        memory.written = self.committed = state.desired
        memory.unviewed.difference_update(changed_views)
        if changed_views and self.on_views is not None:
            self.on_views(changed_views)
        if decisions:
            log.info(
                "fabric decided",
                extra={
                    "reason": reason,
                    "decisions": len(decisions),
                    "first_seq": seqs[0] if seqs else None,
                    "cross_connects": len(state.desired),
                },
            )
        self._committed(seqs)
        return FabricPassResult(True, tuple(seqs), tuple(sorted(changed_views)))

    def _drain(self) -> list[Event]:
        out: list[Event] = []
        while True:
            try:
                out.append(self.confirmations.get_nowait())
            except queue.Empty:
                return out

    def _apply(
        self,
        events: Iterable[Event],
        *,
        restored: set[str] | None = None,
        sharers: Collection[str] = (),
    ) -> tuple[list[Decision], list[str]]:
        """The decisions, and the jobs whose accounting the events changed."""
        before = self._accounts()
        decisions = self._step(events, restored=restored, sharers=sharers)
        return decisions, self._count_since(before)

    def _step(
        self,
        events: Iterable[Event],
        *,
        restored: set[str] | None = None,
        sharers: Collection[str] = (),
    ) -> list[Decision]:
        """Step the controller through `events` (a new leader's first pass, with the
        jobs it `restored`: `engine.controller.restore`); the memory changes only if
        all succeed."""
        assert self.memory is not None
        state = self.memory.state
        decisions: list[Decision] = []
        if restored is not None:
            state, made = restore(state, events, restored, sharers)
            decisions.extend(made)
        else:
            for event in events:
                if isinstance(event, JobCompleted) and (ending := state.cycle(event.job_id)):
                    if ending.waiting:  # scored as it ends (see `JobCycle.final_accounting`)
                        self._count(ending.accounting, ending.final_accounting)
                        self.ended.append((event.job_id, ending))
                state, made = step(state, event)
                decisions.extend(made)
        self.memory.state = state
        return decisions

    def _accounts(self) -> dict[str, Accounting]:
        assert self.memory is not None
        return {j: c.accounting for j, c in self.memory.state.cycles.items()}

    def _count_since(self, before: dict[str, Accounting]) -> list[str]:
        """Count in the metrics what the events scored; the jobs they scored."""
        assert self.memory is not None
        scored = []
        for job_id, cycle in self.memory.state.cycles.items():
            was = before.get(job_id)
            if was is not cycle.accounting:  # the same object: nothing was scored
                self._count(was or Accounting(), cycle.accounting)
                scored.append(job_id)
        return scored

    def _count(self, before: Accounting, after: Accounting) -> None:
        if after != before:
            self._scores.append((before, after))

    def _committed(self, seqs: Sequence[int]) -> None:
        """Into the metrics once a pass has committed: its decisions, the fabric's MLU
        and the phases it scored (a pass that fails is replayed: counted then)."""
        self.metrics.decisions.labels("fabric").inc(len(seqs))
        state = self.state
        if state is not None and state.fabric is not None:
            self.metrics.mlu.set(state.fabric.mlu)
        self._count_scores()

    def _count_scores(self) -> None:
        """The phases scored since the last count, whose rows are now stored."""
        for before, after in self._scores:
            self.metrics.prediction_hits.inc(after.hits - before.hits)
            self.metrics.prediction_misses.inc(after.misses - before.misses)
            self.metrics.prediction_held.inc(after.held - before.held)
            self.metrics.exposed_reconfig.inc(after.exposed_s - before.exposed_s)
        self._scores.clear()

    def _views(self) -> dict[str, dict[str, Any]]:
        """Stored `collective` (with `network`) of jobs whose view changed.

        A view is recomputed only for jobs whose inputs changed (their fabric
        entry, the number of jobs taking turns, the usable cluster, their demand,
        which the controller learns from reports without moving a circuit), so a
        pass costs what the change touched, not one view per running job.
        """
        memory = self.memory
        assert memory is not None
        state = memory.state
        out: dict[str, dict[str, Any]] = {}
        if state.fabric is None:
            return out
        sharers = len(state.turn_order)
        cluster = state.cluster
        for jf in state.fabric.jobs:
            seen = memory.view_inputs.get(jf.job_id)
            demand = state.demands.get(jf.job_id)
            if (
                seen is not None
                and seen[0] is jf
                and seen[1] == sharers
                and seen[2] is cluster
                and seen[3] is demand
                and jf.job_id not in memory.unviewed
            ):
                continue
            inputs = (jf, sharers, cluster, demand)
            view = network_view(state, jf.job_id)
            body = collective_json(jf.collective, view.to_dict() if view else None)
            memory.view_inputs[jf.job_id] = inputs
            if memory.views.get(jf.job_id) != body or jf.job_id in memory.unviewed:
                out[jf.job_id] = body
                memory.views[jf.job_id] = body
        return out

    def _take_stored_counts(self, memory: WorkerMemory, job_ids: list[str]) -> None:
        for job_id, row in self.traffic.predictions(job_ids).items():
            memory.base[job_id] = Accounting(
                row.hits,
                int(row.state.get("held", 0)),
                row.misses,
                row.exposed_reconfig_s,
                int(row.state.get("reconfigurations", 0)),
            )

    # --- traffic -----------------------------------------------------------------

    def consume(self) -> bool:
        """Feed reports after the cursor to the controller; False when none were left."""
        if self.memory is None:
            self.sync("reconcile")
        assert self.memory is not None
        did = False
        self.backlog = False
        started = time.monotonic()
        for _ in range(MAX_BATCHES_PER_PASS):
            consumed = self._consume_batch()
            if not consumed:
                break
            did = True
            if consumed < BATCH:
                # caught up: reports committed since the read woke us again (ingest's
                # paced wake-up, or the tick); reading again now would make a pass per
                # handful of reports under steady ingest
                break
            if time.monotonic() - started > PASS_BUDGET_S:
                # arrivals and completions wait for this pass: leave the rest of the
                # backlog to the next one, which the loop starts without waiting
                self.backlog = True
                break
        self.retain()
        return did

    def retain(self) -> None:
        """Delete rows past their retention window, at most every `retention_interval_s`."""
        now = time.monotonic()
        if self.retention is None or now - self._retained_at < self.retention_interval_s:
            return
        self._retained_at = now
        self.retention.run()

    def _consume_batch(self) -> int:
        """Consume up to `BATCH` reports after the cursor; how many (0: none were left)."""
        memory = self.memory
        assert memory is not None and memory.cursor is not None
        reports = self.traffic.reports_after(memory.cursor, BATCH)
        if not reports:
            return 0
        by_server = {s: j for j, servers in memory.placed.items() for s in servers}
        touched: set[str] = set()
        dead: list[DeadLetter] = []
        now = self.clock()
        before = self._accounts()
        decisions = self._step(self._drain())
        for report in reports:
            # one report at a time: a report the engine cannot use is set aside with
            # its reason and the cursor moves past it, instead of failing every pass
            try:
                groups = _groups(report, by_server)
                events: list[Event] = [
                    PhaseObserved(
                        job_id,
                        aggregate_pod_demand(self.cluster, demands),
                        report.phase_started_at,
                        now,
                        tuple(Flow(d.src, d.dst, d.size_bytes) for d in demands),
                    )
                    for job_id, demands in groups.items()
                ]
                decisions += self._step(events)
            except Exception as exc:
                log.warning(
                    "traffic report set aside",
                    extra={"ord": report.seq, "job_id": report.job_id, "error": repr(exc)},
                )
                dead.append(DeadLetter(report, f"{type(exc).__name__}: {exc}"[:500]))
                continue
            touched.update(groups)
        self._count_since(before)
        cursor = reports[-1].seq
        state = memory.state
        touched |= {d.job_id for d in decisions if d.job_id}
        seqs = self.traffic.commit_predictions(
            cursor,
            [self.summary(j) for j in sorted(touched) if state.cycle(j) is not None],
            [decision_payload(d) for d in decisions],
            desired=state.desired if decisions else None,
            previous=memory.written,
            dead_letters=dead,
        )
        if dead:
            self.metrics.dead_letters.inc(len(dead))
        self._committed(seqs)
        if decisions:
            # no seqs: a duplicate pass wrote nothing, so what the table holds is unknown
            memory.written = state.desired if seqs else None
            self.committed = memory.written
        memory.cursor = cursor
        self.metrics.traffic_reports.inc(len(reports))
        return len(reports)

    def summary(self, job_id: str, cycle: JobCycle | None = None) -> PredictionRow:
        """The job's prediction row: predictor state and measured accounting (`cycle`: a
        job's last, as it ended, with its final accounting)."""
        assert self.memory is not None
        final = cycle is not None
        cycle = cycle or self.memory.state.cycle(job_id)
        assert cycle is not None
        p = cycle.predictor
        mine = cycle.final_accounting if final else cycle.accounting
        acc = _plus(self.memory.base.get(job_id, Accounting()), mine)
        return PredictionRow(
            job_id,
            p.algorithm,
            {
                "period": p.period,
                "cycle_count": p.cycle_count,
                "queue": list(p.queue),
                "next_plan": p.next_plan,
                "installed_plan": cycle.target,
                "held": acc.held,
                "reconfigurations": acc.reconfigurations,
            },
            acc.hits,
            acc.misses,
            acc.exposed_s,
        )


def _plus(a: Accounting, b: Accounting) -> Accounting:
    return Accounting(
        a.hits + b.hits,
        a.held + b.held,
        a.misses + b.misses,
        a.exposed_s + b.exposed_s,
        a.reconfigurations + b.reconfigurations,
    )


def _finite_or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _groups(report: ReportRow, by_server: dict[str, str]) -> dict[str, tuple[Demand, ...]]:
    """The report's demands by job: all of them the job's it names, else each the job's
    placed on its servers. A report naming a job that is not placed (unknown, queued
    or ended) is refused, so the caller sets it aside with the reason rather than
    drop it unseen: its bytes are not the other jobs' on those servers."""
    demands = [Demand(str(src), str(dst), float(size)) for src, dst, size in report.demands]
    if report.job_id is None:
        groups = attribute_demands(by_server, demands)
        if not groups:  # it was dropped unseen: no dead letter, no count
            raise LookupError("no placed job holds a server of this report")
        return groups
    if report.job_id not in set(by_server.values()):
        raise LookupError(
            f"job {report.job_id!r} is not placed (unknown, queued, or ended before the "
            "report was read)"
        )
    return {report.job_id: tuple(demands)}

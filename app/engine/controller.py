"""The fabric controller: one pure state machine of the optical fabric over time.

Every fabric decision lives here; the worker (database and switches) and the
simulator (simulated time) are thin loops that feed it events and carry out
the decisions it returns. `step(state, event) -> (state, decisions)`:

- `JobPlaced` / `JobCompleted`: re-allocate ports (`fabric.plan_fabric`). Jobs
  whose allocation is unchanged keep exactly the cross-connects they hold (their
  current phase topology included); ports a completion frees go to running jobs
  whose slice is short of what would make them non-blocking; a job that gets no
  isolated slice takes turns on the ports no slice holds (`shared`).
- `PhaseObserved`: one communication phase of a job (its pod demand and start
  time). It is scored against what the switches had confirmed (below), the job's
  cycle predictor steps, and the controller decides hold-or-rewire: per-phase
  circuits inside the job's slice only once the predicted period has come true
  and every recent rewiring fitted the compute gap before its phase (else the
  job holds its pp+dp topology), and only for a plan whose own circuits finish it
  faster than the held ones. Routing headers follow every rewiring.
- `SwitchConfirmed`: what the switches hold, and when. A job's change is
  confirmed when all its desired cross-connects are held. A cross-connect the
  switches had confirmed and no longer hold while the job still wants it (a switch
  restarted empty, or one that cannot be read: the worker leaves those out) lost
  the job its topology: it waits for the circuits again, as after a change.
- `Tick`: the clock; rotates the turn on shared ports (each turn pays its
  reconfiguration, as every change waits for its confirmation).

Accounting, measured not believed (the same definition in the API, metrics and
simulator): a phase is a `hit` when the switches had confirmed the topology the
controller planned for that phase before the phase started; `held` when it ran
on a topology the controller chose to keep (the pp+dp topology, the home one,
another phase's it kept rather than expose a rewiring its gap could not hide, or
any topology for a phase with no inter-pod traffic); a `miss` otherwise.
`exposed_s` is time phases waited on circuits still being switched (start to
confirmation), each moment once however many phases waited through it (it never
exceeds the time that passed). A phase that starts while its job's change is
unconfirmed is scored when the confirmation comes.

Phase starts come from the reporter's clock. A phase reported to start after the
controller saw it proves that clock runs ahead of ours: its start is taken as
when it was seen, it is never scored a hit (we cannot tell it started after the
confirmation), and the job holds its topology (no per-phase rewiring, whose gaps
would be measured on that clock) until `CLOCK_DISTRUST_S` pass without another.

Pure module: no I/O, no clock (times are arguments), no FastAPI, SQLAlchemy,
Redis or pydantic imports.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from .allocation import (
    EMPTY_ALLOCATION,
    ISOLATED_REASON,
    JobAllocation,
    JobDemand,
    PortAllocation,
    allocate_ports,
    circuits_on_switches,
    compute_estimate_s,
    demand_of_pairs,
    held_allocation,
    ideal_iteration_s,
    job_demand,
    network_s,
    pair_ways,
    slowdown_note,
    switch_room,
    turn_ports,
)
from .circuits import PodCircuits, evaluate_circuits
from .cluster import Cluster
from .collective import AggregatorLedger, choose_iteration_collective
from .cross_connects import (
    CrossConnect,
    OxcChange,
    changed_cross_connects,
    cross_connects_by_job,
    diff_cross_connects,
    map_cross_connects,
    port_pods,
    realised_circuits,
)
from .fabric import (
    MODE_ELECTRICAL,
    MODE_ISOLATED,
    MODE_NONE,
    MODE_TIME_DIVISION,
    Decision,
    FabricPlan,
    JobFabric,
    JobSlice,
    PlacedJob,
    RoutingDecision,
    collective_traffic,
    diff_plans,
    oxc_decisions,
    plan_fabric,
    plan_topology,
    route_observed,
    route_phases,
)
from .job import Collective, Job, Placement
from .placement import uplinks_free
from .plan_signature import EMPTY_PLAN_ID, PlanCatalog, classify_plan
from .predictor import DEFAULT_ALGORITHM, PredictorState, new_predictor
from .predictor import step as step_predictor
from .preinstall import gap_before_s, should_preinstall
from .traffic import PHASE_DP, PHASE_PP, DemandMatrix, Flow, job_traffic, pod_of, resolve_facts

HELD_PLAN = "plan-held"  # what a job's circuits are for when it holds its pp+dp topology
OFF_TURN = "plan-off-turn"  # a sharing job between its turns: no circuits of its own
ARRIVALS_KEPT = 64
# reported flows kept per job for the headers of rewirings to observed phases: of the
# latest plans with circuits of their own, and only reports up to this many flows
FLOWS_KEPT = 16
MAX_FLOWS_KEPT = 4096
INSTALLS_KEPT = 16
# a plan's own circuits must beat the held ones by this much to be worth a rewiring
MIN_GAIN = 0.01
# a re-allocation waits at most this long for a job's compute gap
MAX_DEFER_S = 5.0
# after a report proves a job's reporter clock ahead of ours, its phase timing is not
# trusted for rewiring for this long
CLOCK_DISTRUST_S = 60.0

# the `network.mode` of GET /v1/jobs/{id}
NETWORK_ISOLATED = "isolated"
NETWORK_SHARED = "shared"
NETWORK_ELECTRICAL = "electrical"
NETWORK_NONE = "none"
# A job whose learned cycle sends more than this many times the bytes per iteration on
# some pod pair than its demand in use and its model both say gets that demand (see
# `_learned_demand`), once the predictor has followed its period this many times.
RELEARN_FACTOR = 1.25
RELEARN_CYCLES = 2


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    """Settings of the controller: switch latency, predictor, guard and turn length."""

    reconfig_ms: float
    predictor: str = DEFAULT_ALGORITHM
    guard_ms: float = 0.0  # margin a pre-installed change must leave before its phase
    turn_ms: float | None = None  # a turn on shared ports; default 40 x reconfig, >= 250 ms

    @property
    def turn_s(self) -> float:
        ms = self.turn_ms if self.turn_ms is not None else max(40.0 * self.reconfig_ms, 250.0)
        return ms / 1000.0


# ------------------------------------------------------------------ events


@dataclass(frozen=True, slots=True)
class JobPlaced:
    """A job was placed (or re-read after a restart) at `at_s`."""

    job: Job
    placement: Placement
    at_s: float


@dataclass(frozen=True, slots=True)
class JobCompleted:
    """A job left (completed, failed or cancelled) at `at_s`."""

    job_id: str
    at_s: float


@dataclass(frozen=True, slots=True)
class PhaseObserved:
    """One communication phase of a job: its pod demand, start, and when it was seen."""

    job_id: str
    demand: DemandMatrix
    started_at_s: float
    at_s: float  # when the controller handles it (after the phase's start)
    # the server-to-server flows as reported (the simulator, whose traffic is the
    # modelled one, leaves them out): headers of a phase rewired for route them
    flows: tuple[Flow, ...] = ()


@dataclass(frozen=True, slots=True)
class SwitchConfirmed:
    """The switches hold exactly `held` (oxc, port_a, port_b) as of `at_s`."""

    held: frozenset[tuple[str, int, int]]
    at_s: float


@dataclass(frozen=True, slots=True)
class Tick:
    """The clock moved to `at_s`."""

    at_s: float


@dataclass(frozen=True, slots=True)
class PortsChanged:
    """Failed ports changed: `cluster` is the fabric without them (as of `at_s`)."""

    cluster: Cluster
    at_s: float


Event = JobPlaced | JobCompleted | PhaseObserved | SwitchConfirmed | Tick | PortsChanged


# ------------------------------------------------------------------ state


@dataclass(frozen=True, slots=True)
class Accounting:
    """A job's phases as they happened: hits, held, misses, exposed seconds, rewirings."""

    hits: int = 0
    held: int = 0
    misses: int = 0
    exposed_s: float = 0.0
    reconfigurations: int = 0

    def plus(self, outcome: str, exposed_s: float = 0.0) -> Accounting:
        return replace(
            self,
            hits=self.hits + (outcome == "hit"),
            held=self.held + (outcome == "held"),
            misses=self.misses + (outcome == "miss"),
            exposed_s=self.exposed_s + exposed_s,
        )


@dataclass(frozen=True, slots=True)
class Install:
    """One change of a job's circuits: what it is for, asked at, confirmed at (None: not yet)."""

    target: str
    requested_at_s: float
    confirmed_at_s: float | None = None
    # circuits the switches lost put back, not a rewiring the controller chose: its
    # wait is exposed time, but says nothing of whether rewirings fit their gaps
    restore: bool = False


@dataclass(frozen=True, slots=True)
class WaitingPhase:
    """A phase that started while its job's circuits were unconfirmed."""

    plan_id: str
    started_at_s: float
    timed: bool = True  # its start is on our clock (see `_score`)


@dataclass(frozen=True, slots=True)
class JobCycle:
    """One job's predictor, plan catalogue, phase timing, circuit history and accounting."""

    predictor: PredictorState
    catalog: PlanCatalog = field(default_factory=PlanCatalog)
    demands: Mapping[str, DemandMatrix] = field(default_factory=dict)
    circuits: Mapping[str, PodCircuits] = field(default_factory=dict)  # own plan per plan id
    # the allocation those own circuits were fitted to, switch by switch (`_refit`)
    fitted_to: JobAllocation | None = None
    # the reported flows of the latest plans with circuits of their own (`FLOWS_KEPT`)
    flows: Mapping[str, tuple[Flow, ...]] = field(default_factory=dict)
    gains: Mapping[str, float] = field(default_factory=dict)  # held time / own time - 1
    arrivals: tuple[float, ...] = ()
    ends: tuple[float, ...] = ()  # when each of those phases was seen to end
    installs: tuple[Install, ...] = ()
    waiting: tuple[WaitingPhase, ...] = ()
    # the end of the latest wait counted in `accounting.exposed_s`: a moment several
    # phases waited through is counted once
    exposed_until_s: float = -math.inf
    fits: tuple[bool, ...] = ()  # did each recent rewiring fit its gap
    confirmed_period: bool = False  # a predicted period came true at least once
    accounting: Accounting = Accounting()
    last_plan: str | None = None
    # the topology held between per-phase rewirings: HELD_PLAN (the pp+dp topology of
    # placement) or the plan whose own circuits serve the learned cycle fastest; `home_of`
    # is what it was chosen from (recomputed only when that changes)
    home: str = HELD_PLAN
    home_of: tuple[object, ...] = ()
    # when (controller time) a report last proved the reporter's clock ahead of ours
    clock_ahead_at_s: float | None = None
    # what the learned cycle's demand was last compared for (`_learned_demand`), and
    # whether the job's demand in use is one its reports taught
    demand_checked: tuple[object, ...] = ()
    learned: bool = False
    # per plan, the phase with the most bytes seen (by `RELEARN_FACTOR` steps): a plan's
    # id does not change with its magnitude, and `demands` keeps its first phase
    peaks: Mapping[str, DemandMatrix] = field(default_factory=dict)
    # when the controller last chose to keep what is installed for the next phase (a
    # rewiring would not have fitted its gap): phases after that run on a kept topology
    kept_at_s: float | None = None

    @property
    def final_accounting(self) -> Accounting:
        """The accounting as the job ends: a phase still waiting on the switches never
        ran on its circuits, a miss (its wait's end is the job's: no exposed time)."""
        acc = self.accounting
        for _ in self.waiting:
            acc = acc.plus("miss")
        return acc

    def clock_trusted(self, now_s: float) -> bool:
        return self.clock_ahead_at_s is None or now_s - self.clock_ahead_at_s > CLOCK_DISTRUST_S

    @property
    def target(self) -> str:
        return self.installs[-1].target if self.installs else HELD_PLAN


@dataclass(frozen=True, slots=True)
class NetworkView:
    """How a job's cross-pod traffic is served now (`network` of GET /v1/jobs/{id})."""

    mode: str
    pod_ports: tuple[tuple[str, int], ...]
    estimated_slowdown: float | None
    reason: str

    def to_dict(self) -> dict[str, object]:
        return {
            "mode": self.mode,
            "pod_ports": dict(self.pod_ports),
            "estimated_slowdown": self.estimated_slowdown,
            "reason": self.reason,
        }


@dataclass(frozen=True, slots=True)
class ControllerState:
    """The fabric over time: allocation, desired cross-connects, per-job cycles, turns."""

    cluster: Cluster
    config: ControllerConfig
    jobs: tuple[PlacedJob, ...] = ()  # placement order (earlier jobs keep port priority)
    fabric: FabricPlan | None = None
    desired: tuple[CrossConnect, ...] = ()
    confirmed: frozenset[tuple[str, int, int]] = frozenset()
    cycles: Mapping[str, JobCycle] = field(default_factory=dict)
    turn_started_s: float = 0.0
    now_s: float = 0.0
    allocation: PortAllocation = EMPTY_ALLOCATION  # every job's ports by demand
    demands: Mapping[str, JobDemand] = field(default_factory=dict)
    # a re-allocation that takes circuits from a running job waits for its compute
    # gap: its old cross-connects stay, its new ones (and others' that need its
    # ports) are pending until then
    deferred: Mapping[str, float] = field(default_factory=dict)  # job -> since when
    pending: tuple[CrossConnect, ...] = ()

    def cycle(self, job_id: str) -> JobCycle | None:
        return self.cycles.get(job_id)

    def job_fabric(self, job_id: str) -> JobFabric | None:
        return self.fabric.job(job_id) if self.fabric is not None else None

    @property
    def turn_order(self) -> tuple[str, ...]:
        return self.fabric.time_division if self.fabric is not None else ()


def new_controller(cluster: Cluster, config: ControllerConfig) -> ControllerState:
    """An empty fabric: no jobs, no cross-connects."""
    return ControllerState(cluster, config)


def step(state: ControllerState, event: Event) -> tuple[ControllerState, tuple[Decision, ...]]:
    """Apply one event; the decisions are what the switches and hosts must be told."""
    state = replace(state, now_s=max(state.now_s, event.at_s))
    if state.deferred and isinstance(event, JobPlaced | JobCompleted | PortsChanged):
        # what waited for a compute gap goes in before the next re-allocation
        cause = (
            "arrival"
            if isinstance(event, JobPlaced)
            else "completion"
            if isinstance(event, JobCompleted)
            else "reconcile"
        )
        state, flushed = _apply_deferred(state, tuple(state.deferred), event.at_s, cause)
        if isinstance(event, JobCompleted):  # no header for a job that is ending
            flushed = tuple(
                d for d in flushed if not (d.kind == "routing" and d.job_id == event.job_id)
            )
        state, decisions = step(state, event)
        return state, flushed + decisions
    if isinstance(event, JobPlaced):
        return _placed(state, event)
    if isinstance(event, JobCompleted):
        return _completed(state, event)
    if isinstance(event, PhaseObserved):
        return _observed(state, event)
    if isinstance(event, SwitchConfirmed):
        return _confirmed(state, event), ()
    if isinstance(event, PortsChanged):
        return _ports_changed(state, event)
    return _tick(state, event)


def restore(
    state: ControllerState,
    events: Iterable[Event],
    restored: Collection[str],
    sharers: Collection[str] = (),
) -> tuple[ControllerState, tuple[Decision, ...]]:
    """A new leader's first pass: the jobs placed before it (`restored`: their
    `JobPlaced` among `events`) decided as a reconciliation with the stored plan.

    The switches hold `state.desired` (the stored plan). The restored jobs come in
    at once, each keeping the circuits the switches hold for it (`_seed`); stepped
    in one by one they tore down the circuits of jobs not stepped in yet, and the
    plan came out otherwise. The other events are stepped. A cross-connect goes
    out only where the pass changes it from the stored plan (its last change), a
    restored job's header only once per phase (its last), and all but a new job's
    decisions carry reason `reconcile`; jobs new in this pass are arrivals.
    `sharers`: restored jobs that took turns on shared ports (the one holding
    circuits holds the turn, and keeps it from now).
    """
    owner = {cc.key: cc.job_id for cc in state.desired}  # the stored plan's, then the new
    before = set(owner)
    made: list[Decision] = []
    events = list(events)
    back = [e for e in events if isinstance(e, JobPlaced) and e.job.job_id in restored]
    if back and not state.jobs:
        # the restored jobs in at once, each keeping the circuits the switches hold
        # for it: stepped in one by one, without the jobs that ended meanwhile, the
        # allocation came out otherwise and running jobs' circuits moved
        state, decided = _seed(state, back, sharers)
        made.extend(decided)
        events = [e for e in events if not (isinstance(e, JobPlaced) and e in back)]
    for event in events:
        state, decided = step(state, event)
        made.extend(decided)
    live = {pj.job.job_id for pj in state.jobs}
    if any(cc.job_id not in live for cc in state.desired):
        # circuits of jobs that ended while no leader ran, and no arrival re-planned
        # the fabric without them (no job left, say): re-plan once, so they go
        state, decided = _reallocate(state, state.jobs, "reconcile", state.now_s, grow=True)
        made.extend(decided)
    after = {cc.key for cc in state.desired}
    stored_owner = dict(owner)
    owner.update({cc.key: cc.job_id for cc in state.desired})
    changed = before ^ after
    # jobs new in this pass: their cross-connects are arrivals; the rest (restored
    # jobs, and jobs that ended while no leader ran) are a reconciliation
    new_jobs = live - set(restored)
    last_op: dict[tuple[str, int, int], int] = {}  # cross-connect -> its last decision
    last_header: dict[tuple[str | None, str], int] = {}
    for i, d in enumerate(made):
        if d.oxc is not None:
            for a, b in (*d.oxc.connect, *d.oxc.disconnect):
                last_op[(d.oxc.oxc_id, a, b)] = i
        elif d.routing is not None and d.job_id in restored:
            last_header[(d.job_id, d.routing.phase)] = i
    kept_headers = set(last_header.values())
    out: list[Decision] = []
    for i, d in enumerate(made):
        reason = "reconcile" if d.job_id in restored else d.reason
        if d.oxc is not None:
            o, keys = d.oxc, [(d.oxc.oxc_id, a, b) for a, b in (*d.oxc.connect, *d.oxc.disconnect)]
            kept = [k for k in keys if k in changed and last_op[k] == i]
            mine = {k[1:] for k in kept}
            connect = tuple(p for p in o.connect if p in mine)
            disconnect = tuple(p for p in o.disconnect if p in mine)
            if connect or disconnect:
                # handovers are logged net, below (a step's may be undone by a later one)
                net = replace(o, connect=connect, disconnect=disconnect, handover=())
                owners = {owner.get(k) for k in kept}
                if owners & new_jobs:  # a new job's cross-connects: as stepped
                    out.append(replace(d, oxc=net))
                else:
                    only = next(iter(owners)) if len(owners) == 1 else None
                    out.append(replace(d, job_id=only, reason="reconcile", oxc=net))
        elif d.routing is not None and d.job_id in restored:
            if i in kept_headers:
                out.append(replace(d, reason=reason))
        else:
            out.append(replace(d, reason=reason))
    # circuits that stayed on the switches and are another job's now than in the stored
    # plan (a job that ended while no leader ran, its circuits kept by an arrival)
    handed: dict[tuple[str, str], list[tuple[int, int, str]]] = defaultdict(list)
    for key in sorted(before & after):
        was, now = stored_owner[key], owner[key]
        if was != now:
            handed[(key[0], now)].append((key[1], key[2], was))
    for (oxc_id, job_id), pairs in sorted(handed.items()):
        reason = "arrival" if job_id in new_jobs else "reconcile"
        out.append(Decision("oxc", job_id, reason, oxc=OxcChange(oxc_id, (), (), tuple(pairs))))
    return state, tuple(out)


def _seed(
    state: ControllerState, placed: Sequence[JobPlaced], sharers: Collection[str] = ()
) -> tuple[ControllerState, tuple[Decision, ...]]:
    """An empty controller given `placed` at once, with the stored plan's cross-connects
    (`state.desired`) as their held allocation (`allocation.held_allocation`); the
    circuits of `sharers` are the shared ports' turn, whose holder keeps it."""
    cluster = state.cluster
    where = port_pods(cluster)
    mine: dict[str, dict[tuple[str, str, str], int]] = defaultdict(lambda: defaultdict(int))
    for cc in state.desired:
        a, b = where.get((cc.oxc_id, cc.port_a)), where.get((cc.oxc_id, cc.port_b))
        if a is not None and b is not None and a != b:
            mine[cc.job_id][(cc.oxc_id, min(a, b), max(a, b))] += 1
    demands = dict(state.demands)
    cycles = dict(state.cycles)
    for e in placed:
        demands[e.job.job_id] = job_demand(cluster, e.job, e.placement)
        cycles[e.job.job_id] = JobCycle(new_predictor(state.config.predictor))
    own = {j: c for j, c in mine.items() if j not in sharers}
    held = held_allocation(cluster, [demands[e.job.job_id] for e in placed], own)
    holder = next(
        (e.job.job_id for e in placed if e.job.job_id in sharers and e.job.job_id in mine), None
    )
    at = max(e.at_s for e in placed)
    state = replace(
        state,
        cycles=cycles,
        demands=demands,
        allocation=held,
        now_s=max(state.now_s, at),
        turn_started_s=at,  # the holder's turn runs from now (not from time 0)
    )
    jobs = tuple(PlacedJob(e.job, e.placement) for e in placed)
    return _reallocate(state, jobs, "reconcile", at, grow=False, holder=holder)


def _ports_changed(
    state: ControllerState, e: PortsChanged
) -> tuple[ControllerState, tuple[Decision, ...]]:
    """Jobs with a circuit on a failed port are planned afresh on the ports left.

    Only the cross-connects on failed ports are dropped: the re-planned jobs' others stay
    current, so the mapping keeps them (SPEC 4.3: change as few as possible) rather than
    switching every circuit of the job on that OXC to the lowest free ports.
    """
    usable = set(port_pods(e.cluster))
    on_failed = {
        cc
        for cc in state.desired
        if (cc.oxc_id, cc.port_a) not in usable or (cc.oxc_id, cc.port_b) not in usable
    }
    lost = {cc.job_id for cc in on_failed}
    fabric = state.fabric
    if fabric is not None and lost:
        fabric = replace(fabric, jobs=tuple(j for j in fabric.jobs if j.job_id not in lost))
    before = state.desired
    kept = tuple(cc for cc in state.desired if cc not in on_failed)
    # pods with ports back (light restored): jobs there may grow into them again
    was = Counter(port_pods(state.cluster).values())
    grown = {pod for pod, n in Counter(port_pods(e.cluster).values()).items() if n > was[pod]}
    state = replace(state, cluster=e.cluster, fabric=fabric, desired=kept)
    return _reallocate(
        state, state.jobs, "reconcile", e.at_s, grow=True, before_desired=before, grown=grown
    )


# ------------------------------------------------------------------ allocation


def _placed(state: ControllerState, e: JobPlaced) -> tuple[ControllerState, tuple[Decision, ...]]:
    if any(pj.job.job_id == e.job.job_id for pj in state.jobs):
        return state, ()
    jobs = state.jobs + (PlacedJob(e.job, e.placement),)
    cycles = dict(state.cycles)
    cycles[e.job.job_id] = JobCycle(new_predictor(state.config.predictor))
    demands = dict(state.demands)
    demands[e.job.job_id] = job_demand(state.cluster, e.job, e.placement)
    state = replace(state, cycles=cycles, demands=demands)
    return _reallocate(state, jobs, "arrival", e.at_s, grow=False)


def _completed(
    state: ControllerState, e: JobCompleted
) -> tuple[ControllerState, tuple[Decision, ...]]:
    if not any(pj.job.job_id == e.job_id for pj in state.jobs):
        return state, ()
    jobs = tuple(pj for pj in state.jobs if pj.job.job_id != e.job_id)
    cycles = {k: v for k, v in state.cycles.items() if k != e.job_id}
    demands = {k: v for k, v in state.demands.items() if k != e.job_id}
    state = replace(state, cycles=cycles, demands=demands)
    return _reallocate(state, jobs, "completion", e.at_s, grow=True)


def _pods_of(state: ControllerState, cc: CrossConnect) -> tuple[str, ...]:
    where = port_pods(state.cluster)
    return tuple(
        p for p in (where.get((cc.oxc_id, cc.port_a)), where.get((cc.oxc_id, cc.port_b))) if p
    )


def _growers(
    cluster: Cluster,
    fabric: FabricPlan,
    jobs: Sequence[PlacedJob],
    freed: Collection[str] | None = None,
) -> set[str]:
    """Isolated jobs whose slice is short of non-blocking on pods that now have free ports.

    With `freed`, only jobs with a slice on one of those pods (where ports came free).
    """
    free = {p.id: p.uplink_ports for p in cluster.pods}
    kept = {pj.job.job_id for pj in jobs}
    for jf in fabric.jobs:
        if jf.job_id in kept and jf.slice.mode == MODE_ISOLATED:
            for p, n in jf.slice.pod_ports:
                free[p] -= n
    out = set()
    for jf in fabric.jobs:
        if jf.job_id not in kept or jf.slice.mode != MODE_ISOLATED:
            continue
        if freed is not None and not any(p in freed for p, _ in jf.slice.pod_ports):
            continue
        if any(free[p] > 0 and jf.plan.completion_s > 0 for p, _ in jf.slice.pod_ports):
            if _is_port_bound(cluster, jf) and all(free[p] > 0 for p, _ in jf.slice.pod_ports):
                out.add(jf.job_id)
    return out


def _is_port_bound(cluster: Cluster, jf: JobFabric) -> bool:
    """Would more ports on its pods make the job's pp+dp topology faster?"""
    servers: dict[str, int] = {}
    for s in jf.placement.servers:
        pod = cluster.server(s).pod_id
        servers[pod] = servers.get(pod, 0) + 1
    per_server = max(1, round(cluster.server_gbps / cluster.nic_gbps))
    return any(n < servers.get(p, 0) * per_server for p, n in jf.slice.pod_ports)


def _reallocate(
    state: ControllerState,
    jobs: tuple[PlacedJob, ...],
    reason: str,
    at_s: float,
    *,
    grow: bool,
    before_desired: tuple[CrossConnect, ...] | None = None,
    freed: Collection[str] | None = None,
    grown: Collection[str] = (),
    holder: str | None = None,
    regrown: Collection[str] = (),
) -> tuple[ControllerState, tuple[Decision, ...]]:
    """Re-allocate ports and re-plan the jobs whose allocation changed. `holder`: the job
    holding the shared ports' turn when the state does not say (a new leader's)."""
    cluster = state.cluster
    previous = state.fabric
    # every arrival and completion re-allocates ports by demand; a job whose
    # allocation changed is planned afresh, the others keep their cross-connects
    demands = [
        state.demands.get(pj.job.job_id) or job_demand(cluster, pj.job, pj.placement) for pj in jobs
    ]
    before_alloc = state.allocation
    allocation = allocate_ports(
        cluster,
        demands,
        previous=before_alloc if before_alloc.jobs else None,
        grown_pods=grown,
        regrown=regrown,
    )
    changed_alloc = {
        ja.job_id
        for ja in allocation.jobs
        if (was := before_alloc.job(ja.job_id)) is not ja and was != ja  # kept: same object
    }
    if before_alloc.turn_order != allocation.turn_order:
        changed_alloc |= set(before_alloc.turn_order) | set(allocation.turn_order)
    if previous is not None and changed_alloc:
        # a job whose circuits stay and whose spare ports only grew, or are not in use
        # (it holds its home topology, nothing waits for its gap), keeps its circuits
        # and routes: its slice changes in place. Re-planning it would rebuild the same.
        grew = {
            j: ja
            for j in changed_alloc - set(allocation.turn_order)
            if (ja := allocation.job(j)) is not None
            and _only_spare_changed(before_alloc.job(j), ja, _spare_unused(state, j))
        }
        changed_alloc -= set(grew)
        previous = replace(
            previous,
            jobs=tuple(
                replace(j, slice=_grown_slice(j.slice, grew[j.job_id])) if j.job_id in grew else j
                for j in previous.jobs
                if j.job_id not in changed_alloc
            ),
        )
    ledger = state.fabric.aggregators if state.fabric is not None else AggregatorLedger()
    active = state.turn_order[0] if state.turn_order else holder
    fabric = plan_fabric(
        cluster,
        jobs,
        state.desired,
        ledger,
        previous,
        tdm_active=active,
        keep_turns=not grow,
        allocation=allocation,
    )
    state = replace(state, allocation=allocation)
    before = state.fabric or FabricPlan((), state.desired, 0.0, ledger, (), ())
    before = replace(
        before, cross_connects=state.desired if before_desired is None else before_desired
    )
    changes = changed_cross_connects(before.cross_connects, fabric.cross_connects)
    desired, pending, deferred = _defer_to_gaps(
        state, jobs, before.cross_connects, fabric.cross_connects, at_s, changes[0]
    )
    if deferred:
        changes = changed_cross_connects(before.cross_connects, desired)
    decisions = diff_plans(before, replace(fabric, cross_connects=desired), reason, changes)
    waiting = set(deferred) | {cc.job_id for cc in pending}
    if waiting:
        # their headers describe circuits not installed yet: sent with them, in the gap
        decisions = tuple(d for d in decisions if not (d.kind == "routing" and d.job_id in waiting))
    state = replace(
        state,
        jobs=jobs,
        fabric=fabric,
        desired=desired,
        pending=pending,
        deferred={j: at_s for j in deferred},
    )
    if active is None or not fabric.time_division or fabric.time_division[0] != active:
        state = replace(state, turn_started_s=at_s)
    changed = _jobs_changed(before.cross_connects, desired, changes)
    state = _record_installs(state, changed, at_s)
    state, follow = _follow_aggregators(state, ledger, changed_alloc, reason)
    return state, decisions + follow


def _only_spare_changed(was: JobAllocation | None, now: JobAllocation, unused: bool) -> bool:
    """Same mode and circuits; spare ports only added, or any change while `unused`."""
    if was is None or was.mode != MODE_ISOLATED or now.mode != MODE_ISOLATED:
        return False
    if was.circuits != now.circuits:
        return False
    if unused:
        return True
    before = Counter({(o, p): n for o, p, n in was.spare})
    after = Counter({(o, p): n for o, p, n in now.spare})
    return not before - after


def _spare_unused(state: ControllerState, job_id: str) -> bool:
    """Does the job hold only its allocation's circuits (no per-phase topology on spare
    ports, no change waiting for its compute gap)?

    Its cross-connects are counted per OXC and pod against its allocation's circuits:
    a held topology re-mapped after a per-phase one (`_rewire`) may sit on spare ports
    of another OXC than the allocation's (a test of the plan alone let an arrival be
    given ports such a job still joined: the arrival got no circuit)."""
    cycle = state.cycles.get(job_id)
    if not (
        cycle is not None
        and cycle.target == HELD_PLAN
        and cycle.home == HELD_PLAN
        and job_id not in state.deferred
        and not any(cc.job_id == job_id for cc in state.pending)
    ):
        return False
    ja = state.allocation.job(job_id)
    if ja is None:
        return False
    used = _pod_ports_of(state.cluster, cross_connects_by_job(state.desired).get(job_id, ()))
    return not used - _circuit_ports(ja.circuits)


def _grown_slice(slc: JobSlice, ja: JobAllocation) -> JobSlice:
    return replace(slc, pod_ports=ja.pod_ports, reason=ja.reason)


def _follow_aggregators(
    state: ControllerState, before: AggregatorLedger, planned: set[str], reason: str
) -> tuple[ControllerState, tuple[Decision, ...]]:
    """Per-iteration INC choice: when an arrival or completion fills or frees aggregators,
    running jobs under those switches re-choose for their next iteration (INC, or a
    ring when the aggregators are full) and their dp routing header says so."""
    fabric = state.fabric
    if fabric is None:
        return state, ()
    moved = {(g.tor_id, g.job_id, g.gbps) for g in before.grants} ^ {
        (g.tor_id, g.job_id, g.gbps) for g in fabric.aggregators.grants
    }
    switches = {sw for sw, _, _ in moved}
    if not switches:
        return state, ()
    cluster = state.cluster
    ledger = fabric.aggregators
    jobs = {pj.job.job_id: pj.job for pj in state.jobs}
    decisions: list[Decision] = []
    out = list(fabric.jobs)
    for i, jf in enumerate(fabric.jobs):
        job = jobs.get(jf.job_id)
        if job is None or jf.job_id in planned or job.parallelism.dp < 2:
            continue
        if job.collective not in (Collective.AUTO, Collective.INC):
            continue
        near = set(jf.collective.aggregators)
        for s in jf.placement.servers:
            server = cluster.server(s)
            near.update((server.tor_id, server.pod_id))
        if not near & switches:
            continue
        pod_gbps = jf.circuits.gbps(cluster.nic_gbps) if jf.circuits.total else None
        choice = choose_iteration_collective(
            cluster, job, jf.placement, ledger, jf.collective, pod_gbps
        )
        if choice is jf.collective:
            continue
        ledger = ledger.release(jf.job_id).reserve(cluster, choice.grants)
        new_jf = replace(jf, collective=choice)
        state = replace(state, fabric=replace(fabric, jobs=tuple(out)))
        fixed, routing = _with_circuits(state, new_jf, jf.circuits)
        out[i] = next(j for j in (fixed.jobs if fixed else ()) if j.job_id == jf.job_id)
        decisions += [Decision("routing", jf.job_id, reason, routing=r) for r in routing]
    if not decisions:
        return state, ()
    fabric = replace(fabric, jobs=tuple(out), aggregators=ledger)
    return replace(state, fabric=fabric), tuple(decisions)


def _defer_to_gaps(
    state: ControllerState,
    jobs: Sequence[PlacedJob],
    before: Sequence[CrossConnect],
    after: Sequence[CrossConnect],
    at_s: float,
    gone: Sequence[CrossConnect],
) -> tuple[tuple[CrossConnect, ...], tuple[CrossConnect, ...], frozenset[str]]:
    """What to install now, what waits, and for whose compute gap.

    A running job that loses cross-connects while its phases are predicted and
    its next phase is too close for a reconfiguration keeps its old ones until
    its gap; cross-connects of other jobs that need its ports wait with it.
    Everything else (new circuits on free ports) is installed now. `gone`: the
    cross-connects of `before` that `after` does not hold (`changed_cross_connects`).
    """
    running = {pj.job.job_id for pj in jobs}
    deferred = set()
    for job_id in sorted({cc.job_id for cc in gone}):
        if job_id not in running:
            continue
        cycle = state.cycles.get(job_id)
        if cycle is None or not cycle.confirmed_period or cycle.predictor.period is None:
            continue  # nothing known of its gaps: the change goes now
        gap = should_preinstall(
            cycle.arrivals,
            at_s,
            state.config.reconfig_ms,
            cycle.predictor.period,
            guard_ms=state.config.guard_ms,
        )
        if not gap.fits:
            deferred.add(job_id)
    if not deferred:
        return tuple(after), (), frozenset()
    # what a deferred job keeps until its gap: never a cross-connect on a failed port
    # (those are gone already; kept, they stayed on a dead switch until the gap)
    usable = port_pods(state.cluster)
    kept = [
        cc
        for cc in before
        if cc.job_id in deferred
        and (cc.oxc_id, cc.port_a) in usable
        and (cc.oxc_id, cc.port_b) in usable
    ]
    busy = {(cc.oxc_id, p) for cc in kept for p in (cc.port_a, cc.port_b)}
    now: list[CrossConnect] = []
    later: list[CrossConnect] = []
    for cc in after:
        if (
            cc.job_id in deferred
            or (cc.oxc_id, cc.port_a) in busy
            or (cc.oxc_id, cc.port_b) in busy
        ):
            later.append(cc)
        else:
            now.append(cc)
    desired = tuple(sorted(now + kept, key=lambda c: c.key))
    return desired, tuple(later), frozenset(deferred)


def _apply_deferred(
    state: ControllerState, job_ids: Sequence[str], at_s: float, reason: str
) -> tuple[ControllerState, tuple[Decision, ...]]:
    """Install what waited for these jobs' compute gaps (and what waited on their ports)."""
    going = set(job_ids) & set(state.deferred)
    if not going:
        return state, ()
    still = {j: t for j, t in state.deferred.items() if j not in going}
    stay = [cc for cc in state.desired if cc.job_id not in going]
    busy = {(cc.oxc_id, p) for cc in stay if cc.job_id in still for p in (cc.port_a, cc.port_b)}
    freed: list[CrossConnect] = []
    waiting: list[CrossConnect] = []
    for cc in state.pending:
        # the going jobs' own changes too: one that needs a port a job still waiting for
        # its gap holds waits with it (installed now, it joined that port twice)
        if cc.job_id in still or (cc.oxc_id, cc.port_a) in busy or (cc.oxc_id, cc.port_b) in busy:
            waiting.append(cc)
        else:
            freed.append(cc)
    desired = tuple(sorted(stay + freed, key=lambda c: c.key))
    changes = changed_cross_connects(state.desired, desired)
    decisions = tuple(oxc_decisions(*changes, reason))
    changed = _jobs_changed(state.desired, desired, changes)
    held_back = set(still) | {cc.job_id for cc in waiting}
    state = replace(state, desired=desired, pending=tuple(waiting), deferred=still)
    # each job's headers on the circuits it holds once this is installed: what was
    # planned for it may since have been re-routed (a turn given while its circuits
    # waited to go), so the plan's headers could name circuits this change removes
    routing: list[Decision] = []
    for job_id in sorted(set(changed) - held_back):
        jf = state.job_fabric(job_id)
        if jf is None:
            continue
        if jf.slice.mode != MODE_ELECTRICAL:  # (the core's headers name no circuit)
            real = realised_circuits(state.cluster, (cc for cc in desired if cc.job_id == job_id))
            fabric, _ = _with_circuits(state, jf, real)
            state = replace(state, fabric=fabric)
            jf = state.job_fabric(job_id)
            assert jf is not None
        routing += [Decision("routing", job_id, reason, routing=r) for r in jf.routing]
    state = _record_installs(state, changed, at_s)
    # a job that went back to its held topology while these held its ports came out
    # short of a pair: mapped again now that they are free
    refill: list[Decision] = []
    for jf in state.fabric.jobs if state.fabric is not None else ():
        cycle = state.cycles.get(jf.job_id)
        if (
            jf.slice.mode == MODE_ISOLATED
            and cycle is not None
            and cycle.target == HELD_PLAN
            and jf.job_id not in held_back
            and _short_of_plan(state, jf)
        ):
            state, made = _rewire(state, jf, HELD_PLAN, at_s, reason)
            refill.extend(made)
    # the turn holder's turn began while these held the shared ports (mapped around
    # them): it takes them now (a fuzzer: a turn holder held none of its 2 circuits
    # once the job leaving them for its gap had gone)
    holder = state.job_fabric(state.turn_order[0]) if state.turn_order else None
    if holder is not None and holder.job_id not in held_back and _turn_short_of_plan(state, holder):
        state, made = _rotate_to(state, holder.job_id, at_s, reason)
        refill.extend(made)
    return state, decisions + tuple(routing) + tuple(refill)


def _short_of_plan(state: ControllerState, jf: JobFabric) -> bool:
    """Does the job hold no circuit on a pod pair its plan joins?"""
    held = realised_circuits(
        state.cluster, cross_connects_by_job(state.desired).get(jf.job_id, ()), jf.job_id
    )
    return any(not held.get(a, b) for a, b, _ in jf.plan.circuits.pairs())


def _turn_short_of_plan(state: ControllerState, jf: JobFabric) -> bool:
    """Does the job holding the shared ports' turn hold fewer circuits on some pair than
    its plan names?"""
    if jf.slice.mode != MODE_TIME_DIVISION or not jf.plan.circuits.total:
        return False
    held = realised_circuits(
        state.cluster, cross_connects_by_job(state.desired).get(jf.job_id, ()), jf.job_id
    )
    return any(held.get(a, b) < n for a, b, n in jf.plan.circuits.pairs())


def _jobs_changed(
    before: Sequence[CrossConnect],
    after: Sequence[CrossConnect],
    changes: tuple[tuple[CrossConnect, ...], tuple[CrossConnect, ...]],
) -> dict[str, str | None]:
    """Jobs whose cross-connects differ, with None (the caller sets what they are for)."""
    gone, added = changes
    was, now = cross_connects_by_job(before), cross_connects_by_job(after)
    out: dict[str, str | None] = {}
    for j in sorted({cc.job_id for cc in gone + added}):
        if {cc.key for cc in was.get(j, ())} != {cc.key for cc in now.get(j, ())}:
            out[j] = None
    return out


def _record_installs(
    state: ControllerState, changed: Mapping[str, str | None], at_s: float
) -> ControllerState:
    """Start an unconfirmed install for each changed job (held topology unless told)."""
    if not changed:
        return state
    cycles = dict(state.cycles)
    for job_id, target in changed.items():
        cycle = cycles.get(job_id)
        if cycle is None:
            continue
        if target is None:
            jf = state.job_fabric(job_id)
            on_turn = jf is not None and (
                jf.slice.mode not in (MODE_TIME_DIVISION, MODE_ELECTRICAL)
                or state.turn_order[:1] == (job_id,)
            )
            target = HELD_PLAN if on_turn else OFF_TURN
        installs = (cycle.installs + (Install(target, at_s),))[-INSTALLS_KEPT:]
        acc = replace(cycle.accounting, reconfigurations=cycle.accounting.reconfigurations + 1)
        cycles[job_id] = replace(cycle, installs=installs, accounting=acc)
    return replace(state, cycles=cycles)


# ------------------------------------------------------------------ confirmations


def _confirmed(state: ControllerState, e: SwitchConfirmed) -> ControllerState:
    mine: dict[str, set[tuple[str, int, int]]] = {}
    for cc in state.desired:
        mine.setdefault(cc.job_id, set()).add(cc.key)
    cycles = dict(state.cycles)
    gone = state.confirmed - e.held
    for job_id, keys in mine.items() if gone else ():
        cycle = cycles.get(job_id)
        if cycle is None or not (keys & gone):
            continue
        if cycle.installs and cycle.installs[-1].confirmed_at_s is None:
            continue  # its change waits for a confirmation anyway
        # the switches lost circuits they had confirmed for it: until they hold them
        # again its phases run without its topology (scored as they come)
        lost = Install(cycle.target, e.at_s, restore=True)
        cycles[job_id] = replace(cycle, installs=(cycle.installs + (lost,))[-INSTALLS_KEPT:])
    for job_id, cycle in cycles.items():
        if not cycle.installs or cycle.installs[-1].confirmed_at_s is not None:
            continue
        if not mine.get(job_id, set()) <= e.held:
            continue
        installs = tuple(
            i if i.confirmed_at_s is not None else replace(i, confirmed_at_s=e.at_s)
            for i in cycle.installs
        )
        cycle = replace(cycle, installs=installs)
        # in start order: the exposed time counted so far is a high-water mark (reports
        # may come in out of order; a later start scored first hid an earlier's wait)
        for w in sorted(cycle.waiting, key=lambda w: w.started_at_s):
            cycle = _score(cycle, w.plan_id, w.started_at_s, timed=w.timed)
        cycles[job_id] = replace(cycle, waiting=())
    return replace(state, confirmed=e.held, cycles=cycles)


def _score(cycle: JobCycle, plan_id: str, started_at_s: float, *, timed: bool = True) -> JobCycle:
    """Score one phase against what the switches held when it started (see module doc).

    `timed`: its start is on our clock; a phase whose start is not (the reporter's
    clock ran ahead) is never a hit."""
    if plan_id == EMPTY_PLAN_ID:
        return replace(cycle, accounting=cycle.accounting.plus("held"))
    install = None
    for i in reversed(cycle.installs):
        if i.requested_at_s <= started_at_s:
            install = i
            break
    if install is None:
        # before the job's first change was asked for: what placement left it, kept
        return replace(cycle, accounting=cycle.accounting.plus("held"))
    if install.confirmed_at_s is None:
        waiting = cycle.waiting + (WaitingPhase(plan_id, started_at_s, timed),)
        return replace(cycle, waiting=waiting)
    if install.confirmed_at_s > started_at_s:
        # from its start (or the request) to the confirmation, less what an earlier
        # waiting phase already counted: phases reported 0.3 s apart through a 20 s
        # switch outage were charged 10 s each, 650 s for one job
        begin = max(started_at_s, install.requested_at_s, cycle.exposed_until_s)
        exposed = max(0.0, install.confirmed_at_s - begin)
        cycle = replace(cycle, exposed_until_s=max(cycle.exposed_until_s, install.confirmed_at_s))
        # what happened, not what the gap estimate promised: a rewiring the switches
        # confirmed after its phase began did not fit, and the job holds until
        # rewirings fit again (a sweep's 30 ms gaps: 55 of 80 phases missed while every
        # rewiring was estimated to fit, decided 11-34 ms ahead of a 25 ms switch)
        if install.restore:
            return replace(cycle, accounting=cycle.accounting.plus("miss", exposed))
        fits = (cycle.fits + (False,))[-max(2, len(cycle.fits)) :]
        return replace(cycle, fits=fits, accounting=cycle.accounting.plus("miss", exposed))
    if install.target == plan_id:
        return replace(cycle, accounting=cycle.accounting.plus("hit" if timed else "miss"))
    if install.target in (HELD_PLAN, cycle.home) or (
        cycle.kept_at_s is not None and install.requested_at_s <= cycle.kept_at_s <= started_at_s
    ):
        # the topology kept for it: the pp+dp one, the home one, or another phase's the
        # controller chose to keep rather than expose a rewiring
        return replace(cycle, accounting=cycle.accounting.plus("held"))
    return replace(cycle, accounting=cycle.accounting.plus("miss"))


# ------------------------------------------------------------------ phases


def _observed(
    state: ControllerState, e: PhaseObserved
) -> tuple[ControllerState, tuple[Decision, ...]]:
    cycle = state.cycles.get(e.job_id)
    jf = state.job_fabric(e.job_id)
    if cycle is None or jf is None:
        return state, ()  # not placed (yet, or any more): nothing to learn
    catalog, plan_id = classify_plan(cycle.catalog, e.demand)
    cycle = replace(cycle, catalog=catalog, last_plan=plan_id)
    ja = state.allocation.job(e.job_id)
    if cycle.fitted_to is not ja:
        cycle = _refit(state.cluster, jf, cycle, ja)
    if plan_id not in cycle.demands:
        cycle = _learn_plan(state.cluster, jf, cycle, plan_id, e.demand, e.flows)
    elif e.demand.total_bytes > RELEARN_FACTOR * _peak(cycle, plan_id).total_bytes:
        cycle = replace(cycle, peaks={**cycle.peaks, plan_id: e.demand})
    started = e.started_at_s
    if started > e.at_s:  # reported to start after we saw it: the reporter's clock is ahead
        started = e.at_s
        cycle = replace(cycle, clock_ahead_at_s=e.at_s)
    cycle = _score(cycle, plan_id, started, timed=started == e.started_at_s)
    predictor, outcome = step_predictor(cycle.predictor, plan_id)
    arrivals = (cycle.arrivals + (started,))[-ARRIVALS_KEPT:]
    ends = (cycle.ends + (e.at_s,))[-ARRIVALS_KEPT:]
    confirmed = cycle.confirmed_period or (outcome.hit and predictor.period is not None)
    cycle = replace(
        cycle, predictor=predictor, arrivals=arrivals, ends=ends, confirmed_period=confirmed
    )
    cycle = _choose_home(state, jf, cycle)
    target, fits = _next_target(state, jf, cycle, e.at_s)
    if fits is not None:
        period = predictor.period or 1
        cycle = replace(cycle, fits=(cycle.fits + (fits,))[-max(2, period) :])
    if target is None and fits is False:
        cycle = replace(cycle, kept_at_s=e.at_s)
    learned, cycle = _learned_demand(state, jf, cycle)
    if learned is not None:
        cycle = replace(cycle, learned=True)
    cycles = dict(state.cycles)
    cycles[e.job_id] = cycle
    state = replace(state, cycles=cycles)
    if learned is not None:
        state, realloc = _relearned(state, learned, e.at_s)
        if realloc:
            return state, realloc  # the job re-planned: this phase's choice is made
    if e.job_id in state.deferred:
        gap = should_preinstall(
            cycle.arrivals,
            e.at_s,
            state.config.reconfig_ms,
            predictor.period,
            guard_ms=state.config.guard_ms,
        )
        if gap.fits or e.at_s - state.deferred[e.job_id] > MAX_DEFER_S:
            return _apply_deferred(state, (e.job_id,), e.at_s, "phase")
        return state, ()  # its re-allocation waits for a gap: no rewiring before it
    if any(cc.job_id == e.job_id for cc in state.pending):
        # changes of its own wait for another job's gap: it keeps its topology until they
        # are in (rewired meanwhile, they were installed beside a per-phase topology)
        return state, ()
    if jf.slice.mode == MODE_TIME_DIVISION:
        return _turn_for_phase(state, e.job_id, plan_id, e.at_s)
    if target is None or target == cycle.target:
        return state, ()
    return _rewire(state, jf, target, e.at_s)


def _learned_demand(
    state: ControllerState, jf: JobFabric, cycle: JobCycle
) -> tuple[JobDemand | None, JobCycle]:
    """The job's demand as its reports show it, where they show what it is not given.

    A job's ports follow the demand its model facts give (defaults where the launcher
    stated none, and no compute time where it stated none: SPEC 3 asks the network to
    work from observed traffic then). Once the predictor has followed the job's period
    `RELEARN_CYCLES` times, one learned period is read as one iteration:

    - bytes, for a job whose traffic facts were not all stated (stated ones are
      trusted): compared pod pair by pod pair with the demand in use and with what
      the model says the job's collective sends; where they exceed both by
      `RELEARN_FACTOR`, the demand becomes the larger of the learned and the modelled
      bytes, pair by pair and way by way (telemetry that misses a phase never takes a
      job's circuits);
    - compute, for a job that stated none: its iteration as the kept phase starts show
      it (`_iteration_s`, on the reporter's clock) less the demand's network time on
      its slice, learned again when it moves by `RELEARN_FACTOR`.

    In the simulator jobs state their facts and compute times, and the reports are the
    model's, so this never fires there. Checked once per learned period (whichever
    plan it starts at), collective and demand in use (the key kept in the cycle).
    Only the pod pairs the job is given are learned: a pair its model does not cross
    would start with no circuit."""
    predictor = cycle.predictor
    if not cycle.confirmed_period or predictor.cycle_count < RELEARN_CYCLES:
        return None, cycle
    phases = predictor.queue
    queue = tuple(q for q in phases if q != EMPTY_PLAN_ID)
    in_use = state.demands.get(jf.job_id)
    if in_use is None or any(q not in cycle.demands for q in queue):
        return None, cycle
    # a rotation of the period is the same period (the queue starts at the next plan);
    # a plan's bytes grew; every few periods (the compute time, on the latest periods)
    key: tuple[object, ...] = (
        tuple(sorted(queue)),
        tuple(_peak(cycle, q).total_bytes for q in queue),
        jf.collective,
        in_use,
        predictor.cycle_count // RELEARN_CYCLES,
    )
    if key == cycle.demand_checked:
        return None, cycle
    cycle = replace(cycle, demand_checked=key)
    cluster = state.cluster
    # only the pairs the job is given: a pair its model does not cross (a collective
    # ordered otherwise) would start with no circuit, and nothing may shrink for it
    given = {(a, b): n for a, b, n in in_use.pair_bytes}
    ways_seen = {
        k: ways for k, ways in pair_ways(_peak(cycle, q) for q in queue).items() if k in given
    }
    seen = {k: max(ways) for k, ways in ways_seen.items()}
    demand = in_use
    job = _job_of(state, jf.job_id)
    if resolve_facts(job).defaulted and _exceeds(seen, given):
        traffic = job_traffic(
            cluster, job, jf.placement, jf.collective.algorithm, dict(jf.collective.root_tors)
        )
        modelled = pair_ways(t.pod_demand for t in traffic if t.phase in (PHASE_PP, PHASE_DP))
        if _exceeds(seen, {k: max(ways) for k, ways in modelled.items()}):
            # never below what is in use either (a period without a pair's heavy phase
            # took it back to the model)
            pairs = {
                k: _larger_ways(ways_seen.get(k), modelled.get(k), n) for k, n in given.items()
            }
            demand = demand_of_pairs(cluster, jf.job_id, jf.placement, pairs, in_use.compute_s)
    p = len(phases)
    # (a job with no cross-pod pair has no network time to weigh against it)
    if (
        demand.pair_bytes
        and compute_estimate_s(job) == 0
        and (iteration_s := _iteration_s(cycle.arrivals, p)) is not None
    ):
        compute_s = iteration_s - network_s(
            demand, _slice_pairs(state, jf.job_id), cluster.nic_gbps
        )
        was = demand.compute_s
        if (
            0 < compute_s < math.inf
            and not was / RELEARN_FACTOR <= compute_s <= was * RELEARN_FACTOR
        ):
            demand = replace(demand, compute_s=compute_s)
    return (demand if demand != in_use else None), cycle


# q-spaced phase starts are one iteration apart when this share of them lie within
# STEADY_SPREAD of their median (the rest: a warm-up, a batch delivered at once)
STEADY_SHARE = 0.8
STEADY_SPREAD = 0.1
STEADY_GAPS = 4  # and there are at least this many


def _iteration_s(arrivals: Sequence[float], period: int) -> float | None:
    """The job's iteration as its phase starts show it: the median time q phases apart
    for the smallest multiple q of the predictor's period whose gaps agree
    (`STEADY_SHARE` of them within `STEADY_SPREAD` of it). A warm-up, or phases a batch delivered
    at one instant, do not move a median; and where pp and dp phases on the same pod
    pair share a plan id the predictor's period is half an iteration, its gaps
    alternate, and the next multiple is the iteration (a sweep's job learned half its
    compute time, and flipped between the two every check). None: no steady spacing."""
    n = len(arrivals)
    for q in range(period, min(8 * period, n - STEADY_GAPS) + 1, period):
        gaps = [arrivals[i + q] - arrivals[i] for i in range(n - q)]  # STEADY_GAPS or more
        mid = statistics.median(gaps)
        devs = sorted(abs(g - mid) for g in gaps)
        if mid > 0 and devs[int(STEADY_SHARE * (len(devs) - 1))] <= STEADY_SPREAD * mid:
            return mid
    return None


def _peak(cycle: JobCycle, plan_id: str) -> DemandMatrix:
    return cycle.peaks.get(plan_id) or cycle.demands[plan_id]


def _larger_ways(
    seen: Sequence[float] | None, modelled: Sequence[float] | None, given: float
) -> list[float]:
    """A pair's bytes each way: the larger of the learned and the modelled, scaled up to
    the bytes given where both fall short of them (both ways alike where neither says)."""
    if seen is None and modelled is None:
        return [given, given]
    none = (0.0, 0.0)
    ways = [max(x, y) for x, y in zip(seen or none, modelled or none, strict=True)]
    top = max(ways)
    return [w * given / top for w in ways] if 0 < top < given else ways


def _slice_pairs(state: ControllerState, job_id: str) -> dict[tuple[str, str], int]:
    """Circuits per pod pair of the job's allocation: its pp+dp slice, whichever phase's
    topology is installed now (a phase's own circuits leave the other phase's pairs
    without any)."""
    ja = state.allocation.job(job_id)
    return ja.pair_circuits() if ja is not None else {}


def _exceeds(seen: Mapping[tuple[str, str], float], given: Mapping[tuple[str, str], float]) -> bool:
    """Do the learned bytes exceed the given ones by `RELEARN_FACTOR` on some pair?"""
    return any(n > RELEARN_FACTOR * given.get(k, 0.0) for k, n in seen.items() if n > 0)


def _relearned(
    state: ControllerState, demand: JobDemand, at_s: float
) -> tuple[ControllerState, tuple[Decision, ...]]:
    """The job's learned demand in use. Bytes that grew: it keeps its circuits and takes
    more as an arrival would (free ports, then circuits of jobs on its pods while they
    stay less slowed), the others keep theirs. A compute time learned alone changes no
    circuit: it weighs the job's network time from the next allocation on."""
    job_id = demand.job_id
    was = state.demands.get(job_id)
    demands = dict(state.demands)
    demands[job_id] = demand
    state = replace(state, demands=demands)
    if was is not None and was.pair_bytes == demand.pair_bytes:
        return state, ()
    # what waited for a compute gap goes in before the re-allocation, as before an
    # arrival's (a review's fuzz: re-planned over pending changes, a job's circuits
    # were left unmapped)
    state, flushed = _apply_deferred(state, tuple(state.deferred), at_s, "phase")
    state, made = _reallocate(state, state.jobs, "prediction", at_s, grow=False, regrown=(job_id,))
    return state, flushed + made


def _refit(cluster: Cluster, jf: JobFabric, cycle: JobCycle, ja: JobAllocation | None) -> JobCycle:
    """The plans whose own circuits the job's ports no longer make switch by switch,
    learned again on its new allocation (learned on the ports it had, a rewiring for
    one dropped what did not fit: a fuzzer's job rewired for one pair of pods got 1 of
    its 4 circuits there, in place of a held topology of 3 circuits). Plans that still
    fit are kept: an allocation that only grew leaves the job's topologies alone."""
    cycle = replace(cycle, fitted_to=ja)
    if ja is None or not cycle.circuits or jf.slice.mode != MODE_ISOLATED:
        return cycle  # (per-phase circuits are an isolated slice's)
    room = switch_room(ja.oxc_ports)
    for plan_id, circuits in list(cycle.circuits.items()):
        if circuits_on_switches(room, circuits) is not circuits:
            cycle = _learn_plan(cluster, jf, cycle, plan_id, cycle.demands[plan_id])
    return cycle


def _learn_plan(
    cluster: Cluster,
    jf: JobFabric,
    cycle: JobCycle,
    plan_id: str,
    demand: DemandMatrix,
    flows: tuple[Flow, ...] = (),
) -> JobCycle:
    """Remember a new plan's demand, its own circuits in the slice and what they gain
    (and its reported flows, for the header of a rewiring to them). The circuits are
    those the job's ports make switch by switch (`cycle.fitted_to`'s), not only
    per pod: a circuit joins two ports of one OXC."""
    demands = dict(cycle.demands)
    demands[plan_id] = demand
    circuits = dict(cycle.circuits)
    gains = dict(cycle.gains)
    kept = cycle.flows
    if plan_id != EMPTY_PLAN_ID and jf.slice.mode == MODE_ISOLATED:
        budget = dict(jf.slice.pod_ports)
        matrix = _slice_matrix(demand, budget)
        if matrix is not None:
            fit = cycle.fitted_to
            own = plan_topology(cluster, matrix, budget, fit.oxc_ports if fit else None)
            held = evaluate_circuits(matrix, jf.plan.circuits, budget, cluster.nic_gbps)
            circuits[plan_id] = own.circuits
            gains[plan_id] = (
                held.completion_s / own.completion_s - 1.0 if own.completion_s > 0 else 0.0
            )
            if flows and len(flows) <= MAX_FLOWS_KEPT:
                kept = dict(list(cycle.flows.items())[-(FLOWS_KEPT - 1) :])
                kept[plan_id] = flows
    return replace(cycle, demands=demands, circuits=circuits, gains=gains, flows=kept)


def _next_target(
    state: ControllerState, jf: JobFabric, cycle: JobCycle, now_s: float
) -> tuple[str | None, bool | None]:
    """Hold or rewire: what the job's circuits should be for next, and did a rewiring fit.

    Per-phase circuits only for an isolated slice, once the predicted period came
    true, while every recent rewiring fitted its compute gap, and for a plan whose
    own circuits beat the held ones; otherwise the job holds its pp+dp topology.
    """
    if jf.slice.mode != MODE_ISOLATED:
        return None, None
    predictor = cycle.predictor
    nxt = predictor.next_plan
    home = cycle.home
    if predictor.period is None or nxt is None or not cycle.confirmed_period:
        return HELD_PLAN, None
    if not cycle.clock_trusted(now_s):
        return HELD_PLAN, None  # gaps measured on a clock running ahead: hold
    wanted = nxt if nxt != home and cycle.gains.get(nxt, 0.0) > MIN_GAIN else None
    if nxt == home:
        wanted = home
    if nxt == EMPTY_PLAN_ID or (wanted is None and cycle.target != home):
        # an idle phase needs no circuits; a plan the home topology serves as well
        # keeps what is installed, unless that is another plan's topology
        wanted = cycle.target if nxt == EMPTY_PLAN_ID else home
    if wanted is None:
        wanted = home
    if wanted == cycle.target:
        return wanted, None
    gap = should_preinstall(
        cycle.arrivals,
        now_s,
        state.config.reconfig_ms,
        predictor.period,
        guard_ms=state.config.guard_ms,
    )
    if not gap.fits:
        if wanted == home and _home_pays_exposed(state, jf, cycle):
            return home, None  # once: the cycle it saves every iteration outweighs the wait
        return None, False  # keep what is installed: a rewiring now would be exposed
    if not all(cycle.fits) and wanted != home:
        return home, True  # a rewiring missed its gap lately: hold until they fit again
    if wanted != home and not _way_back(state, jf, cycle, wanted):
        # the phase after this one would run on `wanted`'s circuits and lose there
        # more than `wanted` gains: a one-way rewiring costs more than it saves
        return (home, True) if cycle.target != home else (home, None)
    return wanted, True


def _circuits_of(jf: JobFabric, cycle: JobCycle, target: str) -> PodCircuits | None:
    """The circuits a target stands for: the placement's pp+dp plan, or a plan's own."""
    return jf.plan.circuits if target == HELD_PLAN else cycle.circuits.get(target)


def _slice_matrix(demand: DemandMatrix, budget: Mapping[str, int]) -> DemandMatrix | None:
    """A phase's demand, by direction, over every pod of the job's slice; None when it
    leaves the slice.

    Circuits are full duplex and a phase's traffic may relay through any pod of the
    slice (two hops), so a one-way ring's pod with few ports can take its inbound
    traffic on every circuit's one direction and its outbound on the other: planned
    on each pair's larger direction both ways, the same ring needs twice the time.
    """
    entries = demand.entries()
    if any(p not in budget or q not in budget for p, q, _ in entries):
        return None
    return DemandMatrix.from_entries(sorted(budget), entries)


def _phase_s(state: ControllerState, jf: JobFabric, demand: DemandMatrix, on: PodCircuits) -> float:
    """One phase's transfer time on some circuits of the job's slice."""
    budget = dict(jf.slice.pod_ports)
    matrix = _slice_matrix(demand, budget)
    if matrix is None:
        return math.inf
    return evaluate_circuits(matrix, on, budget, state.cluster.nic_gbps).completion_s


def _cycle_s(state: ControllerState, jf: JobFabric, cycle: JobCycle, on: PodCircuits) -> float:
    """The learned cycle's busy phases on one topology held throughout."""
    queue = [q for q in cycle.predictor.queue if q != EMPTY_PLAN_ID]
    return sum(_phase_s(state, jf, cycle.demands[q], on) for q in queue)


def _choose_home(state: ControllerState, jf: JobFabric, cycle: JobCycle) -> JobCycle:
    """The topology to hold: the placement's pp+dp plan, or a plan's own circuits when they
    serve the learned cycle's phases, one after another, faster held throughout.

    The pp+dp plan serves the two phases' demands as if they overlapped; the phases of
    an iteration come one after the other, so the plan of the heavier phase (DP's ring)
    often serves the whole cycle better. Chosen once the period came true and every busy
    phase of it was seen; recomputed only when the slice, the period or the plans change.
    """
    predictor = cycle.predictor
    queue = tuple(q for q in predictor.queue if q != EMPTY_PLAN_ID)
    if (
        jf.slice.mode != MODE_ISOLATED
        or not cycle.confirmed_period
        or not queue
        or any(q not in cycle.demands for q in queue)
    ):
        return cycle if cycle.home == HELD_PLAN else replace(cycle, home=HELD_PLAN, home_of=())
    key: tuple[object, ...] = (
        queue,
        jf.slice.pod_ports,
        jf.plan.circuits,
        tuple(cycle.circuits.get(q) for q in queue),
    )
    if key == cycle.home_of:
        return cycle
    budget = dict(jf.slice.pod_ports)
    best, best_s = HELD_PLAN, _cycle_s(state, jf, cycle, jf.plan.circuits)
    for q in sorted(set(queue)):
        own = cycle.circuits.get(q)
        if own is None or any(own.row_sum(p) > budget.get(p, 0) for p in own.pod_ids):
            continue  # not learned on this slice
        took = _cycle_s(state, jf, cycle, own)
        if took < best_s * (1.0 - MIN_GAIN):
            best, best_s = q, took
    return replace(cycle, home=best, home_of=key)


def _home_pays_exposed(state: ControllerState, jf: JobFabric, cycle: JobCycle) -> bool:
    """Moving to the home topology with the reconfiguration exposed (no gap fits one): worth
    it when one cycle on it saves more than the reconfiguration costs, since the job then
    stays there (the saving repeats every iteration, the wait does not)."""
    now, home = _circuits_of(jf, cycle, cycle.target), _circuits_of(jf, cycle, cycle.home)
    if now is None or home is None or cycle.target not in (HELD_PLAN, *cycle.demands):
        return False
    if any(q not in cycle.demands for q in cycle.predictor.queue if q != EMPTY_PLAN_ID):
        return False
    reconfig_s = (state.config.reconfig_ms + state.config.guard_ms) / 1000.0
    return _cycle_s(state, jf, cycle, now) - _cycle_s(state, jf, cycle, home) > reconfig_s


def _way_back(state: ControllerState, jf: JobFabric, cycle: JobCycle, wanted: str) -> bool:
    """Does rewiring for `wanted` pay, counting the phase after it?

    The next busy phase after `wanted` either fits its own rewiring in the gap
    before it (the last phase's end to its start, from past cycles), or runs on
    `wanted`'s circuits; then the seconds it loses there against the held
    topology must be fewer than the seconds `wanted` gains on its own circuits.
    """
    predictor = cycle.predictor
    queue = predictor.queue
    ahead, follow = next(
        ((i, q) for i, q in enumerate(queue) if i >= 1 and q != EMPTY_PLAN_ID), (0, wanted)
    )
    if follow == wanted:
        return True
    gap = gap_before_s(cycle.arrivals, cycle.ends, ahead, predictor.period)
    reconfig_s = (state.config.reconfig_ms + state.config.guard_ms) / 1000.0
    if gap is not None and gap >= reconfig_s:
        return True
    after, mine = cycle.demands.get(follow), cycle.demands.get(wanted)
    circuits = cycle.circuits.get(wanted)
    home = _circuits_of(jf, cycle, cycle.home)
    if after is None or mine is None or circuits is None or home is None:
        return False
    gain = _phase_s(state, jf, mine, home) - _phase_s(state, jf, mine, circuits)
    loss = _phase_s(state, jf, after, circuits) - _phase_s(state, jf, after, home)
    return gain > loss


def _rewire(
    state: ControllerState, jf: JobFabric, target: str, at_s: float, reason: str = "prediction"
) -> tuple[ControllerState, tuple[Decision, ...]]:
    """Re-map the job's circuits inside its slice for `target`; routing follows."""
    cluster = state.cluster
    cycle = state.cycles[jf.job_id]
    circuits = _circuits_of(jf, cycle, target)
    if circuits is None:
        return state, ()
    mine = tuple(cc for cc in state.desired if cc.job_id == jf.job_id)
    others = tuple(cc for cc in state.desired if cc.job_id != jf.job_id)
    occupied = {(cc.oxc_id, p) for cc in others + state.pending for p in (cc.port_a, cc.port_b)}
    # within the ports its allocation gives it on each switch (a port free now may be
    # another job's, not connected yet: it took an arrival's ports, the arrival got
    # none) and those it holds (a plan may have put a circuit on another switch than
    # the allocated one, taken). Not ports nobody's allocation has: a later allocation
    # may promise them while the job's plan is left as it is (an arrival got none)
    ja = state.allocation.job(jf.job_id)
    allowed = None
    if ja is not None:
        allowed = Counter({(o, p): n for o, p, n in ja.oxc_ports}) | _pod_ports_of(cluster, mine)
    mapping = map_cross_connects(cluster, {jf.job_id: circuits}, mine, occupied, allowed)
    if mapping.unmapped and target != HELD_PLAN:
        # a phase's own circuits are planned on the ports its allocation makes switch by
        # switch (`_learn_plan`), but others may hold some of them for now: installed
        # short, a phase topology can serve it worse than the held one does
        if cycle.target == HELD_PLAN:
            return state, ()
        return _rewire(state, jf, HELD_PLAN, at_s, reason)
    desired = tuple(sorted(others + mapping.cross_connects, key=lambda cc: cc.key))
    changes = diff_cross_connects(mine, mapping.cross_connects)
    if not changes:
        if not cycle.installs:
            return state, ()
        cycles = dict(state.cycles)
        installs = cycle.installs[:-1] + (replace(cycle.installs[-1], target=target),)
        cycles[jf.job_id] = replace(cycle, installs=installs)
        return replace(state, cycles=cycles), ()
    decisions = [Decision("oxc", jf.job_id, reason, oxc=c) for c in changes]
    real = realised_circuits(cluster, mapping.cross_connects, jf.job_id)
    fabric, routing = _with_circuits(state, jf, real)
    if _unrouted(cluster, cycle.flows.get(target, ()), fabric, jf.job_id):
        # the phase these circuits are for, as reported, sends flows the modelled
        # headers do not route (a guessed model, other pods): a header of its own
        flows = cycle.flows[target]
        budget = dict(jf.slice.pod_ports) or {p: real.row_sum(p) for p in real.pod_ids}
        routing += (route_observed(cluster, jf.job_id, target, flows, real, budget),)
    decisions += [Decision("routing", jf.job_id, reason, routing=r) for r in routing]
    state = replace(state, desired=desired, fabric=fabric)
    return _record_installs(state, {jf.job_id: target}, at_s), tuple(decisions)


def _circuit_ports(circuits: Iterable[tuple[str, str, str, int]]) -> Counter[tuple[str, str]]:
    """(oxc, pod) -> ports these (oxc, pod_a, pod_b, n) circuits take."""
    out: Counter[tuple[str, str]] = Counter()
    for o, a, b, n in circuits:
        out[(o, a)] += n
        out[(o, b)] += n
    return out


def _pod_ports_of(cluster: Cluster, ccs: Iterable[CrossConnect]) -> Counter[tuple[str, str]]:
    """(oxc, pod) -> ports these cross-connects use."""
    where = port_pods(cluster)
    return Counter(
        (cc.oxc_id, where.get((cc.oxc_id, p), "")) for cc in ccs for p in (cc.port_a, cc.port_b)
    )


def _unrouted(
    cluster: Cluster, flows: Sequence[Flow], fabric: FabricPlan | None, job_id: str
) -> bool:
    """Does a reported flow cross pods without a route in the job's modelled headers?"""
    if not flows or fabric is None:
        return False
    jf = next((j for j in fabric.jobs if j.job_id == job_id), None)
    routed = {(r.src, r.dst) for h in (jf.routing if jf else ()) for r in h.routes}
    return any(
        (f.src, f.dst) not in routed and pod_of(cluster, f.src) != pod_of(cluster, f.dst)
        for f in flows
    )


def _with_circuits(
    state: ControllerState, jf: JobFabric, real: PodCircuits
) -> tuple[FabricPlan | None, tuple[RoutingDecision, ...]]:
    """The fabric with the job's realised circuits and fresh routing; the headers that changed."""
    cluster = state.cluster
    traffic = collective_traffic(cluster, _job_of(state, jf.job_id), jf.placement, jf.collective)
    budget = dict(jf.slice.pod_ports) or {p: real.row_sum(p) for p in real.pod_ids}
    routing = route_phases(cluster, jf.job_id, traffic, jf.collective, real, budget)
    old = {r.phase: r for r in jf.routing}
    changed = tuple(r for r in routing if old.get(r.phase) != r)
    new_jf = replace(jf, circuits=real, routing=routing)
    fabric = state.fabric
    if fabric is not None:
        fabric = replace(
            fabric, jobs=tuple(new_jf if j.job_id == jf.job_id else j for j in fabric.jobs)
        )
    return fabric, changed


def _job_of(state: ControllerState, job_id: str) -> Job:
    return next(pj.job for pj in state.jobs if pj.job.job_id == job_id)


# ------------------------------------------------------------------ turns


def _tick(state: ControllerState, e: Tick) -> tuple[ControllerState, tuple[Decision, ...]]:
    """Rotate the turn on shared ports when it has lasted `turn_s` and others wait."""
    overdue = [j for j, t in state.deferred.items() if e.at_s - t > MAX_DEFER_S]
    if overdue:
        state, flushed = _apply_deferred(state, overdue, e.at_s, "reconcile")
        state, rest = _tick(state, e)
        return state, flushed + rest
    order = state.turn_order
    if len(order) < 2 or e.at_s - state.turn_started_s < state.config.turn_s:
        return state, ()
    return _rotate_to(state, order[1], e.at_s)


def _turn_for_phase(
    state: ControllerState, job_id: str, plan_id: str, at_s: float
) -> tuple[ControllerState, tuple[Decision, ...]]:
    """CASSINI-style interleaving on shared ports: a sharer whose communication phase
    has come takes the turn at once when the job holding it is in a compute gap
    long enough to switch there and back (its next phase predicted further off)."""
    order = state.turn_order
    if plan_id == EMPTY_PLAN_ID or job_id not in order or order[0] == job_id:
        return state, ()
    holder = state.cycles.get(order[0])
    if holder is None or holder.predictor.period is None or not holder.confirmed_period:
        return state, ()  # nothing known of the holder's gaps: the clock rotates turns
    gap = should_preinstall(
        holder.arrivals,
        at_s,
        2 * state.config.reconfig_ms,
        holder.predictor.period,
        guard_ms=state.config.guard_ms,
    )
    if not gap.fits:
        return state, ()
    return _rotate_to(state, job_id, at_s)


def _rotate_to(
    state: ControllerState, job_id: str, at_s: float, reason: str = "phase"
) -> tuple[ControllerState, tuple[Decision, ...]]:
    """Give the turn on the shared ports to `job_id` (turn order rotated to it); to the
    job holding it: its turn's circuits mapped again, on ports freed since (its turn
    goes on)."""
    order = state.turn_order
    fabric = state.fabric
    assert fabric is not None
    i = order.index(job_id)
    rotated = order[i:] + order[:i]
    head = fabric.job(rotated[0])
    leaving = order[0]
    if head is None:
        return state, ()
    goes_on = leaving == head.job_id
    pair = (leaving, head.job_id)
    others = tuple(cc for cc in state.desired if cc.job_id not in pair)
    # the ports other jobs' changes wait for stay theirs (the two jobs' own waiting
    # changes are decided again here)
    waiting = tuple(cc for cc in state.pending if cc.job_id not in pair)
    occupied = {(cc.oxc_id, p) for cc in others + waiting for p in (cc.port_a, cc.port_b)}
    old = tuple(cc for cc in state.desired if cc.job_id in pair)
    # within the shared pool's ports on each switch and those nobody's allocation has (a
    # free port beyond them may be an isolated job's, not connected yet)
    budget = turn_ports(state.cluster, state.allocation)
    mapping = map_cross_connects(
        state.cluster, {head.job_id: head.plan.circuits}, old, occupied, budget
    )
    desired = tuple(sorted(others + mapping.cross_connects, key=lambda cc: cc.key))
    decisions = oxc_decisions(*changed_cross_connects(old, mapping.cross_connects), reason)
    if goes_on and not decisions:
        return state, ()  # nothing freed that its turn can use
    # a change still waiting for either job's compute gap was planned before this turn:
    # what the two hold is decided here, so at that gap the holder keeps its turn's
    # circuits (they avoid every port the waiting changes need) and the job leaving
    # gets none back; the other jobs' waiting changes still go in then
    pending = waiting + mapping.cross_connects if head.job_id in state.deferred else waiting
    state = replace(
        state,
        fabric=replace(fabric, time_division=rotated),
        desired=desired,
        pending=pending,
        turn_started_s=state.turn_started_s if goes_on else at_s,
    )
    real = realised_circuits(state.cluster, mapping.cross_connects, head.job_id)
    turns = {head.job_id: real} if goes_on else {head.job_id: real, leaving: PodCircuits((), ())}
    for jf_id, circuits in turns.items():
        jf = state.job_fabric(jf_id)
        if jf is None:
            continue
        new_fabric, routing = _with_circuits(state, jf, circuits)
        state = replace(state, fabric=new_fabric)
        decisions += [Decision("routing", jf_id, reason, routing=r) for r in routing]
    installs = {head.job_id: HELD_PLAN} if goes_on else {head.job_id: HELD_PLAN, leaving: OFF_TURN}
    state = _record_installs(state, installs, at_s)
    return state, tuple(decisions)


# ------------------------------------------------------------------ views


def network_view(state: ControllerState, job_id: str) -> NetworkView | None:
    """How the job's cross-pod traffic is served now, with an estimated slowdown."""
    jf = state.job_fabric(job_id)
    if jf is None:
        return None
    cluster = state.cluster
    if jf.slice.mode == MODE_NONE:
        return NetworkView(NETWORK_NONE, (), 1.0, "no inter-pod traffic")
    if jf.slice.mode == MODE_ELECTRICAL:
        ja = state.allocation.job(job_id)
        s = ja.estimated_slowdown if ja is not None else math.inf
        slowdown = s if math.isfinite(s) else None
        return NetworkView(NETWORK_ELECTRICAL, (), slowdown, jf.slice.reason)
    shared = jf.slice.mode == MODE_TIME_DIVISION
    if shared:
        pods = sorted(
            {p for p, _, _ in jf.plan.circuits.pairs()}
            | {q for _, q, _ in jf.plan.circuits.pairs()}
        )
        ports = tuple((p, jf.plan.circuits.row_sum(p)) for p in pods)
    else:
        ports = jf.slice.pod_ports
    net_s = jf.plan.completion_s
    # the same yardstick as the allocation's estimate (and the reason's figure): the
    # job's iteration on non-blocking circuits as its pods stood at arrival, so losing
    # ports or circuits can only raise the figure
    demand = state.demands.get(job_id) or job_demand(cluster, _job_of(state, job_id), jf.placement)
    alone = ideal_iteration_s(demand, cluster.nic_gbps)
    cycle = state.cycles.get(job_id)
    if cycle is not None and cycle.learned and not shared:
        # the plan times the modelled traffic: the learned bytes on the job's slice
        net_s = max(net_s, network_s(demand, _slice_pairs(state, job_id), cluster.nic_gbps))
    sharers = len(state.turn_order) if shared else 1
    turn_s = state.config.turn_s
    overhead = 1.0 / max(1e-9, 1.0 - state.config.reconfig_ms / 1000.0 / turn_s) if shared else 1.0
    now = demand.compute_s + net_s * sharers * overhead
    finite = 0 < alone < math.inf and math.isfinite(now)
    slowdown = round(max(1.0, now / alone), 4) if finite else None
    mode = NETWORK_SHARED if shared else NETWORK_ISOLATED
    if shared:
        reason = jf.slice.reason
        if "takes turns with" not in reason:  # the allocation's reason already says so
            reason += f"; takes turns with {sharers - 1} other job(s)"
    elif jf.slice.reason.startswith(ISOLATED_REASON) and slowdown is not None:
        # the figure the job's circuits give now (two-hop routes included), not the
        # allocation's direct-circuit estimate: one figure in the view
        reason = ISOLATED_REASON + slowdown_note(slowdown)
    else:
        reason = jf.slice.reason
    return NetworkView(mode, tuple(ports), slowdown, reason)


def free_uplinks(state: ControllerState) -> dict[str, int]:
    """Uplink ports per pod no isolated slice holds: what a new job spanning pods could
    get there (`placement.place_job(..., ports_free=...)`). The same figure the worker
    sums from the jobs' stored `network.pod_ports` (`placement.uplinks_free`)."""
    held: dict[str, float] = {}
    for ja in state.allocation.jobs:
        if ja.mode == MODE_ISOLATED:
            for pod, n in ja.pod_ports:
                held[pod] = held.get(pod, 0.0) + n
    return uplinks_free(state.cluster, held)


__all__ = [
    "HELD_PLAN",
    "OFF_TURN",
    "Accounting",
    "ControllerConfig",
    "ControllerState",
    "Event",
    "JobCompleted",
    "JobCycle",
    "JobPlaced",
    "NetworkView",
    "PhaseObserved",
    "PortsChanged",
    "SwitchConfirmed",
    "Tick",
    "free_uplinks",
    "network_view",
    "new_controller",
    "restore",
    "step",
]

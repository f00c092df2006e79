"""What each policy's fabric gives one placed job: phase times, sharing, rewiring costs.

Policies (SPEC section 7 baselines and Lightpath itself):

- `ideal`: non-blocking fabric, zero reconfiguration; the DP AllReduce takes the
  cheapest algorithm of the engine's cost models at NIC rate with free
  aggregators. The upper bound: every other policy's phase times are at least
  these, on the same placement.
- `ecmp`: electrical 3-tier Clos, ring AllReduce, paths by correlated ECMP
  hashing (`ecmp.py`); jobs share links.
- `static`: optical; the job's pp+dp topology planned at placement
  (`plan_fabric`), held for its whole run; ring AllReduce.
- `reactive`: optical; each phase's own topology (`plan_fabric`'s phase plans),
  rewired when the demand arrives (the whole reconfiguration latency exposed);
  ring AllReduce.
- `lightpath`: INC-aware placement (free aggregator capacity passed to
  `place_job`), the engine's collective choice (`choose_collective` via
  `plan_fabric`), the lightpath predictor pre-installing each phase's topology in
  the compute gap; it holds the pp+dp topology instead when per-phase rewiring
  would cost more than it gains (short gaps, slow OXCs).
- `lightpath-seed`: the same with the SPEC section 5 seed predictor.

Phase time model (one job): a phase finishes no earlier than on the ideal fabric
(its endpoints' NICs and the collective's latency terms) and no earlier than the
network can carry its inter-pod bytes: time = max(ideal-rate time, network time).
The network time of an optical phase is the engine's `evaluate_circuits`
completion (direct and two-hop routing on the circuits), of an ECMP phase the
busiest link's bytes over its capacity. PP sends: one micro-batch's send takes
max(ideal send, alpha + PP network time / m).

No I/O; only engine calls plus this bookkeeping.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from app.engine.circuits import CircuitPlan, PodCircuits, evaluate_circuits
from app.engine.cluster import Cluster
from app.engine.collective import ALPHA_RING_S, AggregatorLedger, estimate_costs
from app.engine.fabric import MODE_ISOLATED, MODE_NONE, FabricPlan, JobFabric, plan_topology
from app.engine.job import Collective, Job, Placement
from app.engine.plan_signature import PlanCatalog, classify_plan, pod_demand_from_directed
from app.engine.predictor import LIGHTPATH, SEED
from app.engine.traffic import ALGO_RING, PHASE_DP, PHASE_PP, DemandMatrix, job_traffic

from .ecmp import ClosShape, hash_flows, link_capacity_bps, links_time_s
from .prediction import RewiringOutcome, fits_every_gap, walk_rewiring
from .timing import JobTiming, job_timing, pipeline_span_s, pp_window_s

IDEAL = "ideal"
ECMP = "ecmp"
STATIC = "static"
REACTIVE = "reactive"
LIGHTPATH_POLICY = "lightpath"
LIGHTPATH_SEED = "lightpath-seed"
POLICIES = (IDEAL, ECMP, STATIC, REACTIVE, LIGHTPATH_POLICY, LIGHTPATH_SEED)


@dataclass(frozen=True, slots=True)
class PolicySpec:
    """How a policy places, chooses collectives, wires circuits and predicts."""

    name: str
    optical: bool
    inc_aware: bool  # placement sees free aggregators; the collective is the engine's choice
    per_phase: bool  # rewires per phase (else one topology per job)
    predictor: str | None
    chooses_hold: bool  # may hold one topology when per-phase rewiring does not pay


SPECS: dict[str, PolicySpec] = {
    IDEAL: PolicySpec(IDEAL, False, True, False, None, False),
    ECMP: PolicySpec(ECMP, False, False, False, None, False),
    STATIC: PolicySpec(STATIC, True, False, False, None, False),
    REACTIVE: PolicySpec(REACTIVE, True, False, True, None, False),
    LIGHTPATH_POLICY: PolicySpec(LIGHTPATH_POLICY, True, True, True, LIGHTPATH, True),
    LIGHTPATH_SEED: PolicySpec(LIGHTPATH_SEED, True, True, True, SEED, True),
}


def spec_of(name: str) -> PolicySpec:
    """The named policy; ValueError listing the known ones."""
    if name not in SPECS:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}")
    return SPECS[name]


def as_submitted(job: Job, spec: PolicySpec) -> Job:
    """Baselines run ring AllReduce unless the job forces an algorithm (INC falls back)."""
    if spec.inc_aware:
        return job
    if job.collective in (Collective.AUTO, Collective.INC):
        from dataclasses import replace

        return replace(job, collective=Collective.RING)
    return job


@dataclass(frozen=True, slots=True)
class Share:
    """One resource a job uses with others: per-iteration amounts of each phase.

    For an ECMP link the amounts are bytes and `capacity` bytes/s; for a pod's
    time-divided optical ports the amounts are seconds of exclusive use and the
    capacity 1. `affected` False: the job loads the resource but is not slowed by
    it (an isolated slice whose ports a time-division job borrows turns on).
    """

    pp_amount: float
    dp_amount: float
    capacity: float
    affected: bool = True


@dataclass(frozen=True, slots=True)
class JobProfile:
    """A placed job under one policy: everything its iteration time depends on."""

    timing: JobTiming
    ideal_iteration_s: float
    dp_base_s: float  # the chosen algorithm at NIC rate with its aggregator grants
    pp_alone_s: float  # PP network time per iteration with no other job sharing
    dp_alone_s: float
    rewiring: RewiringOutcome
    algorithm: str
    mode: str  # isolated | time_division | none | ecmp | ideal
    mlu: float
    holds_topology: bool
    shares: Mapping[tuple[str, ...], Share] = field(default_factory=dict)

    def iteration_s(self, pp_net_s: float, dp_net_s: float) -> float:
        """Iteration time (reconfiguration excluded) with these network times."""
        t = self.timing
        send = t.send_ideal_s
        if pp_net_s > 0 and t.stages > 1:
            send = max(send, ALPHA_RING_S + pp_net_s / t.microbatches)
        return pipeline_span_s(t, send) + max(self.dp_base_s, dp_net_s) + t.optimizer_s

    def comm_s(self, pp_net_s: float, dp_net_s: float) -> float:
        """Time the job's network phases hold the network per iteration."""
        t = self.timing
        send = t.send_ideal_s
        if pp_net_s > 0 and t.stages > 1:
            send = max(send, ALPHA_RING_S + pp_net_s / t.microbatches)
        pp = pp_window_s(t, send) if t.stages > 1 else 0.0
        return pp + max(self.dp_base_s, dp_net_s)

    @property
    def alone_iteration_s(self) -> float:
        return self.iteration_s(self.pp_alone_s, self.dp_alone_s)


def ideal_dp_s(cluster: Cluster, job: Job, placement: Placement) -> float:
    """The AllReduce on the ideal fabric: NIC-rate links, every aggregator free.

    A job that forces ring, tree or hierarchical ring runs it everywhere, so the
    ideal runs it too; otherwise (auto, or INC which a baseline replaces by
    ring) the cheapest of the engine's cost models, a bound for every choice.
    """
    if job.parallelism.dp <= 1:
        return 0.0
    costs, _ = estimate_costs(cluster, job, placement, AggregatorLedger(), None)
    if job.collective not in (Collective.AUTO, Collective.INC):
        return costs[job.collective]
    return min(costs.values())


def ideal_iteration_s(cluster: Cluster, job: Job, placement: Placement, timing: JobTiming) -> float:
    """The job's iteration on the ideal fabric at this placement."""
    return (
        pipeline_span_s(timing, timing.send_ideal_s)
        + ideal_dp_s(cluster, job, placement)
        + timing.optimizer_s
    )


def _restrict(demand: DemandMatrix) -> DemandMatrix:
    pods = sorted({p for p, _, _ in demand.entries()} | {q for _, q, _ in demand.entries()})
    return DemandMatrix.from_entries(pods, demand.entries())


def _plan_id(catalog: PlanCatalog, demand: DemandMatrix) -> tuple[PlanCatalog, str]:
    directed = {(p, q): b for p, q, b in demand.entries()}
    return classify_plan(catalog, pod_demand_from_directed(directed))


def _net_s(
    demand: DemandMatrix, circuits: PodCircuits, budget: Mapping[str, int], gbps: float
) -> tuple[float, float]:
    if demand.total_bytes <= 0:
        return 0.0, 0.0
    # over every pod the circuits touch, so two-hop paths may relay through the
    # job's pods that carry none of this phase's own traffic
    pods = {p for p, _, _ in demand.entries()} | {q for _, q, _ in demand.entries()}
    pods |= {p for a, b, _ in circuits.pairs() for p in (a, b) if p in budget}
    plan = evaluate_circuits(
        DemandMatrix.from_entries(sorted(pods), demand.entries()), circuits, budget, gbps
    )
    return plan.completion_s, plan.mlu


def _gaps(timing: JobTiming, phases: list[str]) -> list[float]:
    return [timing.gap_before_pp_s if p == PHASE_PP else timing.gap_before_dp_s for p in phases]


@dataclass(frozen=True, slots=True)
class FabricContext:
    """What the simulator knows when profiling a job: cluster, policy, reconfig latency."""

    cluster: Cluster
    spec: PolicySpec
    reconfig_ms: float
    seed: int
    clos: ClosShape | None = None


def profile_ideal(
    ctx: FabricContext, job: Job, placement: Placement, iterations: int
) -> JobProfile:
    timing = job_timing(job, ctx.cluster.server_gbps, ctx.cluster.gpus_per_server)
    ideal = ideal_iteration_s(ctx.cluster, job, placement, timing)
    dp = ideal_dp_s(ctx.cluster, job, placement)
    outcome = walk_rewiring([], [], 0.0, algorithm=None, iterations=iterations)
    return JobProfile(timing, ideal, dp, 0.0, 0.0, outcome, "best", IDEAL, 0.0, True)


def profile_ecmp(ctx: FabricContext, job: Job, placement: Placement, iterations: int) -> JobProfile:
    """Ring (or the forced algorithm) over the hashed Clos; links shared with other jobs."""
    cluster, clos = ctx.cluster, ctx.clos
    assert clos is not None
    timing = job_timing(job, cluster.server_gbps, cluster.gpus_per_server)
    ideal = ideal_iteration_s(cluster, job, placement, timing)
    algorithm = ALGO_RING if job.collective in (Collective.AUTO, Collective.INC) else job.collective
    costs, _ = estimate_costs(cluster, job, placement, AggregatorLedger(), None)
    dp_base = costs[algorithm] if job.parallelism.dp > 1 else 0.0
    traffic = {t.phase: t for t in job_traffic(cluster, job, placement, algorithm)}
    pp_load = hash_flows(cluster, clos, traffic[PHASE_PP].flows, ctx.seed)
    dp_load = hash_flows(cluster, clos, traffic[PHASE_DP].flows, ctx.seed)
    shares = {
        link: Share(
            pp_load.get(link, 0.0),
            dp_load.get(link, 0.0),
            link_capacity_bps(cluster, clos, link),
        )
        for link in set(pp_load) | set(dp_load)
    }
    pp_alone = links_time_s(cluster, clos, pp_load)
    dp_alone = links_time_s(cluster, clos, dp_load)
    mlu = 0.0
    for phase_load, phase in ((pp_load, PHASE_PP), (dp_load, PHASE_DP)):
        if phase_load:
            bound = traffic[phase].pod_demand.total_bytes  # only for a scale
            port_bound = _port_bound_s(cluster, traffic[phase].pod_demand)
            if bound > 0 and port_bound > 0:
                mlu = max(mlu, links_time_s(cluster, clos, phase_load) / port_bound)
    outcome = walk_rewiring([], [], 0.0, algorithm=None, iterations=iterations)
    return JobProfile(
        timing, ideal, dp_base, pp_alone, dp_alone, outcome, algorithm, ECMP, mlu, True, shares
    )


def _port_bound_s(cluster: Cluster, demand: DemandMatrix) -> float:
    from app.engine.circuits import port_bound_s

    return port_bound_s(demand, {p.id: p.uplink_ports for p in cluster.pods}, cluster.nic_gbps)


def fabric_key(
    cluster: Cluster, fabric: FabricPlan, job: Job, placement: Placement
) -> tuple[object, ...]:
    """What a job's optical profile depends on; an unchanged key keeps the profile."""
    jf = fabric.job(job.job_id)
    if jf is None:
        return ()
    pods = sorted({cluster.server(s).pod_id for s in placement.servers})
    if jf.slice.mode == MODE_ISOLATED:
        return (jf.slice.mode, jf.slice.pod_ports, jf.circuits, jf.collective.algorithm)
    pool = _pool(cluster, fabric)
    return (jf.slice.mode, tuple(pool[p] for p in pods), jf.collective.algorithm)


def _pool(cluster: Cluster, fabric: FabricPlan) -> dict[str, int]:
    """Uplink ports no isolated slice holds: what time-division jobs share."""
    free = {p.id: p.uplink_ports for p in cluster.pods}
    for jf in fabric.jobs:
        if jf.slice.mode == MODE_ISOLATED:
            for p, n in jf.slice.pod_ports:
                free[p] -= n
    return free


def profile_optical(
    ctx: FabricContext,
    job: Job,
    placement: Placement,
    fabric: FabricPlan,
    iterations: int,
) -> JobProfile:
    """Static, reactive or lightpath on the engine's fabric plan for this job."""
    cluster, spec = ctx.cluster, ctx.spec
    jf = fabric.job(job.job_id)
    assert jf is not None, "the job must be in the fabric plan"
    timing = job_timing(job, cluster.server_gbps, cluster.gpus_per_server)
    ideal = ideal_iteration_s(cluster, job, placement, timing)
    choice = jf.collective
    algorithm = choice.algorithm
    costs = dict(choice.costs)
    dp_base = costs.get(algorithm, 0.0) if job.parallelism.dp > 1 else 0.0
    traffic = {
        t.phase: t.pod_demand
        for t in job_traffic(cluster, job, placement, algorithm, dict(choice.root_tors))
    }
    pp_d, dp_d = traffic[PHASE_PP], traffic[PHASE_DP]
    phases = [
        p for p, d in ((PHASE_PP, job.parallelism.pp), (PHASE_DP, job.parallelism.dp)) if d > 1
    ]
    catalog = PlanCatalog()
    plan_ids = []
    for phase in phases:
        catalog, pid = _plan_id(catalog, traffic[phase])
        plan_ids.append(pid)
    gaps = _gaps(timing, phases)
    shares: dict[tuple[str, ...], Share] = {}
    if jf.slice.mode == MODE_NONE:
        outcome = walk_rewiring(
            plan_ids,
            gaps,
            ctx.reconfig_ms,
            algorithm=spec.predictor,
            per_phase=False,
            iterations=iterations,
        )
        return JobProfile(
            timing, ideal, dp_base, 0.0, 0.0, outcome, algorithm, MODE_NONE, 0.0, True
        )
    combined_c, phase_c, budget, borrowed = _topologies(cluster, jf, fabric, pp_d, dp_d)
    gbps = cluster.nic_gbps
    pp_hold, mlu_pp_h = _net_s(pp_d, combined_c, budget, gbps)
    dp_hold, mlu_dp_h = _net_s(dp_d, combined_c, budget, gbps)
    pp_per, mlu_pp_p = _net_s(pp_d, phase_c[PHASE_PP], budget, gbps)
    dp_per, mlu_dp_p = _net_s(dp_d, phase_c[PHASE_DP], budget, gbps)
    hold = _candidate(ctx, timing, dp_base, pp_hold, dp_hold, plan_ids, gaps, False, iterations)
    per = _candidate(ctx, timing, dp_base, pp_per, dp_per, plan_ids, gaps, True, iterations)
    if spec.chooses_hold:
        # per-phase circuits only when every phase's rewiring fits its compute gap
        fits = fits_every_gap(plan_ids, gaps, ctx.reconfig_ms)
        use_hold = not fits or hold[0] <= per[0]
    else:
        use_hold = not spec.per_phase
    _, pp_net, dp_net, outcome = hold if use_hold else per
    mlu = max(mlu_pp_h, mlu_dp_h) if use_hold else max(mlu_pp_p, mlu_dp_p)
    for pod in _pods_of(pp_d, dp_d):
        if jf.slice.mode == MODE_ISOLATED:
            # loads its pods for time-division jobs that borrow turns there, unaffected
            shares[("oxc-pod", pod)] = Share(pp_net, dp_net, 1.0, affected=False)
        else:
            shares[("oxc-pod" if borrowed else "oxc-pool", pod)] = Share(pp_net, dp_net, 1.0)
    return JobProfile(
        timing,
        ideal,
        dp_base,
        pp_net,
        dp_net,
        outcome,
        algorithm,
        jf.slice.mode,
        mlu,
        use_hold,
        shares,
    )


def _candidate(
    ctx: FabricContext,
    timing: JobTiming,
    dp_base: float,
    pp_net: float,
    dp_net: float,
    plan_ids: list[str],
    gaps: list[float],
    per_phase: bool,
    iterations: int,
) -> tuple[float, float, float, RewiringOutcome]:
    """(steady iteration time, pp net, dp net, rewiring) of holding or per-phase circuits."""
    outcome = walk_rewiring(
        plan_ids,
        gaps,
        ctx.reconfig_ms,
        algorithm=ctx.spec.predictor,
        per_phase=per_phase,
        iterations=iterations,
    )
    t = timing
    send = t.send_ideal_s
    if pp_net > 0 and t.stages > 1:
        send = max(send, ALPHA_RING_S + pp_net / t.microbatches)
    steady = (
        pipeline_span_s(t, send) + max(dp_base, dp_net) + t.optimizer_s + outcome.steady.exposed_s
    )
    return steady, pp_net, dp_net, outcome


def _pods_of(*demands: DemandMatrix) -> list[str]:
    pods: set[str] = set()
    for d in demands:
        for p, q, _ in d.entries():
            pods.update((p, q))
    return sorted(pods)


def _topologies(
    cluster: Cluster, jf: JobFabric, fabric: FabricPlan, pp_d: DemandMatrix, dp_d: DemandMatrix
) -> tuple[PodCircuits, dict[str, PodCircuits], dict[str, int], bool]:
    """(held pp+dp circuits, per-phase circuits, port budget, borrowed full pods?)."""
    if jf.slice.mode == MODE_ISOLATED:
        budget = dict(jf.slice.pod_ports)
        held = jf.circuits if jf.circuits.total else jf.plan.circuits
        phase: dict[str, PodCircuits] = {name: plan.circuits for name, plan in jf.phase_plans}
        for name in (PHASE_PP, PHASE_DP):
            phase.setdefault(name, held)
        return held, phase, budget, False
    # time division: plan on the ports no slice holds; when those cannot carry the
    # job (a pod with no free port), it takes turns on its pods' whole uplinks
    pods = _pods_of(pp_d, dp_d)
    pool = _pool(cluster, fabric)
    budget = {p: pool[p] for p in pods}
    borrowed = False
    combined = pp_d.plus(dp_d)
    held_plan = plan_topology(cluster, _restrict(combined), budget)
    if not math.isfinite(held_plan.completion_s):
        budget = {p: cluster.pods_by_id[p].uplink_ports for p in pods}
        borrowed = True
        held_plan = plan_topology(cluster, _restrict(combined), budget)
    phase = {}
    for name, demand in ((PHASE_PP, pp_d), (PHASE_DP, dp_d)):
        plan: CircuitPlan = (
            plan_topology(cluster, _restrict(demand), budget)
            if demand.total_bytes > 0
            else held_plan
        )
        phase[name] = plan.circuits
    return held_plan.circuits, phase, budget, borrowed

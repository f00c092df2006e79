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

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from app.engine.circuits import PodCircuits, evaluate_circuits
from app.engine.cluster import Cluster
from app.engine.collective import ALPHA_RING_S, AggregatorLedger, estimate_costs
from app.engine.controller import ControllerState
from app.engine.fabric import (
    MODE_ELECTRICAL,
    MODE_ISOLATED,
    MODE_NONE,
    MODE_TIME_DIVISION,
    phase_plan,
)
from app.engine.job import Collective, Job, Placement
from app.engine.plan_signature import (
    PlanCatalog,
    classify_plan,
    pod_demand_from_directed,
)
from app.engine.predictor import LIGHTPATH, SEED
from app.engine.rewiring_rules import HELD_TOPOLOGY
from app.engine.traffic import ALGO_RING, PHASE_DP, PHASE_PP, DemandMatrix, job_traffic

from .ecmp import (
    SAME_COST_CAPACITY,
    ClosShape,
    hash_flows,
    link_capacity_bps,
    links_time_s,
    spray_flows,
)
from .rewiring import (
    NO_REWIRING,
    PhaseSlot,
    RewiringOutcome,
    reactive_outcome,
    static_outcome,
    walk_controller,
)
from .timing import JobTiming, job_timing, pipeline_span_s, pp_window_s

IDEAL = "ideal"
ECMP = "ecmp"
ECMP_POLARISED = "ecmp-polarised"
SPRAY = "spray"
SPRAY_SAME_COST = "spray-same-cost"
STATIC = "static"
REACTIVE = "reactive"
LIGHTPATH_POLICY = "lightpath"
LIGHTPATH_SEED = "lightpath-seed"
POLICIES = (
    IDEAL,
    SPRAY,
    SPRAY_SAME_COST,
    ECMP,
    ECMP_POLARISED,
    STATIC,
    REACTIVE,
    LIGHTPATH_POLICY,
    LIGHTPATH_SEED,
)
ELECTRICAL = (ECMP, ECMP_POLARISED, SPRAY, SPRAY_SAME_COST)


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
    ECMP_POLARISED: PolicySpec(ECMP_POLARISED, False, False, False, None, False),
    SPRAY: PolicySpec(SPRAY, False, False, False, None, False),
    SPRAY_SAME_COST: PolicySpec(SPRAY_SAME_COST, False, False, False, None, False),
    STATIC: PolicySpec(STATIC, True, False, False, None, False),
    REACTIVE: PolicySpec(REACTIVE, True, False, True, None, False),
    LIGHTPATH_POLICY: PolicySpec(LIGHTPATH_POLICY, True, True, True, LIGHTPATH, True),
    LIGHTPATH_SEED: PolicySpec(LIGHTPATH_SEED, True, True, True, SEED, True),
}


def core_capacity(policy: str) -> float:
    """An electrical policy's core uplinks over the optical layer's (1: the same)."""
    return SAME_COST_CAPACITY if policy == SPRAY_SAME_COST else 1.0


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
    """One electrical resource a job uses with others (a Clos link, a pod's way into an
    electrical core): per-iteration bytes of each phase and `capacity` in bytes/s."""

    pp_amount: float
    dp_amount: float
    capacity: float


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
        return (
            pipeline_span_s(t, send) + t.dp_exposed_s(max(self.dp_base_s, dp_net_s)) + t.optimizer_s
        )

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
        + timing.dp_exposed_s(ideal_dp_s(cluster, job, placement))
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
    return _net_cached(
        tuple(demand.entries()), circuits, tuple(sorted(budget.items())), float(gbps)
    )


@functools.lru_cache(maxsize=4096)
def _net_cached(
    entries: tuple[tuple[str, str, float], ...],
    circuits: PodCircuits,
    budget: tuple[tuple[str, int], ...],
    gbps: float,
) -> tuple[float, float]:
    """(completion, MLU) of one phase on circuits; memoised (the LP is the costly part)."""
    ports = dict(budget)
    # over every pod the circuits touch, so two-hop paths may relay through the
    # job's pods that carry none of this phase's own traffic
    pods = {p for p, _, _ in entries} | {q for _, q, _ in entries}
    pods |= {p for a, b, _ in circuits.pairs() for p in (a, b) if p in ports}
    plan = evaluate_circuits(
        DemandMatrix.from_entries(sorted(pods), list(entries)), circuits, ports, gbps
    )
    return plan.completion_s, plan.mlu


@dataclass(frozen=True, slots=True)
class FabricContext:
    """What the simulator knows when profiling a job: cluster, policy, reconfig latency."""

    cluster: Cluster
    spec: PolicySpec
    reconfig_ms: float
    seed: int
    clos: ClosShape | None = None
    gpu: str | None = None


def profile_ideal(
    ctx: FabricContext, job: Job, placement: Placement, iterations: int
) -> JobProfile:
    timing = job_timing(job, ctx.cluster.server_gbps, ctx.cluster.gpus_per_server, ctx.gpu)
    ideal = ideal_iteration_s(ctx.cluster, job, placement, timing)
    dp = ideal_dp_s(ctx.cluster, job, placement)
    outcome = NO_REWIRING
    return JobProfile(timing, ideal, dp, 0.0, 0.0, outcome, "best", IDEAL, 0.0, True)


def profile_ecmp(ctx: FabricContext, job: Job, placement: Placement, iterations: int) -> JobProfile:
    """Ring (or the forced algorithm) over the hashed Clos; links shared with other jobs."""
    cluster, clos = ctx.cluster, ctx.clos
    assert clos is not None
    timing = job_timing(job, cluster.server_gbps, cluster.gpus_per_server, ctx.gpu)
    ideal = ideal_iteration_s(cluster, job, placement, timing)
    algorithm = ALGO_RING if job.collective in (Collective.AUTO, Collective.INC) else job.collective
    costs, _ = estimate_costs(cluster, job, placement, AggregatorLedger(), None)
    dp_base = costs[algorithm] if job.parallelism.dp > 1 else 0.0
    traffic = {t.phase: t for t in job_traffic(cluster, job, placement, algorithm)}
    if ctx.spec.name in (SPRAY, SPRAY_SAME_COST):
        pp_load = spray_flows(cluster, clos, traffic[PHASE_PP].flows)
        dp_load = spray_flows(cluster, clos, traffic[PHASE_DP].flows)
    else:
        correlated = ctx.spec.name == ECMP_POLARISED
        pp_load = hash_flows(
            cluster, clos, traffic[PHASE_PP].flows, ctx.seed, correlated=correlated
        )
        dp_load = hash_flows(
            cluster, clos, traffic[PHASE_DP].flows, ctx.seed, correlated=correlated
        )
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
    outcome = NO_REWIRING
    return JobProfile(
        timing,
        ideal,
        dp_base,
        pp_alone,
        dp_alone,
        outcome,
        algorithm,
        ctx.spec.name,
        mlu,
        True,
        shares,
    )


def _port_bound_s(cluster: Cluster, demand: DemandMatrix) -> float:
    from app.engine.circuits import port_bound_s

    return port_bound_s(demand, {p.id: p.uplink_ports for p in cluster.pods}, cluster.nic_gbps)


def fabric_key(state: ControllerState, job_id: str) -> tuple[object, ...]:
    """What a job's optical profile depends on; an unchanged key keeps the profile."""
    jf = state.job_fabric(job_id)
    if jf is None:
        return ()
    if jf.slice.mode == MODE_TIME_DIVISION:
        return (jf.slice.mode, jf.plan.circuits, len(state.turn_order), jf.collective.algorithm)
    return (jf.slice.mode, jf.slice.pod_ports, jf.circuits, jf.collective.algorithm)


def turn_factor(state: ControllerState) -> float:
    """How much longer a job taking turns on shared ports needs the network than alone.

    The controller gives the shared ports to one job at a time for `turn_s` and
    each turn starts with a reconfiguration: a job gets (turn - reconfig) of every
    n turns (n jobs taking turns).
    """
    n = max(1, len(state.turn_order))
    turn_s = state.config.turn_s
    usable = 1.0 - state.config.reconfig_ms / 1000.0 / turn_s if turn_s > 0 else 0.0
    return n / usable if usable > 0 else math.inf


def phase_slots(
    timing: JobTiming, job: Job, traffic: Mapping[str, DemandMatrix], pp_s: float, dp_s: float
) -> list[PhaseSlot]:
    """The job's network phases in one iteration: plan id, demand, start offset, duration."""
    catalog = PlanCatalog()
    slots = []
    send = timing.send_ideal_s
    if pp_s > 0 and timing.stages > 1:
        send = max(send, ALPHA_RING_S + pp_s / timing.microbatches)
    span = pipeline_span_s(timing, send)
    if job.parallelism.pp > 1:
        demand = traffic[PHASE_PP]
        catalog, pid = classify_plan(catalog, demand)
        slots.append(PhaseSlot(pid, demand, timing.forward_s, pp_window_s(timing, send)))
    if job.parallelism.dp > 1:
        demand = traffic[PHASE_DP]
        catalog, pid = classify_plan(catalog, demand)
        # gradient buckets go out from the start of stage 0's last backward pass
        slots.append(PhaseSlot(pid, demand, span - timing.backward_s, dp_s))
    return slots


def profile_optical(
    ctx: FabricContext,
    job: Job,
    placement: Placement,
    state: ControllerState,
    iterations: int,
    start_s: float,
) -> JobProfile:
    """Static, reactive or lightpath on the fabric controller's allocation for this job.

    Isolated slices: the held pp+dp circuits the controller realised, and per-phase
    circuits where the policy's rule (the controller for lightpath, the reactive
    rule) rewires. Time division: the job's circuits on the shared ports, for a
    share of the turns (`turn_factor`). A job whose circuits cannot carry a phase
    (no OXC with free ports on both pods) gets infinite network time: stalled.
    """
    cluster, spec = ctx.cluster, ctx.spec
    jf = state.job_fabric(job.job_id)
    assert jf is not None, "the job must be in the fabric plan"
    timing = job_timing(job, cluster.server_gbps, cluster.gpus_per_server, ctx.gpu)
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
    if jf.slice.mode == MODE_NONE:
        return JobProfile(
            timing, ideal, dp_base, 0.0, 0.0, NO_REWIRING, algorithm, MODE_NONE, 0.0, True
        )
    if jf.slice.mode == MODE_ELECTRICAL:
        shares = electrical_shares(cluster, pp_d, dp_d)
        pp_net = max((_time_s(x.pp_amount, x.capacity) for x in shares.values()), default=0.0)
        dp_net = max((_time_s(x.dp_amount, x.capacity) for x in shares.values()), default=0.0)
        return JobProfile(
            timing,
            ideal,
            dp_base,
            pp_net,
            dp_net,
            NO_REWIRING,
            algorithm,
            MODE_ELECTRICAL,
            0.0,
            True,
            shares,
        )
    gbps = cluster.nic_gbps
    reconfig_s = ctx.reconfig_ms / 1000.0
    if jf.slice.mode != MODE_ISOLATED:
        circuits = jf.plan.circuits
        budget = {p: circuits.row_sum(p) for p in circuits.pod_ids}
        factor = turn_factor(state)
        pp_net, mlu_pp = _net_s(pp_d, circuits, budget, gbps)
        dp_net, mlu_dp = _net_s(dp_d, circuits, budget, gbps)
        pp_net, dp_net = pp_net * factor, dp_net * factor
        slots = phase_slots(timing, job, traffic, pp_net, max(dp_base, dp_net))
        return JobProfile(
            timing,
            ideal,
            dp_base,
            pp_net,
            dp_net,
            static_outcome(slots, reconfig_s),
            algorithm,
            jf.slice.mode,
            max(mlu_pp, mlu_dp),
            True,
        )
    budget = dict(jf.slice.pod_ports)
    held = jf.circuits
    pp_hold, mlu_pp = _net_s(pp_d, held, budget, gbps)
    dp_hold, mlu_dp = _net_s(dp_d, held, budget, gbps)
    slots = phase_slots(timing, job, traffic, pp_hold, max(dp_base, dp_hold))
    by_phase = {}
    names = [
        n for n, d in ((PHASE_PP, job.parallelism.pp), (PHASE_DP, job.parallelism.dp)) if d > 1
    ]
    for name, slot in zip(names, slots, strict=True):
        by_phase[name] = slot
    demand_of = {PHASE_PP: pp_d, PHASE_DP: dp_d}
    hold_of = {PHASE_PP: pp_hold, PHASE_DP: dp_hold}
    own: dict[str, PodCircuits] = {}

    def own_circuits(name: str) -> PodCircuits:
        """The phase's own circuits in the slice (planned only when a policy uses them)."""
        if name not in own:
            ja = state.allocation.job(job.job_id)
            ports = ja.oxc_ports if ja is not None else None
            own[name] = phase_plan(cluster, jf, demand_of[name], ports).circuits
        return own[name]

    def own_s(name: str) -> float:
        return _net_s(demand_of[name], own_circuits(name), budget, gbps)[0]

    if spec.name == STATIC:
        outcome = static_outcome(slots, reconfig_s)
    elif spec.name == REACTIVE:
        times = {
            slot.plan_id: {HELD_TOPOLOGY: hold_of[name], slot.plan_id: own_s(name)}
            for name, slot in by_phase.items()
        }
        outcome = reactive_outcome(slots, times, reconfig_s)
    else:
        iteration = _iteration(timing, dp_base, pp_hold, dp_hold)
        outcome = walk_controller(
            state, job.job_id, slots, iteration, start_s, iterations=iterations
        )
    ran = dict(zip((s.plan_id for s in slots), outcome.topologies, strict=False))
    phase_of_plan = {slot.plan_id: name for name, slot in by_phase.items()}

    def ran_on(name: str) -> float:
        """The phase's time on the topology it ran on in steady state."""
        topo = ran.get(by_phase[name].plan_id, HELD_TOPOLOGY)
        if topo == HELD_TOPOLOGY:
            return hold_of[name]
        if topo == by_phase[name].plan_id:
            return own_s(name)
        other = phase_of_plan.get(topo)  # another phase's circuits were left installed
        t = (
            _net_s(demand_of[name], own_circuits(other), budget, gbps)[0]
            if other is not None
            else math.inf
        )
        # circuits that cannot carry it: the phase waits for a rewiring to its topology
        return t if math.isfinite(t) else reconfig_s + hold_of[name]

    pp_net = ran_on(PHASE_PP) if PHASE_PP in by_phase else pp_hold
    dp_net = ran_on(PHASE_DP) if PHASE_DP in by_phase else dp_hold
    holds = all(t == HELD_TOPOLOGY for t in outcome.topologies)
    return JobProfile(
        timing,
        ideal,
        dp_base,
        pp_net,
        dp_net,
        outcome,
        algorithm,
        jf.slice.mode,
        max(mlu_pp, mlu_dp),
        holds,
    )


def electrical_shares(
    cluster: Cluster, pp: DemandMatrix, dp: DemandMatrix
) -> dict[tuple[str, ...], Share]:
    """A job on the electrical core: each pod's electrical uplink is a resource it shares
    with the other electrical jobs there, loaded with the pod's busier direction."""
    by_phase = [_pod_bytes(pp), _pod_bytes(dp)]
    caps = {p.id: p.electrical_gbps * 1e9 / 8 for p in cluster.pods}
    return {
        ("electrical", pod): Share(by_phase[0].get(pod, 0.0), by_phase[1].get(pod, 0.0), caps[pod])
        for pod in sorted(set(by_phase[0]) | set(by_phase[1]))
    }


def _pod_bytes(demand: DemandMatrix) -> dict[str, float]:
    """Bytes a pod sends or receives across pods, whichever is more."""
    out: dict[str, float] = {}
    into: dict[str, float] = {}
    for p, q, b in demand.entries():
        if p != q:
            out[p] = out.get(p, 0.0) + b
            into[q] = into.get(q, 0.0) + b
    return {pod: max(out.get(pod, 0.0), into.get(pod, 0.0)) for pod in set(out) | set(into)}


def _time_s(amount: float, capacity: float) -> float:
    if amount <= 0:
        return 0.0
    return amount / capacity if capacity > 0 else math.inf


def _iteration(timing: JobTiming, dp_base: float, pp_net: float, dp_net: float) -> float:
    send = timing.send_ideal_s
    if pp_net > 0 and timing.stages > 1:
        send = max(send, ALPHA_RING_S + pp_net / timing.microbatches)
    return (
        pipeline_span_s(timing, send)
        + timing.dp_exposed_s(max(dp_base, dp_net))
        + timing.optimizer_s
    )

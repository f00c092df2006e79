"""The multi-job fabric plan: collectives, port slices, cross-connects and routing per job.

Pure functions; must not import anything that does I/O (no FastAPI, SQLAlchemy,
Redis, pydantic) or read a clock. The worker and the simulator call
`plan_fabric` on every arrival and completion and `diff_plans` for the decisions
to log; the cycle predictor calls `plan_topology` per observed phase.

Slices (the vClos idea): each job with inter-pod traffic gets an isolated quota
of uplink ports on the pods it spans, sized to its servers' cross-pod NIC
bandwidth (servers * server_gbps / port_gbps), capped by the free ports. A job
whose pods cannot spare one port per peer pod is put in time division: such
jobs share the ports no slice holds and take turns (the first in turn order
holds the circuits now; `tdm_active` rotates it). A job keeps its slice, its
collective and its cross-connects while its placement is unchanged, so an
arrival or completion never disturbs the other jobs.

The installed topology of a job is planned for its pp+dp demand together (the
steady wiring between phase changes); `phase_plan` plans one phase's own
circuits inside the same slice, when a policy asks for them.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import compress
from operator import attrgetter
from typing import NamedTuple

from .allocation import (
    MODE_ELECTRICAL as ALLOC_ELECTRICAL,
)
from .allocation import (
    MODE_ISOLATED as ALLOC_ISOLATED,
)
from .allocation import (
    MODE_NONE as ALLOC_NONE,
)
from .allocation import (
    JobAllocation,
    PortAllocation,
    circuits_on_switches,
    map_allocation,
    pair_circuits,
    pool_room,
    switch_room,
    turn_ports,
)
from .circuits import CircuitPlan, PodCircuits, evaluate_circuits, plan_circuits
from .cluster import Cluster
from .collective import AggregatorLedger, CollectiveChoice, choose_collective, reestimate
from .cross_connects import (
    CrossConnect,
    OxcChange,
    changed_cross_connects,
    cross_connects_by_job,
    diff_cross_connects,
    map_cross_connects,
    physical_order,
    port_pods,
    realised_circuits,
)
from .job import Job, Placement
from .memo import IdentityMemo
from .traffic import (
    PHASE_DP,
    PHASE_PP,
    DemandMatrix,
    Flow,
    PhaseTraffic,
    job_traffic,
    pod_demand_from_flows,
)

MODE_ISOLATED = "isolated"
MODE_TIME_DIVISION = "time_division"
MODE_NONE = "none"  # no inter-pod traffic: no ports needed
MODE_ELECTRICAL = "electrical"  # no circuits: cross-pod traffic over the electrical core
LAYER_OPTICAL = "optical"
LAYER_ELECTRICAL = "electrical"


@dataclass(frozen=True, slots=True)
class PlacedJob:
    """A job and where it runs: the input unit of `plan_fabric`."""

    job: Job
    placement: Placement


@dataclass(frozen=True, slots=True)
class Route:
    """The source route of one flow: pod ids from the source's pod to the destination's."""

    src: str
    dst: str
    path: tuple[str, ...]

    def to_dict(self) -> dict[str, object]:
        return {"src": self.src, "dst": self.dst, "path": list(self.path)}


@dataclass(frozen=True, slots=True)
class RoutingDecision:
    """The routing header of one job and phase: algorithm, INC, aggregators, routes, and
    the layer its cross-pod flows take (circuits, or the electrical core)."""

    job_id: str
    phase: str
    algorithm: str
    inc: bool
    aggregators: tuple[str, ...]
    routes: tuple[Route, ...]
    layer: str = LAYER_OPTICAL

    def to_dict(self) -> dict[str, object]:
        """The `routing` object of a GET /v1/decisions entry."""
        return {
            "phase": self.phase,
            "algorithm": str(self.algorithm),
            "inc": self.inc,
            "aggregators": list(self.aggregators),
            "routes": [r.to_dict() for r in self.routes],
            "layer": self.layer,
        }


@dataclass(frozen=True, slots=True)
class JobSlice:
    """The OXC ports a job may use: isolated quota per pod, time division, none, or
    none because its cross-pod traffic goes over the electrical core."""

    job_id: str
    mode: str
    pod_ports: tuple[tuple[str, int], ...]
    reason: str


@dataclass(frozen=True, slots=True)
class JobFabric:
    """Everything the fabric decided for one job."""

    job_id: str
    placement: Placement
    collective: CollectiveChoice
    slice: JobSlice
    plan: CircuitPlan  # the installed (pp+dp) topology, evaluated on realised circuits
    circuits: PodCircuits  # realised by this job's cross-connects (empty while off-turn)
    routing: tuple[RoutingDecision, ...]


@dataclass(frozen=True, slots=True)
class FabricPlan:
    """The whole fabric: per-job decisions, desired cross-connects, circuits and MLU."""

    jobs: tuple[JobFabric, ...]
    cross_connects: tuple[CrossConnect, ...]
    mlu: float
    aggregators: AggregatorLedger
    time_division: tuple[str, ...]  # turn order; the first holds the shared ports now
    unmapped: tuple[tuple[str, str, str, int], ...]
    # job id -> entry (the first of that id), built on the first `job` call: plans are
    # built (and replaced) more often than they are looked into
    _by_id: dict[str, JobFabric] | None = field(default=None, init=False, repr=False, compare=False)

    def job(self, job_id: str) -> JobFabric | None:
        """The job's entry, or None."""
        by_id = self._by_id
        if by_id is None:
            by_id = {j.job_id: j for j in reversed(self.jobs)}
            object.__setattr__(self, "_by_id", by_id)
        return by_id.get(job_id)


@dataclass(frozen=True, slots=True)
class Decision:
    """One decision-log entry (without seq/at, which the store assigns)."""

    kind: str  # "oxc" | "routing"
    job_id: str | None
    reason: str
    oxc: OxcChange | None = None
    routing: RoutingDecision | None = None

    def to_dict(self) -> dict[str, object]:
        """The GET /v1/decisions entry shape, minus seq and at."""
        return {
            "kind": self.kind,
            "job_id": self.job_id,
            "reason": self.reason,
            "oxc": self.oxc.to_dict() if self.oxc else None,
            "routing": self.routing.to_dict() if self.routing else None,
        }


def plan_topology(
    cluster: Cluster,
    pod_demand: DemandMatrix,
    ports: Mapping[str, int] | None = None,
    switch_ports: Iterable[tuple[str, str, int]] | None = None,
) -> CircuitPlan:
    """The circuit plan for one phase's pod demand within `ports` (default: all uplinks).

    With `switch_ports` ((oxc, pod, ports): where those ports are), the circuits they
    make switch by switch (`circuits_on_switches`): planned on ports counted per pod,
    a pair may get more circuits than the ports of its pods on any one OXC join."""
    budget = dict(ports) if ports is not None else {p.id: p.uplink_ports for p in cluster.pods}
    plan = plan_circuits(pod_demand, budget, cluster.nic_gbps)
    if switch_ports is None:
        return plan
    return _on_switches(cluster, plan, pod_demand, budget, switch_room(switch_ports))


def _on_switches(
    cluster: Cluster,
    plan: CircuitPlan,
    pod_demand: DemandMatrix,
    budget: Mapping[str, int],
    room: Mapping[str, Mapping[str, int]],
) -> CircuitPlan:
    """`plan` (made on ports counted per pod) cut to the circuits `room`'s ports make
    switch by switch (`circuits_on_switches`), evaluated again when cut."""
    fits = circuits_on_switches(room, plan.circuits)
    if fits is plan.circuits:
        return plan
    return evaluate_circuits(pod_demand, fits, budget, cluster.nic_gbps)


def phase_plan(
    cluster: Cluster,
    jf: JobFabric,
    pod_demand: DemandMatrix,
    switch_ports: Iterable[tuple[str, str, int]] | None = None,
) -> CircuitPlan:
    """One phase's own circuits inside the job's isolated slice: what rewiring for that
    phase alone would install (planned on the pods the phase touches; with
    `switch_ports`, its allocation's ports per OXC and pod, what those make)."""
    return plan_topology(cluster, _restrict(pod_demand), dict(jf.slice.pod_ports), switch_ports)


def _cross_pod_ports(
    cluster: Cluster, demand: DemandMatrix, placement: Placement
) -> dict[str, int]:
    """Ports per pod that make the job's cross-pod traffic non-blocking (servers * NICs)."""
    active = {p for p, q, _ in demand.entries()} | {q for _, q, _ in demand.entries()}
    servers: dict[str, int] = defaultdict(int)
    for s in placement.servers:
        pod = cluster.server(s).pod_id
        if pod in active:
            servers[pod] += 1
    per_server = max(1, round(cluster.server_gbps / cluster.nic_gbps))
    return {p: n * per_server for p, n in servers.items()}


def _peers(demand: DemandMatrix) -> dict[str, int]:
    """Distinct peer pods per pod (a slice needs a port for each)."""
    peers: dict[str, set[str]] = defaultdict(set)
    for p, q, _ in demand.entries():
        peers[p].add(q)
        peers[q].add(p)
    return {p: len(v) for p, v in peers.items()}


def _slice(
    cluster: Cluster, job_id: str, demand: DemandMatrix, placement: Placement, free: dict[str, int]
) -> JobSlice:
    """An isolated quota from `free` (which it decrements) or time division, and why."""
    need = _peers(demand)
    if not need:
        return JobSlice(job_id, MODE_NONE, (), "no inter-pod traffic")
    short = sorted(p for p, n in need.items() if free.get(p, 0) < n)
    if short:
        why = "too few free uplink ports for an isolated slice on " + ", ".join(short)
        return JobSlice(job_id, MODE_TIME_DIVISION, (), why)
    want = _cross_pod_ports(cluster, demand, placement)
    quota = {p: max(need[p], min(free[p], want.get(p, 0))) for p in need}
    for p, n in quota.items():
        free[p] -= n
    return JobSlice(job_id, MODE_ISOLATED, tuple(sorted(quota.items())), "vClos slice")


def _routes(cluster: Cluster, flows: Sequence[Flow], plan: CircuitPlan) -> tuple[Route, ...]:
    """One path per flow: same-pod flows stay in the pod; others follow the plan's shares."""
    paths: dict[tuple[str, str], list[tuple[str, ...]]] = defaultdict(list)
    left: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in sorted(plan.routes, key=lambda r: -r.size_bytes):
        paths[(r.src, r.dst)].append(r.path)
        left[(r.src, r.dst)].append(r.size_bytes)
    out = []
    for f, src, dst in _flow_pods(cluster, flows):
        path: tuple[str, ...] = (src,)
        bytes_left = left.get((src, dst))
        if src != dst and not bytes_left:
            continue  # no circuit path between the pods now
        if bytes_left:
            # the path with most bytes still unassigned takes the flow
            k = (
                0
                if len(bytes_left) == 1
                else max(range(len(bytes_left)), key=bytes_left.__getitem__)
            )
            path = paths[(src, dst)][k]
            bytes_left[k] -= f.size_bytes
        out.append(Route(f.src, f.dst, path))
    return tuple(out)


def _flow_pods(cluster: Cluster, flows: Sequence[Flow]) -> tuple[tuple[Flow, str, str], ...]:
    """Each flow with its source and destination pods (flows outside the fabric left out)."""
    return _FLOW_PODS.get((cluster, flows), lambda: _find_flow_pods(cluster, flows))


def _find_flow_pods(cluster: Cluster, flows: Sequence[Flow]) -> tuple[tuple[Flow, str, str], ...]:
    out = []
    for f in flows:
        src, dst = _pod(cluster, f.src), _pod(cluster, f.dst)
        if src is not None and dst is not None:
            out.append((f, src, dst))
    return tuple(out)


# a re-planned job routes the same phases' flows again (its traffic is remembered)
_FLOW_PODS: IdentityMemo[tuple[tuple[Flow, str, str], ...]] = IdentityMemo(4096)


def _pod(cluster: Cluster, endpoint: str) -> str | None:
    if cluster.has_server(endpoint):
        return cluster.server(endpoint).pod_id
    tor = cluster.tors_by_id.get(endpoint)
    return tor.pod_id if tor else None


@dataclass(slots=True)
class _Draft:
    """Working state of one job inside `plan_fabric` (not frozen: one is built per
    job per pass, and a frozen dataclass's __init__ costs ~3x as much)."""

    job: Job
    placement: Placement
    collective: CollectiveChoice
    slice: JobSlice
    traffic: tuple[PhaseTraffic, ...]
    combined: DemandMatrix
    plan: CircuitPlan
    reused: JobFabric | None


def plan_fabric(
    cluster: Cluster,
    jobs: Sequence[PlacedJob],
    current: Iterable[CrossConnect],
    aggregators: AggregatorLedger,
    previous: FabricPlan | None = None,
    tdm_active: str | None = None,
    keep_turns: bool = False,
    allocation: PortAllocation | None = None,
) -> FabricPlan:
    """Plan every placed job's collective, slice, cross-connects and routing.

    `jobs` in arrival order (earlier jobs keep priority for ports). Jobs whose
    placement equals their entry in `previous` keep collective, slice and circuits.
    `current` is what the OXCs hold; changes to it are minimal.

    With `allocation` (`allocation.allocate_ports`), a re-planned job's slice is
    its allocation: isolated jobs get exactly the allocated circuits on the
    allocated OXCs (a circuit whose OXC no longer has both ports free goes to
    any OXC that has), shared jobs take turns on the allocation's pool.
    """
    present = {pj.job.job_id for pj in jobs}
    ledger = AggregatorLedger(tuple(g for g in aggregators.grants if g.job_id in present))
    prev = {j.job_id: j for j in previous.jobs} if previous else {}
    kept = {
        pj.job.job_id: old
        for pj in jobs
        if (old := prev.get(pj.job.job_id)) is not None
        and (old.placement is pj.placement or old.placement == pj.placement)
    }
    # without an allocation, slices come out of the ports kept jobs leave free
    free = {p.id: p.uplink_ports for p in cluster.pods}
    for jf in kept.values() if allocation is None else ():
        if jf.slice.mode == MODE_ISOLATED:
            for p, n in jf.slice.pod_ports:
                free[p] -= n
    drafts: list[_Draft] = []
    for pj in jobs:
        job_id = pj.job.job_id
        old = kept.get(job_id)
        if old is not None and old.slice.mode == MODE_TIME_DIVISION and keep_turns:
            # a job taking turns keeps taking them until a completion frees ports
            ledger = ledger.release(job_id).reserve(cluster, old.collective.grants)
            traffic = collective_traffic(cluster, pj.job, pj.placement, old.collective)
            drafts.append(
                _Draft(
                    pj.job,
                    pj.placement,
                    old.collective,
                    old.slice,
                    traffic,
                    combined_demand(traffic),
                    _EMPTY_PLAN,
                    None,
                )
            )
            continue
        if old is not None and old.slice.mode != MODE_TIME_DIVISION:
            # its grants are in `ledger` already (it came from `previous`)
            drafts.append(
                _Draft(
                    pj.job,
                    pj.placement,
                    old.collective,
                    old.slice,
                    (),
                    _NO_DEMAND,
                    old.plan,
                    old,
                )
            )
            continue
        ledger = ledger.release(job_id)
        choice = choose_collective(cluster, pj.job, pj.placement, ledger)
        ledger = ledger.reserve(cluster, choice.grants)
        traffic = collective_traffic(cluster, pj.job, pj.placement, choice)
        combined = combined_demand(traffic)
        if allocation is not None:
            slc = _allocated_slice(job_id, allocation.job(job_id), combined)
        else:
            slc = _slice(cluster, job_id, combined, pj.placement, free)
        drafts.append(
            _Draft(pj.job, pj.placement, choice, slc, traffic, combined, _EMPTY_PLAN, None)
        )
    if allocation is None:
        drafts, free = _reclaim_for_turns(cluster, drafts, free)
        # time division shares what no isolated slice holds
        pool = dict(free)
    else:
        # time division shares the allocation's pool
        pool = {p.id: 0 for p in cluster.pods}
        for _, pod_a, pod_b, n in allocation.pool:
            pool[pod_a] += n
            pool[pod_b] += n
    tdm = [d.job.job_id for d in drafts if d.slice.mode == MODE_TIME_DIVISION]
    if tdm_active in tdm:
        i = tdm.index(tdm_active)
        tdm = tdm[i:] + tdm[:i]
    current = tuple(current)
    where = port_pods(cluster)
    held = _held(cluster, current)
    holding = held.jobs
    wanted: dict[str, PodCircuits] = {}
    allocated: dict[str, tuple[tuple[str, str, str, int], ...]] = {}
    allocated_matrix: dict[str, PodCircuits] = {}
    untouched_jobs: set[str] = set()  # kept jobs whose cross-connects stay as the OXCs hold them
    planned: list[_Draft] = []
    for d in drafts:
        if d.reused is None and d.slice.mode not in (MODE_NONE, MODE_ELECTRICAL):
            budget = dict(d.slice.pod_ports) if d.slice.mode == MODE_ISOLATED else pool
            ja = allocation.job(d.job.job_id) if allocation is not None else None
            if ja is not None and d.slice.mode == MODE_ISOLATED and ja.circuits:
                # the allocation's circuits, evaluated for this job's demand
                circuits = pair_circuits(cluster, ja.circuits)
                plan = evaluate_circuits(_restrict(d.combined), circuits, budget, cluster.nic_gbps)
                allocated[d.job.job_id] = ja.circuits
                allocated_matrix[d.job.job_id] = circuits
            else:
                demand = _restrict(d.combined)
                plan = plan_circuits(demand, budget, cluster.nic_gbps)
                if allocation is not None and d.slice.mode == MODE_TIME_DIVISION:
                    # `budget` counts the pool's ports per pod; a turn's circuits are
                    # those the pool's ports make on each switch
                    plan = _on_switches(cluster, plan, demand, budget, pool_room(allocation.pool))
            d.plan = plan
        planned.append(d)
        job_id = d.job.job_id
        installs = d.slice.mode == MODE_ISOLATED or (tdm and tdm[0] == job_id)
        if installs and d.reused is not None and job_id in holding:
            # an unchanged allocation keeps exactly the circuits it holds now (its
            # current phase topology included): others' arrivals do not revert it
            untouched_jobs.add(job_id)
        elif installs and job_id in allocated:
            pass  # mapped on the allocated OXCs below
        elif installs and d.plan.circuits.total:
            wanted[job_id] = d.plan.circuits
    turn: dict[str, PodCircuits] = {}
    if allocation is not None and tdm and tdm[0] in wanted:
        # the turn holder's circuits go on the pool's ports and on ports nobody's
        # allocation has, mapped after the isolated jobs': a free port beyond them may
        # be an isolated job's, not connected yet (hypothesis found a turn passed on at
        # a completion taking a port a growing job was just given: it went short)
        turn[tdm[0]] = wanted.pop(tdm[0])
    moving = [cc for j in holding - untouched_jobs for cc in held.by_job[j]]
    if moving:
        # the held cross-connects of untouched jobs, in their order (filtered in C: a
        # 300-job fabric holds thousands, an arrival moves a few jobs' of them)
        mask = map(untouched_jobs.__contains__, map(_JOB_OF, held.cross_connects))
        untouched = list(compress(held.cross_connects, mask))
        occupied = set(held.ports).difference(_ports(moving))
    else:
        untouched, occupied = list(held.cross_connects), set(held.ports)
    now = cross_connects_by_job(current)
    exact = map_allocation(cluster, allocated, _of_jobs(now, allocated), occupied)
    for job_id, *_ in exact.unmapped:
        allocated_matrix.pop(job_id, None)  # its circuits are not all where allocated
    if exact.unmapped:
        # what the allocated OXCs cannot hold (a kept job holds a phase topology
        # there) goes to any OXC with a free port on both pods
        missing: dict[str, list[tuple[str, str, int]]] = defaultdict(list)
        for job_id, a, b, n in exact.unmapped:
            missing[job_id].append((a, b, n))
        pods = tuple(p.id for p in cluster.pods)
        for job_id, pairs in missing.items():
            wanted[job_id] = PodCircuits.from_pairs(pods, pairs)
    occupied.update(_ports(exact.cross_connects))
    rest = map_cross_connects(cluster, wanted, _of_jobs(now, wanted), occupied)
    if rest.unmapped:
        # a re-planned job's kept cross-connect can hold the last port of a pod on the
        # only OXC where its other pair fits (hypothesis found one: a sharer's kept
        # pod-0/pod-2 circuit on oxc-1 left its second pod-0/pod-1 circuit nowhere):
        # those jobs are mapped afresh (their plan changed anyway)
        short = {u[0] for u in rest.unmapped}
        fresh = map_cross_connects(
            cluster, wanted, _of_jobs(now, [j for j in wanted if j not in short]), occupied
        )
        if len(fresh.unmapped) < len(rest.unmapped):
            rest = fresh
    if turn and allocation is not None:
        on_pool = map_cross_connects(
            cluster,
            turn,
            _of_jobs(now, turn),
            occupied.union(_ports(rest.cross_connects)),
            turn_ports(cluster, allocation),
        )
        rest = replace(
            rest,
            cross_connects=rest.cross_connects + on_pool.cross_connects,
            unmapped=rest.unmapped + on_pool.unmapped,
            kept=rest.kept + on_pool.kept,
            added=rest.added + on_pool.added,
        )
    mapping = replace(
        rest,
        cross_connects=tuple(
            sorted(exact.cross_connects + rest.cross_connects, key=physical_order)
        ),
        kept=rest.kept + exact.kept,
        added=rest.added + exact.added,
    )
    by_job: dict[str, list[CrossConnect]] = defaultdict(list)
    for cc in mapping.cross_connects:
        by_job[cc.job_id].append(cc)
    lost = {u[0] for u in mapping.unmapped}
    out: list[JobFabric] = []
    for d in planned:
        job_id = d.job.job_id
        if d.reused is not None and (job_id in untouched_jobs or job_id not in lost):
            out.append(d.reused)
            continue
        real = allocated_matrix.get(job_id)  # mapped exactly as allocated
        if real is None:
            real = realised_circuits(cluster, by_job.get(job_id, ()), job_id)
        out.append(_finish(cluster, d, real))
    cross_connects = tuple(sorted(untouched + list(mapping.cross_connects), key=physical_order))
    # every one of them is on working ports between two pods: the next plan, which
    # starts from them, need not look again
    occupied.update(_ports(rest.cross_connects))
    jobs_holding = untouched_jobs.union(by_job)

    def grouped() -> dict[str, tuple[CrossConnect, ...]]:
        # untouched jobs hold what they held, the others what was mapped now: each in
        # physical order, as grouping the whole tuple would give
        out = {j: held.by_job[j] for j in untouched_jobs}
        out.update((j, tuple(ccs)) for j, ccs in by_job.items())
        return out

    _HELD.get(
        (cross_connects, where),
        lambda: _Held(
            cross_connects,
            frozenset(jobs_holding),
            frozenset(occupied),
            cross_connects_by_job(cross_connects, grouped),
        ),
    )
    mlu = max((j.plan.mlu for j in out if j.slice.mode == MODE_ISOLATED), default=0.0)
    return FabricPlan(tuple(out), cross_connects, mlu, ledger, tuple(tdm), mapping.unmapped)


_JOB_OF = attrgetter("job_id")


class _Held(NamedTuple):
    """What the OXCs hold that a plan can keep: cross-connects on working ports between
    two pods (a failed port drops out), in the OXCs' order; their jobs; their ports."""

    cross_connects: tuple[CrossConnect, ...]
    jobs: frozenset[str]
    ports: frozenset[tuple[str, int]]
    by_job: Mapping[str, tuple[CrossConnect, ...]]  # `cross_connects_by_job`


def _held(cluster: Cluster, current: tuple[CrossConnect, ...]) -> _Held:
    where = port_pods(cluster)
    return _HELD.get((current, where), lambda: _find_held(where, current))


def _find_held(where: Mapping[tuple[str, int], str], current: Iterable[CrossConnect]) -> _Held:
    # in physical order, as a plan's own cross-connects are (a plan groups the jobs it
    # leaves alone from these: `grouped` in `plan_fabric`); a stored state read back
    # unordered would otherwise pass its order on to the next plan's mapping
    working = tuple(
        sorted(
            (
                cc
                for cc in current
                if (a := where.get((cc.oxc_id, cc.port_a))) is not None
                and a != where.get((cc.oxc_id, cc.port_b), a)
            ),
            key=physical_order,
        )
    )
    by_job = cross_connects_by_job(working)
    return _Held(working, frozenset(by_job), frozenset(_ports(working)), by_job)


def _of_jobs(
    by_job: Mapping[str, tuple[CrossConnect, ...]], job_ids: Iterable[str]
) -> list[CrossConnect]:
    """These jobs' cross-connects (each job's in their order)."""
    return [cc for j in job_ids for cc in by_job.get(j, ())]


def _ports(cross_connects: Iterable[CrossConnect]) -> Iterator[tuple[str, int]]:
    for cc in cross_connects:
        yield cc.oxc_id, cc.port_a
        yield cc.oxc_id, cc.port_b


# a plan's result is the next plan's `current` (the controller's desired state): it is
# remembered as held when it is made (see the end of `plan_fabric`)
_HELD: IdentityMemo[_Held] = IdentityMemo(8)


def _allocated_slice(job_id: str, ja: JobAllocation | None, demand: DemandMatrix) -> JobSlice:
    """The slice an allocation gives: isolated ports, turns on the pool, the electrical
    core, or none."""
    if ja is None or ja.mode == ALLOC_NONE or not demand.total_bytes:
        return JobSlice(job_id, MODE_NONE, (), "no inter-pod traffic")
    if ja.mode == ALLOC_ISOLATED:
        return JobSlice(job_id, MODE_ISOLATED, ja.pod_ports, ja.reason)
    if ja.mode == ALLOC_ELECTRICAL:
        return JobSlice(job_id, MODE_ELECTRICAL, (), ja.reason)
    return JobSlice(job_id, MODE_TIME_DIVISION, (), ja.reason)


_EMPTY_PLAN = CircuitPlan(PodCircuits((), ()), 0.0, 0.0, (), "none")
_NO_DEMAND = DemandMatrix((), ())  # a kept job's draft: its demand is not re-derived


def _reclaim_for_turns(
    cluster: Cluster, drafts: Sequence[_Draft], free: dict[str, int]
) -> tuple[list[_Draft], dict[str, int]]:
    """Ports for the jobs that take turns: at least one per peer pod outside the slices.

    Every placed job with cross-pod traffic is served; a time-division job whose pod
    has no port outside the isolated slices would have nothing to take turns on. The
    isolated slice with most spare ports on that pod gives up the deficit (its
    allocation changes, so it is planned afresh), never below one port per peer pod.
    """
    free = dict(free)
    out = list(drafts)
    for d in drafts:
        if d.slice.mode != MODE_TIME_DIVISION:
            continue
        for pod, n in sorted(_peers(d.combined).items()):
            deficit = n - free.get(pod, 0)
            while deficit > 0:
                spare = [
                    (dict(o.slice.pod_ports).get(pod, 0) - _min_ports(cluster, o).get(pod, 0), i)
                    for i, o in enumerate(out)
                    if o.slice.mode == MODE_ISOLATED
                ]
                best = max(spare, default=(0, -1))
                if best[0] <= 0:
                    # every slice there is minimal: the latest one joins the turns
                    # and its ports go to the pool
                    late = [
                        i
                        for i, o in enumerate(out)
                        if o.slice.mode == MODE_ISOLATED and dict(o.slice.pod_ports).get(pod, 0) > 0
                    ]
                    if not late:
                        break
                    gone = out[late[-1]]
                    for p, n in gone.slice.pod_ports:
                        free[p] = free.get(p, 0) + n
                    deficit -= dict(gone.slice.pod_ports)[pod]
                    out[late[-1]] = _taking_turns(cluster, gone)
                    continue
                take = min(deficit, best[0])
                out[best[1]] = _shrunk(cluster, out[best[1]], pod, take)
                free[pod] += take
                deficit -= take
    return out, free


TURNS_REASON = "uplink ports of its pods are all in minimal slices: takes turns on shared ports"


def _taking_turns(cluster: Cluster, d: _Draft) -> _Draft:
    traffic = _draft_traffic(cluster, d)
    slc = JobSlice(d.job.job_id, MODE_TIME_DIVISION, (), TURNS_REASON)
    return _on_slice(d, slc, traffic)


def collective_traffic(
    cluster: Cluster, job: Job, placement: Placement, collective: CollectiveChoice
) -> tuple[PhaseTraffic, ...]:
    """The job's phases under the collective chosen for it (INC roots included)."""
    return job_traffic(cluster, job, placement, collective.algorithm, dict(collective.root_tors))


def _on_slice(d: _Draft, slc: JobSlice, traffic: tuple[PhaseTraffic, ...]) -> _Draft:
    """The draft on another slice, to be planned afresh there."""
    return _Draft(
        d.job,
        d.placement,
        d.collective,
        slc,
        traffic,
        combined_demand(traffic),
        _EMPTY_PLAN,
        None,
    )


def _draft_traffic(cluster: Cluster, d: _Draft) -> tuple[PhaseTraffic, ...]:
    return d.traffic or collective_traffic(cluster, d.job, d.placement, d.collective)


def _min_ports(cluster: Cluster, d: _Draft) -> dict[str, int]:
    combined = d.combined if d.combined.pod_ids else combined_demand(_draft_traffic(cluster, d))
    return _peers(combined)


def _shrunk(cluster: Cluster, d: _Draft, pod: str, ports: int) -> _Draft:
    """The draft with `ports` fewer on `pod`, to be planned afresh."""
    traffic = _draft_traffic(cluster, d)
    quota = dict(d.slice.pod_ports)
    quota[pod] -= ports
    slc = JobSlice(d.job.job_id, MODE_ISOLATED, tuple(sorted(quota.items())), "vClos slice")
    return _on_slice(d, slc, traffic)


def _restrict(demand: DemandMatrix) -> DemandMatrix:
    """The demand over only the pods it touches (small instances plan fast)."""
    return _RESTRICTED.get((demand,), lambda: _restricted(demand))


def _restricted(demand: DemandMatrix) -> DemandMatrix:
    entries = demand.entries()
    pods = sorted({p for p, _, _ in entries} | {q for _, q, _ in entries})
    return DemandMatrix.from_entries(pods, entries)


# a job's demand matrices come from its remembered traffic (`traffic.job_traffic`):
# re-planning it restricts and combines the very same matrices again
_RESTRICTED: IdentityMemo[DemandMatrix] = IdentityMemo(4096)
_COMBINED: IdentityMemo[DemandMatrix] = IdentityMemo(4096)


def _finish(cluster: Cluster, d: _Draft, real: PodCircuits) -> JobFabric:
    """Evaluate the job on its realised circuits and write its routing headers."""
    job_id = d.job.job_id
    traffic = _draft_traffic(cluster, d)
    budget = dict(d.slice.pod_ports) or {p: real.row_sum(p) for p in real.pod_ids}
    plan = d.plan
    if d.slice.mode == MODE_ELECTRICAL:
        routing = route_phases(
            cluster, job_id, traffic, d.collective, real, budget, electrical=True
        )
        return JobFabric(job_id, d.placement, d.collective, d.slice, plan, real, routing)
    if d.slice.mode == MODE_ISOLATED:
        combined = d.combined if d.combined.pod_ids else combined_demand(traffic)
        plan = evaluate_circuits(_restrict(combined), real, budget, cluster.nic_gbps)
    choice = d.collective
    if d.slice.mode != MODE_NONE:
        # a job waiting for its turn is estimated on the circuits its turn brings
        circuits = real if real.total else d.plan.circuits
        choice = reestimate(choice, cluster, d.job, d.placement, circuits.gbps(cluster.nic_gbps))
    routing = route_phases(cluster, job_id, traffic, choice, real, budget)
    return JobFabric(job_id, d.placement, choice, d.slice, plan, real, routing)


def route_phases(
    cluster: Cluster,
    job_id: str,
    traffic: Sequence[PhaseTraffic],
    choice: CollectiveChoice,
    circuits: PodCircuits,
    budget: Mapping[str, int],
    *,
    electrical: bool = False,
) -> tuple[RoutingDecision, ...]:
    """The routing headers of a job's pp and dp phases over the circuits it holds now.

    Only circuits that exist carry a route: a cross-pod flow with no circuit path
    (a job waiting for its turn on shared ports) gets no source route until one does.
    `electrical`: every cross-pod flow goes from its pod straight to the other over
    the electrical core.
    """
    routing = []
    for t in traffic:
        if t.phase not in (PHASE_PP, PHASE_DP):
            continue
        if electrical:
            routes = _electrical_routes(cluster, t.flows)
        else:
            routes = _circuit_routes(cluster, t.flows, t.pod_demand, circuits, budget)
        dp = t.phase == PHASE_DP
        routing.append(
            RoutingDecision(
                job_id,
                t.phase,
                choice.algorithm if dp else "send_recv",
                choice.inc and dp,
                choice.aggregators if dp else (),
                routes,
                LAYER_ELECTRICAL if electrical else LAYER_OPTICAL,
            )
        )
    return tuple(routing)


def route_observed(
    cluster: Cluster,
    job_id: str,
    plan_id: str,
    flows: Sequence[Flow],
    circuits: PodCircuits,
    budget: Mapping[str, int],
) -> RoutingDecision:
    """The header of an observed phase the circuits were rewired for: its flows as the
    network reported them (not the job's modelled traffic, which may differ or be a
    guess), routed on those circuits; `phase` is the plan id predictions name."""
    demand = pod_demand_from_flows(cluster, flows)
    routes = _circuit_routes(cluster, flows, demand, circuits, budget)
    return RoutingDecision(job_id, plan_id, "send_recv", False, (), routes)


def _circuit_routes(
    cluster: Cluster,
    flows: Sequence[Flow],
    pod_demand: DemandMatrix,
    circuits: PodCircuits,
    budget: Mapping[str, int],
) -> tuple[Route, ...]:
    """Each flow's path over the circuits (direct or two hops), as the phase's plan splits it.

    A flow between pods the circuits do not join gets no route; the others keep
    theirs (a plan of the whole phase has none at all then: one pair without a path
    left a job's dp header with no cross-pod route while its pp circuits were in).
    """
    if not (pod_demand.total_bytes and circuits.total):
        return _routes(cluster, flows, _EMPTY_PLAN)
    demand = _restrict(pod_demand)
    phase_eval = evaluate_circuits(demand, circuits, budget, cluster.nic_gbps)
    if not math.isfinite(phase_eval.completion_s):
        reachable = _reachable(demand, circuits)
        if reachable.total_bytes:
            phase_eval = evaluate_circuits(reachable, circuits, budget, cluster.nic_gbps)
    return _routes(cluster, flows, phase_eval)


def _reachable(demand: DemandMatrix, circuits: PodCircuits) -> DemandMatrix:
    """The demand's pod pairs that a circuit joins directly or over one other pod."""
    pods = demand.pod_ids
    kept = [
        (p, q, x)
        for p, q, x in demand.entries()
        if circuits.get(p, q) > 0
        or any(circuits.get(p, r) > 0 and circuits.get(r, q) > 0 for r in pods if r not in (p, q))
    ]
    return DemandMatrix.from_entries(pods, kept)


def _electrical_routes(cluster: Cluster, flows: Sequence[Flow]) -> tuple[Route, ...]:
    return tuple(
        Route(f.src, f.dst, (src,) if src == dst else (src, dst))
        for f, src, dst in _flow_pods(cluster, flows)
    )


def combined_demand(traffic: Sequence[PhaseTraffic]) -> DemandMatrix:
    """A job's pp and dp phases together: what its held topology serves."""
    return _COMBINED.get((traffic,), lambda: _combined(traffic))


def _combined(traffic: Sequence[PhaseTraffic]) -> DemandMatrix:
    phases = {t.phase: t.pod_demand for t in traffic}
    return phases[PHASE_PP].plus(phases[PHASE_DP])


def oxc_decisions(
    gone: Sequence[CrossConnect], new: Sequence[CrossConnect], reason: str
) -> list[Decision]:
    """Per OXC, the cross-connects to disconnect (`gone`) and connect (`new`), each
    decision under the one job they are for.

    Where one switch's change is several jobs' (an arrival taking ports from a
    running job, a turn passing), every job's disconnects come first and then every
    job's connects, so a consumer replaying the log in order never connects a port
    still joined (these were one decision with no `job_id`). A cross-connect that
    stays joined but passes to another job (a job ended and the next one kept its
    circuit) is a `handover` in the new owner's decision: nothing on the switch
    changes, and a consumer tracking circuits per job still sees whose it is."""
    gone_owner = {cc.key: cc.job_id for cc in gone}
    new_owner = {cc.key: cc.job_id for cc in new}
    physical = {change.oxc_id: change for change in diff_cross_connects(gone, new)}
    took: dict[str, dict[str, list[tuple[int, int, str]]]] = defaultdict(lambda: defaultdict(list))
    for key in sorted(gone_owner.keys() & new_owner.keys()):
        if gone_owner[key] != new_owner[key]:
            o, a, b = key
            took[o][new_owner[key]].append((a, b, gone_owner[key]))
    out: list[Decision] = []
    for o in sorted(physical.keys() | took.keys()):
        change = physical.get(o, OxcChange(o, (), ()))
        lost: dict[str, list[tuple[int, int]]] = defaultdict(list)
        got: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for a, b in change.disconnect:
            lost[gone_owner[(o, a, b)]].append((a, b))
        for a, b in change.connect:
            got[new_owner[(o, a, b)]].append((a, b))
        handed = took.get(o, {})
        jobs = set(lost) | set(got) | set(handed)
        if len(jobs) == 1:
            job_id = jobs.pop()
            out.append(
                Decision(
                    "oxc",
                    job_id,
                    reason,
                    oxc=replace(change, handover=tuple(handed.get(job_id, ()))),
                )
            )
            continue
        for job_id in sorted(lost):
            out.append(Decision("oxc", job_id, reason, oxc=OxcChange(o, (), tuple(lost[job_id]))))
        for job_id in sorted(set(got) | set(handed)):
            oxc = OxcChange(o, tuple(got.get(job_id, ())), (), tuple(handed.get(job_id, ())))
            out.append(Decision("oxc", job_id, reason, oxc=oxc))
    return out


def diff_plans(
    before: FabricPlan | None,
    after: FabricPlan,
    reason: str,
    changes: tuple[tuple[CrossConnect, ...], tuple[CrossConnect, ...]] | None = None,
) -> tuple[Decision, ...]:
    """Only what changed: oxc connect/disconnect per OXC, then changed routing per job/phase.

    `changes` is `changed_cross_connects` of the two plans, when the caller has it.
    """
    if changes is None:
        changes = changed_cross_connects(
            before.cross_connects if before else (), after.cross_connects
        )
    decisions = oxc_decisions(*changes, reason)
    was = {j.job_id: j for j in before.jobs} if before else {}
    for j in after.jobs:
        prior = was.get(j.job_id)
        if prior is j:
            continue  # kept as it was: same headers
        # a job's headers are its own (route_phases writes them under its id), so only
        # the headers of the job it was are compared, not every job's
        old = {(r.job_id, r.phase): r for r in prior.routing} if prior is not None else {}
        for r in j.routing:
            if old.get((r.job_id, r.phase)) != r:
                decisions.append(Decision("routing", r.job_id, reason, routing=r))
    return tuple(decisions)

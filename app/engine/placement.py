"""Placement of a job's parallel units on servers: `place_job` is the one entry point.

Pure functions over `Cluster` and the set of free servers; this module must not
import anything that does I/O (no FastAPI, SQLAlchemy, Redis, pydantic), read a
clock or use unseeded randomness.

A job with degrees (ep, dp, pp) is dp*pp EP groups of ep servers; a unit is
(stage, dp_rank, ep_rank) on one server. Placement runs in two steps:

1. Slots (fragmentation): a pod holds free_servers // ep EP groups. A job goes
   into one pod when one holds it (else the fewest pods, largest first,
   best-fit for the tail): the pod whose leftover strands the fewest servers
   for later EP groups of the common widths 2, 4 and 8 (a look-ahead: 11
   servers left on a 75-server pod strand 7, 8 left strand none), then best
   fit, so partly used pods are filled before whole ones are broken up and a
   big job still finds whole pods later; then a pod where every group fits
   under a ToR. An EP job thus takes the 7- and 3-server gaps whole-ToR groups
   leave on 15-server ToRs rather than break a whole pod.
   Inside a pod, groups go under one ToR while a ToR of that pod has room, the
   smallest ToRs first (scraps are used, whole ToRs stay whole); only then do
   they span the pod's ToRs (its non-blocking electrical Clos carries their
   all-to-all; the reason says so), never pods. A job waits only when the pods
   hold too few EP groups. A job spanning pods prefers pods with free uplink
   ports (`ports_free`); one inside a pod prefers pods whose uplinks are taken.
2. Layout (communication): map the groups onto those slots in a few candidate
   orders (a stage's DP replicas together, whole pipelines together, or DP ranks
   blocked by pod) and keep the one with the lowest estimated iteration
   communication time over the DP collectives (INC, ring, double binary tree,
   hierarchical ring) and the pipeline sends. `Placement.reason` records the
   estimates, so operators can see why.

The DP estimate is the collective engine's (`collective.estimate_costs`, SPEC
section 4 item 2), fed with the circuits the job would really get: the free
uplinks of each pod (at most servers x NICs), split over the pods it spans.
The PP estimate (GPipe sends on the slowest edge) is here, as the collective
engine has none.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence, Set
from dataclasses import dataclass
from typing import TypeVar

from .allocation import job_demand
from .cluster import Cluster, Pod, Tor
from .collective import (
    ALPHA_RING_S,
    AggregatorGrant,
    AggregatorLedger,
    aggregator_capacity,
    choose_collective,
    estimate_costs,
)
from .cross_connects import port_pods
from .job import Collective, Job, Placement, Unit, Unplaceable
from .memo import IdentityMemo, scratch
from .memory import check_job_memory
from .traffic import ALGO_INC, ALGO_RING, ALGO_TREE, resolve_facts

NEVER_TOO_MANY_SERVERS = "needs more servers than the cluster has"
NEVER_EP_WIDER_THAN_POD = "an EP group needs more servers than any pod holds"
NEVER_TOO_MANY_EP_GROUPS = "the cluster's pods cannot hold that many EP groups at once"
NEVER_TOO_FEW_UPLINKS = "the pods it must span have too few uplinks to join them with circuits"
NEVER_PODS_NOT_JOINED = (
    "no set of pods every two of which an OXC wired to both (or both pods' electrical "
    "cores) joins holds it"
)
NEVER_NO_LAYOUT = (
    "even on the empty cluster no layout of it gives every pod it spans one uplink per "
    "pod pair it crosses"
)
NOT_NOW_BUSY = "not enough free servers for whole EP groups inside pods right now"
NOT_NOW_UPLINKS = (
    "the free servers are on pods with too few uplinks for one circuit per pod pair it "
    "crosses, or on pods no OXC joins; waits for a layout whose pods have them"
)
NOT_NOW_SPREAD = (
    "the free servers would spread it over more pods than it needs, where uplinks are "
    "taken; waits for a compact layout"
)
# On an optical fabric a small job spans at most this many pods beyond the fewest its
# EP groups need (`max_extra_pods`) unless every pod of the layout has the free uplinks
# its circuits want there (`allocation.job_demand`): a ring through a pod needs a
# server's worth of circuits in and out, so a job scattered by fragmentation over
# pods whose uplinks are taken gets starved circuits for life, and takes ports that
# compact jobs would use. Measured at 260 running jobs on seed-15k
# (bench/bench_scale.py, README "At scale"): the same utilisation within 0.04
# points, mean slowdown 1.0014 against 1.0038 with no limit; 0 extra pods idles
# holes (0.4 points lower). Where a pod has fewer uplinks than servers the limit is 0
# (`spread_limit`).
OPTICAL_EXTRA_PODS = 1
# Only a job of at most 1/SMALL_JOB_SHARE of a pod is held back: a compact layout
# comes for it as soon as a few jobs in a pod end, while a bigger head would hold
# a reservation idle longer than spreading costs it (comm-heavy lost 1.1-1.5 points
# of utilisation per seed when jobs of 12-64 servers were held too, a tuning run).
SMALL_JOB_SHARE = 4
EP_SPANS_TORS = "EP group(s) span ToRs of one pod (its electrical Clos carries the all-to-all)"

# Grant holder standing for every other job in the ledger built from free capacity.
_OTHERS = "(other jobs)"

_C = TypeVar("_C", Pod, Tor)


@dataclass(frozen=True, slots=True)
class _Slot:
    """Room for one EP group: `ep` free servers under one ToR (or, spanning, one pod)."""

    servers: tuple[str, ...]
    tor_id: str  # "" when the group spans ToRs of its pod
    pod_id: str


@dataclass(frozen=True, slots=True)
class LayoutEstimate:
    """One candidate layout and its estimated communication time per iteration."""

    name: str
    algorithm: str
    dp_s: float
    pp_s: float

    @property
    def total_s(self) -> float:
        return self.dp_s + self.pp_s


def never_fits(cluster: Cluster, job: Job) -> tuple[str, ...]:
    """Reasons the job could not be placed even on an empty cluster (empty: it can)."""
    par = job.parallelism
    reasons = []
    if par.servers > cluster.server_count:
        reasons.append(f"{NEVER_TOO_MANY_SERVERS}: {par.servers} > {cluster.server_count}")
    widest = max((len(p.servers) for p in cluster.pods), default=0)
    if par.ep > widest:
        reasons.append(f"{NEVER_EP_WIDER_THAN_POD}: ep={par.ep} > {widest}")
    elif par.ep > 1 and par.dp * par.pp > sum(len(p.servers) // par.ep for p in cluster.pods):
        reasons.append(NEVER_TOO_MANY_EP_GROUPS)  # (ep = 1: too many servers, said above)
    else:
        # k pods joined by circuits: each needs an uplink, and a connected graph over
        # them has at least k - 1 edges, two port ends each (the k best-wired pods);
        # pods with an electrical core send over it instead
        k = fewest_pods(cluster, job)
        cored = sum(1 for p in cluster.pods if p.electrical_gbps > 0)
        ports = sorted((p.uplink_ports for p in cluster.pods), reverse=True)[:k]
        if k > 1 and cored < k and (min(ports) < 1 or sum(ports) < 2 * (k - 1)):
            reasons.append(
                f"{NEVER_TOO_FEW_UPLINKS}: {k} pods, with {', '.join(map(str, ports))} uplinks"
            )
        elif (
            k > 1
            and not reasons
            and len(cluster.joined_pod_sets) > 1
            and not _joined_enough(cluster, job)
        ):
            reasons.append(NEVER_PODS_NOT_JOINED)
        elif k > 1 and not reasons:
            reasons += _unplaceable_on_empty(cluster, job)
    return tuple(reasons)


# (cluster, the job's shape and facts) -> why it cannot be placed on the empty cluster
_ON_EMPTY: IdentityMemo[tuple[str, ...]] = IdentityMemo(1024)


def _unplaceable_on_empty(cluster: Cluster, job: Job) -> tuple[str, ...]:
    """The placer's own answer on the empty cluster (every server and port free), for a
    job the counts above let through: a sweep's 6-server ring over three 2-server pods,
    one of them with one uplink, passed them (7 uplinks over the 3 pods), waited for
    ever as the head of the queue and held every later job behind its reservation."""
    if _uplinks_never_short(cluster):
        return ()
    key = (job.parallelism, job.collective)  # what the layouts' pod pairs depend on
    return _ON_EMPTY.get((cluster,), lambda: _on_empty(cluster, job), key)


def _uplinks_never_short(cluster: Cluster) -> bool:
    """Every two pods can be joined and every pod has an uplink for each other pod: no
    layout is ever short of uplinks (`_uplinks_short`), so nothing need be placed."""
    n = len(cluster.pods)
    return cluster.joined_pod_sets == (frozenset(p.id for p in cluster.pods),) and all(
        p.uplink_ports >= n - 1 or p.electrical_gbps > 0 for p in cluster.pods
    )


def _on_empty(cluster: Cluster, job: Job) -> tuple[str, ...]:
    """The placer on every server (it leaves out a short-wired pod and tries the rest
    itself, as it does for any layout short of uplinks)."""
    got = _place(cluster, frozenset(cluster.server_ids), job)
    return (NEVER_NO_LAYOUT,) if isinstance(got, Unplaceable) else ()


def refusals(
    cluster: Cluster, job: Job, gpu_memory_bytes: float, zero_stage: int
) -> tuple[str, ...]:
    """Why admission refuses the job for good, as `POST /v1/jobs` does (empty: it may
    run): it never fits the cluster, or its stated plan does not fit GPU memory with
    tensor parallelism across a server's GPUs."""
    reasons = never_fits(cluster, job)
    if reasons:
        return reasons
    memory = check_job_memory(
        job, gpu_memory_bytes, tp=cluster.gpus_per_server, zero_stage=zero_stage
    )
    return memory.reasons if memory is not None and not memory.fits else ()


def _joined_enough(cluster: Cluster, job: Job) -> bool:
    """Some set of pods every two of which can be joined (`Cluster.joined_pod_sets`)
    holds the job's EP groups."""
    ep = job.parallelism.ep
    need = job.parallelism.dp * job.parallelism.pp
    pods = cluster.pods_by_id
    return any(
        sum(len(pods[p].servers) // ep for p in joined) >= need
        for joined in cluster.joined_pod_sets
    )


def fewest_pods(cluster: Cluster, job: Job) -> int:
    """Pods the job spans at the least: its EP groups over the pods that hold most."""
    ep = job.parallelism.ep
    need = job.parallelism.dp * job.parallelism.pp
    held = 0
    for n, pod in enumerate(sorted((len(p.servers) // ep for p in cluster.pods), reverse=True)):
        held += pod
        if held >= need:
            return n + 1
    return len(cluster.pods)


def uplinks_free(
    cluster: Cluster,
    held: Mapping[str, float],
    failed: Mapping[str, Collection[int]] | None = None,
) -> dict[str, int]:
    """`ports_free` for `place_job`: each pod's uplinks less what jobs' isolated slices
    hold there (`held`, pod id -> ports: the sum of their `network.pod_ports`) and less
    its failed ones (`failed`, OXC id -> ports the switches report failed): a pod whose
    every uplink was dark looked wholly free once its jobs had lost their circuits, and
    new jobs spanning pods were placed on it while 22 pods stood free."""
    dark: dict[str, int] = {}
    if failed:
        where = port_pods(cluster)
        for oxc_id, ports in failed.items():
            for port in ports:
                if (pod := where.get((oxc_id, port))) is not None:
                    dark[pod] = dark.get(pod, 0) + 1
    return {
        p.id: max(0, p.uplink_ports - dark.get(p.id, 0) - math.ceil(held.get(p.id, 0) - 1e-9))
        for p in cluster.pods
    }


def expected_inc_use(
    cluster: Cluster, job: Job, placement: Placement, aggregator_free_gbps: Mapping[str, float]
) -> dict[str, float]:
    """Switch -> Gb/s of aggregation the fabric controller would grant the placed job now
    (ToRs, and pods for their spines' second level).

    The controller's own first choice (`collective.choose_collective` at NIC rate,
    against what other jobs leave free), so it is what the job's first fabric pass
    will grant unless aggregators change meanwhile.
    """
    choice = choose_collective(cluster, job, placement, _ledger(cluster, aggregator_free_gbps))
    use: dict[str, float] = {}
    for g in choice.grants:
        use[g.tor_id] = use.get(g.tor_id, 0.0) + g.gbps
    return use


class Placer:
    """`place_job` over one admission pass, counting the aggregators it hands out.

    Each placement's expected INC use (`expected_inc_use`) comes off the free
    aggregator capacity the next placement sees, and is kept in `inc_use`:
    jobs placed back to back (in one pass, or before the fabric pass that
    grants the first one's aggregators) do not all count on the same idle
    aggregator. The worker's scheduler and the simulator both place through it.
    """

    def __init__(
        self,
        aggregator_free_gbps: Mapping[str, float],
        ports_free: Mapping[str, int] | None = None,
        max_extra_pods: int | None = None,
    ) -> None:
        self.aggregator_free_gbps = dict(aggregator_free_gbps)
        self.ports_free = ports_free
        self.max_extra_pods = max_extra_pods
        self.inc_use: dict[str, dict[str, float]] = {}  # job -> ToR -> Gb/s

    def __call__(self, cluster: Cluster, free: Set[str], job: Job) -> Placement | Unplaceable:
        result = place_job(
            cluster,
            free,
            job,
            aggregator_free_gbps=self.aggregator_free_gbps,
            ports_free=self.ports_free,
            max_extra_pods=self.max_extra_pods,
        )
        if isinstance(result, Placement) and job.collective in (Collective.AUTO, Collective.INC):
            use = expected_inc_use(cluster, job, result, self.aggregator_free_gbps)
            if use:
                self.inc_use[job.job_id] = use
                agg = self.aggregator_free_gbps
                for switch, gbps in use.items():  # a ToR, or a pod for its spine
                    free_now = agg.get(switch, aggregator_capacity(cluster, switch))
                    agg[switch] = max(0.0, free_now - gbps)
        return result


def place_job(
    cluster: Cluster,
    free: Set[str],
    job: Job,
    *,
    aggregator_free_gbps: Mapping[str, float] | None = None,
    ports_free: Mapping[str, int] | None = None,
    max_extra_pods: int | None = None,
) -> Placement | Unplaceable:
    """Place every unit of `job` on distinct servers from `free`, or say why not.

    `aggregator_free_gbps` maps ToR id to the INC capacity other jobs leave free
    (default: every ToR's full `aggregator_gbps`); it steers ties toward idle
    aggregators and feeds the INC estimate. `ports_free` maps pod id to the
    uplink ports no other job's slice holds (default: all of them): a job that
    spans pods prefers pods with free uplinks and is estimated on the circuits
    it would really get there; a job inside one pod prefers pods whose uplinks
    are taken, leaving free ones to jobs that need them. `max_extra_pods`: a job of
    at most a quarter pod (`SMALL_JOB_SHARE`) whose layout spans more pods than that
    (`spread_limit`: 0 where pods have fewer uplinks than servers) beyond the fewest
    its EP groups need (`fewest_pods`) waits (`NOT_NOW_SPREAD`) when some pod of it
    has fewer free uplinks than its circuits need there; None places it wherever
    servers are free.
    """
    reasons = never_fits(cluster, job)
    if reasons:
        return Unplaceable(job.job_id, reasons, never_fits=True)
    return _place(cluster, free, job, aggregator_free_gbps, ports_free, max_extra_pods)


def _place(
    cluster: Cluster,
    free: Set[str],
    job: Job,
    aggregator_free_gbps: Mapping[str, float] | None = None,
    ports_free: Mapping[str, int] | None = None,
    max_extra_pods: int | None = None,
) -> Placement | Unplaceable:
    """`place_job` for a job `never_fits` lets through."""
    if len(free) < job.parallelism.servers:
        # what `_choose_slots` would find, without scanning the cluster: a full
        # cluster's queue asks this of every queued job at every event
        return Unplaceable(job.job_id, (NOT_NOW_BUSY,))
    # candidate layouts are new objects no later call asks about: their shapes and
    # traffic are not kept in the memos (`memo.scratch`)
    with scratch():
        agg = aggregator_free_gbps or {}
        ports = (
            dict(ports_free)
            if ports_free is not None
            else {p.id: p.uplink_ports for p in cluster.pods}
        )
        slots = _choose_slots(cluster, free, job, agg, ports)
        if slots is None:
            return Unplaceable(job.job_id, (NOT_NOW_BUSY,))
        ledger = _ledger(cluster, agg)
        pods = len({s.pod_id for s in slots})
        # every candidate layout uses the same servers: look their pods and ToRs up once
        pod_of = {s: slot.pod_id for slot in slots for s in slot.servers}
        tor_of = {s: cluster.server(s).tor_id for s in pod_of}
        scored: list[tuple[LayoutEstimate, list[Unit], int]] = []
        for name, order in _candidate_orders(job, slots):
            units = _units(order, slots)
            estimate = _estimate(cluster, job, units, name, ledger, ports, pod_of)
            scored.append((estimate, units, len(scored)))
        estimates = [e for e, _, _ in scored]
        fastest = min(e.total_s for e in estimates)
        # ties (within 0.1%) go to the layout whose DP groups straddle fewest ToRs:
        # aggregation then stays in one switch and spreads over switches
        chosen = min(
            scored,
            key=lambda c: (c[0].total_s > fastest * 1.001, _straddling(tor_of, c[1]), c[2]),
        )
        best = (chosen[0], chosen[1])
        if pods > 1 and not _all_joined(cluster, {slot.pod_id for slot in slots}):
            # pods two of which cannot be joined: checked on the pods themselves, not
            # only on the pairs the job is modelled to cross
            return Unplaceable(job.job_id, (NOT_NOW_UPLINKS,))
        if pods > 1 and _uplinks_short(cluster, job, best[1]):
            # a layout some pod of which could not join all its pairs even with every port
            # would leave the job unserved: another order of the same servers, or wait
            by_speed = sorted(scored, key=lambda c: (c[0].total_s, c[2]))
            servable = [
                c for c in by_speed if c is not chosen and not _uplinks_short(cluster, job, c[1])
            ]
            if not servable:
                # other pods, without the worst-wired of these (the slots were chosen
                # before their uplinks were counted: a review's 12-server ring waited on
                # an empty cluster for a 6-server pod with 1 uplink, while six pods of 2
                # servers and 2 uplinks held it)
                worst = min(
                    {slot.pod_id for slot in slots},
                    key=lambda p: (cluster.pods_by_id[p].uplink_ports, p),
                )
                rest = frozenset(s for s in free if cluster.server(s).pod_id != worst)
                if len(rest) < job.parallelism.servers:
                    return Unplaceable(job.job_id, (NOT_NOW_UPLINKS,))
                return _place(cluster, rest, job, aggregator_free_gbps, ports_free, max_extra_pods)
            best = (servable[0][0], servable[0][1])
        if (  # cheapest tests first: most placements span one pod and stop at the second
            pods > 1
            and (limit := spread_limit(cluster, max_extra_pods)) is not None
            and pods > 1 + limit
            and job.parallelism.servers * SMALL_JOB_SHARE
            <= max(len(p.servers) for p in cluster.pods)
            and pods > fewest_pods(cluster, job) + limit
            and _ports_short(cluster, job, best[1], ports)
        ):
            return Unplaceable(job.job_id, (NOT_NOW_SPREAD,))
        tors = len(set(tor_of.values()))
        reason = _reason(best[0], estimates, pods, tors)
        if any(not s.tor_id for s in slots):
            reason += "; " + EP_SPANS_TORS
        return Placement(job.job_id, tuple(best[1]), reason=reason)


def spread_limit(cluster: Cluster, max_extra_pods: int | None) -> int | None:
    """The pods a small job may span beyond the fewest it needs while some pod of the
    layout lacks the free uplinks its circuits want there: `max_extra_pods`, but 0 on a
    cluster where some pod has fewer uplinks than servers.

    There the circuits a job split over two pods gets are a few of a pod's uplinks of
    its own (a sprayed Clos would let its bursts use them all), and waiting for one pod
    costs less than that (`bench_scale.py --family fleet-stress --extra-pods 1,0`,
    generation seed 808, 3 seeds: 73.17 against 72.58 with 48 uplinks a pod, seed 404
    72.32 against 71.45; 73.32 against 73.37 with 96, 73.44 against 73.58 with 192:
    75 servers a pod).
    """
    if max_extra_pods is None:
        return None
    return 0 if any(p.uplink_ports < len(p.servers) for p in cluster.pods) else max_extra_pods


def _all_joined(cluster: Cluster, pods: Set[str]) -> bool:
    """Can every two of these pods be joined directly (`Cluster.can_join`)?"""
    ordered = sorted(pods)
    return all(cluster.can_join(a, b) for i, a in enumerate(ordered) for b in ordered[i + 1 :])


def _uplinks_short(cluster: Cluster, job: Job, units: Sequence[Unit]) -> bool:
    """The layout crosses a pod pair nothing joins (no OXC wired to both, nor
    electrical cores: `Cluster.can_join`), or some
    pod of it has fewer uplinks (all of them) than the pod pairs it crosses and no
    electrical core: it could never hold one circuit per pair, even taking turns."""
    demand = job_demand(cluster, job, Placement(job.job_id, tuple(units)))
    pods = cluster.pods_by_id
    degree: dict[str, int] = {}
    for a, b, _ in demand.pair_bytes:
        if not cluster.can_join(a, b):
            return True
        degree[a] = degree.get(a, 0) + 1
        degree[b] = degree.get(b, 0) + 1
    return any(
        pods[p].uplink_ports < n and not pods[p].electrical_gbps > 0 for p, n in degree.items()
    )


def _ports_short(
    cluster: Cluster, job: Job, units: Sequence[Unit], ports: Mapping[str, int]
) -> bool:
    """Some pod of the layout has fewer free uplinks than the job's circuits need there
    (the allocation's per-pair circuits at NIC rate, `JobDemand.pair_ports`)."""
    demand = job_demand(cluster, job, Placement(job.job_id, tuple(units)))
    need: dict[str, int] = {}
    for a, b, circuits in demand.pair_ports:
        need[a] = need.get(a, 0) + circuits
        need[b] = need.get(b, 0) + circuits
    return any(ports.get(pod, 0) < n for pod, n in need.items())


# --- step 1: slots -------------------------------------------------------------------


def _choose_slots(
    cluster: Cluster,
    free: Set[str],
    job: Job,
    agg: Mapping[str, float],
    ports: Mapping[str, int],
) -> list[_Slot] | None:
    """EP-group slots for the job: fewest pods, best-fit pods, then ToRs inside each pod.

    A pod holds free_servers // ep groups: groups go under one ToR while a ToR
    of the pod has room, and span ToRs of that pod only when none has (never
    pods). Choosing the pod by its free servers rather than by whole-ToR room is
    what lets ToR remainders (7 and 3 on 15-server ToRs) be used.
    """
    ep = job.parallelism.ep
    need = job.parallelism.dp * job.parallelism.pp
    free_by_tor, pod_free = _free_servers(cluster, free)
    pod_cap = {p: n // ep for p, n in pod_free.items()}
    if sum(pod_cap.values()) < need:
        return None
    slots: list[_Slot] = []
    inc = job.collective is Collective.INC
    inc_group = job.parallelism.dp if inc else None
    for pod, take in _pick_pods(
        cluster, free_by_tor, pod_cap, pod_free, need, ep, ports, agg, inc_group
    ):
        slots.extend(_slots_in_pod(pod, free_by_tor, take, ep, agg, inc))
    assert len(slots) == need, "slot accounting is broken"
    return slots


_IDS: IdentityMemo[tuple[tuple[str, tuple[tuple[str, tuple[str, ...]], ...]], ...]]
_IDS = IdentityMemo(8)


def _server_ids(
    cluster: Cluster,
) -> tuple[tuple[str, tuple[tuple[str, tuple[str, ...]], ...]], ...]:
    """(pod id, ((ToR id, server ids), ...)) in fabric order, memoised per cluster."""
    return _IDS.get(
        (cluster,),
        lambda: tuple(
            (p.id, tuple((t.id, tuple(s.id for s in t.servers)) for t in p.tors))
            for p in cluster.pods
        ),
    )


def _free_servers(
    cluster: Cluster, free: Set[str], visit_free: bool | None = None
) -> tuple[dict[str, list[str]], dict[str, int]]:
    """Free server ids per ToR in fabric order, and free servers per pod.

    With few free servers (a busy cluster; `visit_free` None decides by count) it
    visits them rather than the whole fabric: the same answer either way.
    """
    free_by_tor: dict[str, list[str]] = {}
    pod_free: dict[str, int] = {}
    if visit_free is None:
        visit_free = len(free) * 4 < cluster.server_count
    found: dict[str, list[tuple[int, str]]] = {}
    if visit_free:
        position = cluster.server_position
        for s in free:
            if cluster.has_server(s):
                found.setdefault(cluster.server(s).tor_id, []).append((position[s], s))
    for pod_id, tors in _server_ids(cluster):
        count = 0
        for tor_id, ids in tors:
            if visit_free:
                here = [s for _, s in sorted(found.get(tor_id, ()))]
            else:
                here = [s for s in ids if s in free]
            free_by_tor[tor_id] = here
            count += len(here)
        pod_free[pod_id] = count
    return free_by_tor, pod_free


def _slots_in_pod(
    pod: Pod,
    free_by_tor: Mapping[str, list[str]],
    groups: int,
    ep: int,
    agg: Mapping[str, float],
    inc: bool = False,
) -> list[_Slot]:
    """`groups` EP groups in one pod: under one ToR each while a ToR has room, then spanning.

    ToRs are taken smallest first until one holds the rest (best fit), so scraps
    are used and whole ToRs stay whole; ties go to the idlest aggregator. A job
    that forces INC (`inc`) puts the rest under a ToR whose aggregator has
    capacity left where one holds it (under a full one INC falls back to ring).
    Groups no ToR holds take the leftovers, largest first (fewest ToRs per group).
    """
    capacities = [(t, len(free_by_tor[t.id]) // ep) for t in pod.tors]
    if sum(cap for _, cap in capacities) >= groups:
        tors = _pick(
            capacities,
            groups,
            tail_key=lambda t, cap: (len(free_by_tor[t.id]), -agg.get(t.id, t.aggregator_gbps)),
            largest_first=False,
            prefer=(lambda t: agg.get(t.id, t.aggregator_gbps) > 0) if inc else None,
        )
    else:  # no ToR holds the rest: every whole group first, the others span
        tors = [(t, cap) for t, cap in capacities if cap > 0]
    slots: list[_Slot] = []
    used: dict[str, int] = {}
    for tor, k in tors:
        slots.extend(_slots_in(tor, free_by_tor[tor.id], k, ep))
        used[tor.id] = k * ep
    if len(slots) < groups:
        leftovers = [
            s
            for t in sorted(pod.tors, key=lambda t: -(len(free_by_tor[t.id]) - used.get(t.id, 0)))
            for s in free_by_tor[t.id][used.get(t.id, 0) :]
        ]
        for k in range(groups - len(slots)):
            slots.append(_Slot(tuple(leftovers[k * ep : (k + 1) * ep]), "", pod.id))
    return slots


# EP widths common enough that a pod's leftover free servers should divide by them
_COMMON_EP = (2, 4, 8)


def _waste(left: int) -> int:
    """Servers a pod's leftover would strand, summed over the common EP widths.

    Look-ahead for later EP jobs: a leftover of 8 strands none, one of 11 (a
    64-server job on a 75-server pod) strands 1 + 3 + 3, one of 3 strands 1 + 3 + 3.
    """
    return sum(left % width for width in _COMMON_EP)


def _pick_pods(
    cluster: Cluster,
    free_by_tor: Mapping[str, list[str]],
    pod_cap: Mapping[str, int],
    pod_free: Mapping[str, int],
    need: int,
    ep: int,
    ports: Mapping[str, int],
    agg: Mapping[str, float],
    inc_group: int | None = None,
) -> list[tuple[Pod, int]]:
    """Pods and how many groups each takes: one pod if any holds the job, else fewest.

    `inc_group`: the job forces INC and a DP group is that many EP groups; of
    the pods that hold the job, those with a ToR that holds a DP group under an
    aggregator with capacity left come first, then those whose spine
    aggregator has capacity left (a group under a full ToR aggregator goes
    into its spine), when there are any.

    Inside one pod: the pod whose leftover strands fewest servers for later EP
    groups (`_waste`), then best fit (fewest free servers: emptier pods stay
    whole for big jobs), then one where every group fits under a ToR, then
    fewest free uplinks (the job needs none), then the idlest aggregator.
    Across pods: the largest first (fewest pods), ties to pods with free
    uplinks (the job's circuits need ports on every pod it spans); the tail
    on a pod with free uplinks if one holds it, best fit among those.
    """
    pool = [p for p in cluster.pods if pod_cap[p.id] > 0]
    fitting = [p for p in pool if pod_cap[p.id] >= need]
    if fitting and inc_group is not None:

        def tor_holds_group(p: Pod, free_aggregator: bool) -> bool:
            return any(
                len(free_by_tor[t.id]) // ep >= inc_group
                and (not free_aggregator or agg.get(t.id, t.aggregator_gbps) > 0)
                for t in p.tors
            )

        def spine_free(p: Pod) -> bool:
            return agg.get(p.id, p.aggregator_gbps) > 0

        # a ToR aggregator with room; else a group under a ToR whose full aggregator
        # sends it into an idle spine; else any idle spine
        fitting = (
            [p for p in fitting if tor_holds_group(p, free_aggregator=True)]
            or [p for p in fitting if tor_holds_group(p, free_aggregator=False) and spine_free(p)]
            or [p for p in fitting if spine_free(p)]
            or fitting
        )
    if fitting:

        def spans(p: Pod) -> bool:
            return sum(len(free_by_tor[t.id]) // ep for t in p.tors) < need

        def idlest_aggregator(p: Pod) -> float:
            return max(agg.get(t.id, t.aggregator_gbps) for t in p.tors)

        best = min(
            fitting,
            key=lambda p: (
                _waste(pod_free[p.id] - need * ep),
                pod_free[p.id],
                spans(p),
                ports[p.id],
                -idlest_aggregator(p),
                p.id,
            ),
        )
        return [(best, need)]

    def uplinks(p: Pod) -> int:
        return 0 if ports[p.id] > 0 else 1

    joined = cluster.joined_pod_sets
    if len(joined) > 1:
        # pods every two of which can be joined only (a fabric whose OXCs are not each
        # wired to every pod): the set that holds the job in the fewest pods, then the
        # fullest; when none holds it, its layout crosses sets and it waits
        def cost(pods: list[Pod]) -> tuple[int, int]:
            caps = sorted((pod_cap[p.id] for p in pods), reverse=True)
            held = n = 0
            while held < need and n < len(caps):
                held, n = held + caps[n], n + 1
            return (n if held >= need else len(cluster.pods) + 1, sum(caps))

        within = min(([p for p in pool if p.id in s] for s in joined), key=cost)
        if cost(within)[0] <= len(cluster.pods):
            pool = within
    pool.sort(key=lambda p: (-pod_cap[p.id], uplinks(p), -ports[p.id], p.id))
    chosen: list[tuple[Pod, int]] = []
    remaining = need
    while remaining > 0:
        tail = [p for p in pool if pod_cap[p.id] >= remaining]
        if tail:
            pod = min(
                tail,
                key=lambda p: (
                    uplinks(p),
                    pod_cap[p.id],
                    pod_free[p.id] - remaining * ep,
                    -ports[p.id],
                    p.id,
                ),
            )
            chosen.append((pod, remaining))
            return chosen
        pod = pool.pop(0)
        chosen.append((pod, pod_cap[pod.id]))
        remaining -= pod_cap[pod.id]
    return chosen


def _pick(
    capacities: Sequence[tuple[_C, int]],
    need: int,
    tail_key: Callable[[_C, int], tuple[object, ...]],
    *,
    largest_first: bool,
    prefer: Callable[[_C], bool] | None = None,
) -> list[tuple[_C, int]]:
    """Containers and how many groups each takes; best-fit for the tail.

    Until one container holds the remainder, whole containers are taken: the
    largest first for pods (fewest pods, fewest circuits), the smallest first for
    ToRs (a pod is non-blocking, so using scraps costs nothing there and keeps
    whole ToRs for wide EP groups later). The remainder goes into the smallest
    container that holds it, so whole containers stay whole; among those that
    hold it, `prefer`red ones first when there are any.
    """
    sign = -1 if largest_first else 1
    pool = sorted((c for c in capacities if c[1] > 0), key=lambda c: sign * c[1])
    chosen: list[tuple[_C, int]] = []
    remaining = need
    while remaining > 0:
        fitting = [c for c in pool if c[1] >= remaining]
        if fitting and prefer is not None:
            fitting = [c for c in fitting if prefer(c[0])] or fitting
        if fitting:
            item = min(fitting, key=lambda c: (c[1],) + tail_key(c[0], c[1]))
            chosen.append((item[0], remaining))
            return chosen
        item = pool.pop(0)
        chosen.append(item)
        remaining -= item[1]
    return chosen


def _slots_in(tor: Tor, free_ids: list[str], groups: int, ep: int) -> list[_Slot]:
    return [
        _Slot(tuple(free_ids[i * ep : (i + 1) * ep]), tor.id, tor.pod_id) for i in range(groups)
    ]


# --- step 2: layouts -----------------------------------------------------------------


def _candidate_orders(job: Job, slots: Sequence[_Slot]) -> list[tuple[str, list[tuple[int, int]]]]:
    """Candidate maps from slot index to EP group (stage, dp_rank)."""
    par = job.parallelism
    stage_major = [(s, d) for s in range(par.pp) for d in range(par.dp)]
    if par.pp == 1 or par.dp == 1:
        return [("compact", stage_major)]
    dp_major = [(s, d) for d in range(par.dp) for s in range(par.pp)]
    # Pod-blocked: whole pipelines per pod (PP stays inside pods), and inside each
    # pod a stage's replicas side by side (DP rides on ToRs and pod switches).
    blocked: list[tuple[int, int]] = []
    start = 0
    while start < len(slots):
        end = start
        while end < len(slots) and slots[end].pod_id == slots[start].pod_id:
            end += 1
        blocked.extend(sorted(dp_major[start:end]))
        start = end
    candidates = [("dp-together", stage_major), ("pipelines-together", dp_major)]
    if blocked not in (stage_major, dp_major):  # one pod: blocked is dp-together
        candidates.append(("pipelines-per-pod", blocked))
    if job.collective in (Collective.AUTO, Collective.INC):
        per_tor = _dp_groups_per_switch(par.pp, par.dp, slots)
        if per_tor is not None and per_tor not in (stage_major, dp_major, blocked):
            candidates.append(("dp-per-tor", per_tor))
    return candidates


def _dp_groups_per_switch(pp: int, dp: int, slots: Sequence[_Slot]) -> list[tuple[int, int]] | None:
    """Each stage's DP group under one ToR where one has room, else one pod (for INC).

    Best fit: a group goes to the ToR (then pod) with the fewest free slots that
    still hold it, so aggregation load spreads over switches instead of
    straddling them. None when some group fits no single pod.
    """
    by_switch: dict[str, list[int]] = {}
    for i, slot in enumerate(slots):
        by_switch.setdefault(slot.tor_id or slot.pod_id, []).append(i)
    order: list[tuple[int, int] | None] = [None] * len(slots)
    for stage in range(pp):
        fit = [k for k, v in by_switch.items() if len(v) >= dp]
        if fit:
            key = min(fit, key=lambda k: (len(by_switch[k]), k))
            take = by_switch[key][:dp]
            by_switch[key] = by_switch[key][dp:]
        else:
            pods: dict[str, list[str]] = {}
            for k, v in by_switch.items():
                if v:
                    pods.setdefault(slots[v[0]].pod_id, []).append(k)
            room = {p: sum(len(by_switch[k]) for k in ks) for p, ks in pods.items()}
            fitting = [p for p, n in room.items() if n >= dp]
            if not fitting:
                return None
            pod = min(fitting, key=lambda p: (room[p], p))
            take = []
            for k in sorted(pods[pod], key=lambda k: -len(by_switch[k])):
                n = min(dp - len(take), len(by_switch[k]))
                take += by_switch[k][:n]
                by_switch[k] = by_switch[k][n:]
        for d, i in enumerate(take):
            order[i] = (stage, d)
    if any(o is None for o in order):
        return None
    return [o for o in order if o is not None]


def _straddling(tor_of: Mapping[str, str], units: Sequence[Unit]) -> int:
    """DP groups (stage, ep_rank) whose members sit under more than one ToR."""
    tors: dict[tuple[int, int], set[str]] = {}
    for u in units:
        tors.setdefault((u.stage, u.ep_rank), set()).add(tor_of[u.server])
    return sum(1 for t in tors.values() if len(t) > 1)


def _units(order: Sequence[tuple[int, int]], slots: Sequence[_Slot]) -> list[Unit]:
    return [
        Unit(server, stage, dp, e)
        for (stage, dp), slot in zip(order, slots, strict=True)
        for e, server in enumerate(slot.servers)
    ]


# --- step 2: the communication-time estimate ----------------------------------------


def _ledger(cluster: Cluster, agg: Mapping[str, float]) -> AggregatorLedger:
    """Aggregator capacity other jobs hold (ToRs', and pods' for their spines), as the
    collective engine's ledger."""
    grants = []
    for switch, free_gbps in sorted(agg.items()):
        if switch not in cluster.tors_by_id and switch not in cluster.pods_by_id:
            continue
        capacity = aggregator_capacity(cluster, switch)
        if free_gbps < capacity:
            grants.append(AggregatorGrant(switch, _OTHERS, capacity - free_gbps))
    return AggregatorLedger(tuple(grants))


def _estimate(
    cluster: Cluster,
    job: Job,
    units: Sequence[Unit],
    name: str,
    ledger: AggregatorLedger,
    ports: Mapping[str, int],
    pod_of: Mapping[str, str],
) -> LayoutEstimate:
    """DP phase by `collective.estimate_costs`, PP phase by `_pp_phase_s`."""
    par = job.parallelism
    share = _uplink_share_gbps(cluster, pod_of, ports)
    by_key = {(u.stage, u.dp_rank, u.ep_rank): u.server for u in units}
    pipelines = [
        [by_key[(s, d, e)] for s in range(par.pp)] for d in range(par.dp) for e in range(par.ep)
    ]
    facts = resolve_facts(job)
    pp_s = _pp_phase_s(
        cluster, pod_of, share, pipelines, facts.activation_bytes, facts.microbatches
    )
    if par.dp == 1:
        return LayoutEstimate(name, "none", 0.0, pp_s)
    placement = Placement(job.job_id, tuple(units))
    costs, _ = estimate_costs(cluster, job, placement, ledger, _pod_pair_gbps(share))
    if job.collective is Collective.AUTO:
        algorithm = min(costs, key=lambda a: (costs[a], a))
    elif job.collective is Collective.INC and not math.isfinite(costs[ALGO_INC]):
        algorithm = min((ALGO_RING, ALGO_TREE), key=lambda a: costs[a])  # as choose_collective
    else:
        algorithm = job.collective
    return LayoutEstimate(name, algorithm, costs[algorithm], pp_s)


def _uplink_share_gbps(
    cluster: Cluster, pod_of: Mapping[str, str], ports: Mapping[str, int]
) -> dict[str, float]:
    """The circuits the job would really get on each pod: the free uplinks, at most
    what makes its servers there non-blocking (servers x NICs), at least one port
    (the allocator serves every job, by turns if need be).

    The DP and PP phases are rewired separately (SPEC section 3), so each phase
    gets the whole share.
    """
    count: dict[str, int] = {}
    for pod_id in pod_of.values():
        count[pod_id] = count.get(pod_id, 0) + 1
    per_server = max(1, round(cluster.server_gbps / cluster.nic_gbps))
    out = {}
    for pod_id, n in count.items():
        got = min(ports.get(pod_id, 0), n * per_server)
        out[pod_id] = max(1, got) * cluster.nic_gbps
    return out


def _pod_pair_gbps(share: Mapping[str, float]) -> dict[tuple[str, str], float]:
    """Circuit Gb/s per pod pair: each pod's share split evenly over the pods it meets."""
    pods = sorted(share)
    if len(pods) < 2:
        return {}
    peers = len(pods) - 1
    return {
        (p, q): min(share[p], share[q]) / peers for i, p in enumerate(pods) for q in pods[i + 1 :]
    }


def _pp_phase_s(
    cluster: Cluster,
    pod_of: Mapping[str, str],
    share: Mapping[str, float],
    pipelines: Sequence[Sequence[str]],
    act_bytes: float,
    microbatches: int,
) -> float:
    """GPipe sends: each micro-batch's activations forward and gradients back.

    The critical path crosses (m + pp - 2) transfers each way on the slowest
    edge; an edge inside a pod runs at the server's rate (1:1 Clos), one across
    pods at the pod's uplink share over the job's edges leaving that pod.
    """
    if not pipelines or len(pipelines[0]) <= 1:
        return 0.0
    leaving: dict[str, int] = {}
    for chain in pipelines:
        for a, b in zip(chain, chain[1:], strict=False):
            if pod_of[a] != pod_of[b]:
                leaving[pod_of[a]] = leaving.get(pod_of[a], 0) + 1
    gbps = cluster.server_gbps
    for pod_id, n in leaving.items():
        gbps = min(gbps, share[pod_id] / n)
    hops = microbatches + len(pipelines[0]) - 2
    return 2 * hops * (ALPHA_RING_S + act_bytes / (gbps * 1e9 / 8))


def _reason(best: LayoutEstimate, all_: Sequence[LayoutEstimate], pods: int, tors: int) -> str:
    others = "; ".join(
        f"{e.name} {e.total_s * 1e3:.2f} ms ({e.algorithm})" for e in all_ if e is not best
    )
    text = (
        f"layout {best.name}: est. {best.total_s * 1e3:.2f} ms comm/iteration "
        f"(DP {best.algorithm} {best.dp_s * 1e3:.2f} ms + PP {best.pp_s * 1e3:.2f} ms); "
        f"{pods} pod(s), {tors} ToR(s), best-fit slots"
    )
    return f"{text}; vs {others}" if others else text

"""Placement of a job's parallel units on servers: `place_job` is the one entry point.

Pure functions over `Cluster` and the set of free servers; this module must not
import anything that does I/O (no FastAPI, SQLAlchemy, Redis, pydantic), read a
clock or use unseeded randomness.

A job with degrees (ep, dp, pp) is dp*pp EP groups of ep servers; a unit is
(stage, dp_rank, ep_rank) on one server. Placement runs in two steps:

1. Slots (fragmentation): pick ToRs that hold whole EP groups, fewest pods and
   ToRs first, best-fit for the tail, so partly used ToRs and pods are filled
   before whole ones are broken up. Free servers stay in large blocks and a big
   job still finds whole pods later; a job waits only when the cluster has too
   few ToR-whole EP slots in total.
2. Layout (communication): map the groups onto those slots in a few candidate
   orders (a stage's DP replicas together, whole pipelines together, or DP ranks
   blocked by pod) and keep the one with the lowest estimated iteration
   communication time over the DP collectives (INC, ring, double binary tree,
   hierarchical ring) and the pipeline sends. `Placement.reason` records the
   estimates, so operators can see why.

The cost estimate is private and follows SPEC section 4 item 2: the topology
engine's `collective.py` was not committed when this was written. Swap in its
functions when it lands; only `_dp_phase_s` and `_pp_phase_s` need to change.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass
from typing import TypeVar

from .cluster import Cluster, Pod, Tor
from .job import Collective, Job, Placement, Unit, Unplaceable

NEVER_TOO_MANY_SERVERS = "needs more servers than the cluster has"
NEVER_EP_WIDER_THAN_TOR = "an EP group needs more servers than any ToR holds"
NEVER_TOO_MANY_EP_GROUPS = "the cluster's ToRs cannot hold that many EP groups at once"
NOT_NOW_BUSY = "not enough free servers in whole-ToR EP groups right now"

# Per-hop latency: NCCL 2.30.7 tuning model, NET / Ring / Simple protocol hwLatency
# (shared/data/tables/nccl_tuning_constants_v2.30.7.csv), 14 us.
ALPHA_S = 14e-6
# When the launcher gave no model facts the layouts are still compared, on nominal
# volumes that keep the SPEC's ordering DP > PP: 1 GiB of gradients per server per
# iteration against 8 micro-batches of 32 MiB of activations.
_NOMINAL_DP_BYTES = float(1 << 30)
_NOMINAL_ACTIVATION_BYTES = float(32 << 20)
_NOMINAL_MICROBATCHES = 8

_C = TypeVar("_C", Pod, Tor)


@dataclass(frozen=True, slots=True)
class _Slot:
    """Room for one EP group: `ep` free servers under one ToR."""

    servers: tuple[str, ...]
    tor_id: str
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
    widest = max((len(t.servers) for p in cluster.pods for t in p.tors), default=0)
    if par.ep > widest:
        reasons.append(f"{NEVER_EP_WIDER_THAN_TOR}: ep={par.ep} > {widest}")
    elif par.dp * par.pp > sum(len(t.servers) // par.ep for p in cluster.pods for t in p.tors):
        reasons.append(NEVER_TOO_MANY_EP_GROUPS)
    return tuple(reasons)


def place_job(
    cluster: Cluster,
    free: Set[str],
    job: Job,
    *,
    aggregator_free_gbps: Mapping[str, float] | None = None,
) -> Placement | Unplaceable:
    """Place every unit of `job` on distinct servers from `free`, or say why not.

    `aggregator_free_gbps` maps ToR id to the INC capacity other jobs leave free
    (default: every ToR's full `aggregator_gbps`); it steers ties toward idle
    aggregators and feeds the INC estimate.
    """
    reasons = never_fits(cluster, job)
    if reasons:
        return Unplaceable(job.job_id, reasons, never_fits=True)
    agg = aggregator_free_gbps or {}
    slots = _choose_slots(cluster, free, job, agg)
    if slots is None:
        return Unplaceable(job.job_id, (NOT_NOW_BUSY,))
    best: tuple[LayoutEstimate, list[Unit]] | None = None
    estimates = []
    for name, order in _candidate_orders(job, slots):
        units = _units(order, slots)
        estimate = _estimate(cluster, job, units, name, agg)
        estimates.append(estimate)
        if best is None or estimate.total_s < best[0].total_s:
            best = (estimate, units)
    assert best is not None  # there is always at least one candidate order
    pods = len({s.pod_id for s in slots})
    tors = len({s.tor_id for s in slots})
    reason = _reason(best[0], estimates, pods, tors)
    return Placement(job.job_id, tuple(best[1]), reason=reason)


# --- step 1: slots -------------------------------------------------------------------


def _choose_slots(
    cluster: Cluster, free: Set[str], job: Job, agg: Mapping[str, float]
) -> list[_Slot] | None:
    """EP-group slots for the job: fewest pods, then fewest ToRs, best-fit at the tail."""
    ep = job.parallelism.ep
    need = job.parallelism.dp * job.parallelism.pp
    free_by_tor: dict[str, list[str]] = {}
    pod_cap: dict[str, int] = {}
    pod_free: dict[str, int] = {}
    for pod in cluster.pods:
        cap = count = 0
        for tor in pod.tors:
            ids = [s.id for s in tor.servers if s.id in free]
            free_by_tor[tor.id] = ids
            cap += len(ids) // ep
            count += len(ids)
        pod_cap[pod.id] = cap
        pod_free[pod.id] = count
    if sum(pod_cap.values()) < need:
        return None
    if need * ep <= max(len(t.servers) for p in cluster.pods for t in p.tors):
        single = _best_single_tor(cluster, free_by_tor, pod_free, need, ep, agg)
        if single is not None:
            return _slots_in(single, free_by_tor[single.id], need, ep)
    pods = _pick(
        [(p, pod_cap[p.id]) for p in cluster.pods],
        need,
        # Tail tie-break: leave the least free servers behind in that pod.
        tail_key=lambda p, cap: (pod_free[p.id] - need * ep, p.id),
    )
    slots: list[_Slot] = []
    remaining = need
    for pod, take in pods:
        tors = _pick(
            [(t, len(free_by_tor[t.id]) // ep) for t in pod.tors],
            take,
            tail_key=lambda t, cap: (len(free_by_tor[t.id]), -agg.get(t.id, t.aggregator_gbps)),
        )
        for tor, k in tors:
            slots.extend(_slots_in(tor, free_by_tor[tor.id], k, ep))
        remaining -= take
    assert remaining == 0, "slot accounting is broken"
    return slots


def _best_single_tor(
    cluster: Cluster,
    free_by_tor: Mapping[str, list[str]],
    pod_free: Mapping[str, int],
    need: int,
    ep: int,
    agg: Mapping[str, float],
) -> Tor | None:
    """The ToR that fits the whole job leaving the fewest free servers behind.

    Ties go to the fullest pod (empty pods stay whole for big jobs), then to the
    idlest aggregator (balances INC load), then to fabric order.
    """
    best: Tor | None = None
    best_key: tuple[float, ...] = ()
    for pod in cluster.pods:
        for tor in pod.tors:
            n = len(free_by_tor[tor.id])
            if n // ep < need:
                continue
            key = (n - need * ep, pod_free[pod.id], -agg.get(tor.id, tor.aggregator_gbps))
            if best is None or key < best_key:
                best, best_key = tor, key
    return best


def _pick(
    capacities: Sequence[tuple[_C, int]],
    need: int,
    tail_key: Callable[[_C, int], tuple[object, ...]],
) -> list[tuple[_C, int]]:
    """Containers and how many groups each takes: largest first, best-fit for the tail.

    Taking the largest containers whole touches the fewest of them (fewest pods:
    fewest circuits; fewest ToRs: fewest aggregators); the remainder goes into the
    smallest container that still holds it, so fragments are consumed first and
    whole containers stay whole.
    """
    pool = sorted((c for c in capacities if c[1] > 0), key=lambda c: -c[1])
    chosen: list[tuple[_C, int]] = []
    remaining = need
    while remaining > 0:
        fitting = [c for c in pool if c[1] >= remaining]
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
    return candidates


def _units(order: Sequence[tuple[int, int]], slots: Sequence[_Slot]) -> list[Unit]:
    return [
        Unit(server, stage, dp, e)
        for (stage, dp), slot in zip(order, slots, strict=True)
        for e, server in enumerate(slot.servers)
    ]


# --- step 2: the private communication-time estimate ---------------------------------


def _estimate(
    cluster: Cluster, job: Job, units: Sequence[Unit], name: str, agg: Mapping[str, float]
) -> LayoutEstimate:
    par = job.parallelism
    model = job.model
    params = model.parameters if model and model.parameters else None
    bpp = model.bytes_per_parameter if model and model.bytes_per_parameter else 2.0
    # Per server: its stage's share of the gradients (TP splits inside the server,
    # EP ranks hold different experts; dense layers are counted once, a small
    # underestimate for MoE that is the same for every layout).
    dp_bytes = params * bpp / (par.pp * par.ep) if params else _NOMINAL_DP_BYTES
    act = model.activation_bytes if model and model.activation_bytes else None
    mbs = model.microbatches if model and model.microbatches else None
    where = {u.server: cluster.server(u.server) for u in units}
    job_in_pod: dict[str, int] = {}
    job_in_tor: dict[str, int] = {}
    for srv in where.values():
        job_in_pod[srv.pod_id] = job_in_pod.get(srv.pod_id, 0) + 1
        job_in_tor[srv.tor_id] = job_in_tor.get(srv.tor_id, 0) + 1
    # vClos-style isolation: a job gets the share of each pod's uplinks that its
    # servers hold of the pod. Phases are rewired separately (SPEC section 3), so
    # the DP and PP phases each get the whole share.
    cross_bps = {
        pod_id: cluster.pods_by_id[pod_id].uplink_ports
        * n
        / len(cluster.pods_by_id[pod_id].servers)
        * cluster.nic_gbps
        * 1e9
        / 8
        for pod_id, n in job_in_pod.items()
    }
    ctx = _Ctx(
        server_bps=cluster.server_gbps * 1e9 / 8,
        pod_of={s: v.pod_id for s, v in where.items()},
        tor_of={s: v.tor_id for s, v in where.items()},
        cross_bps=cross_bps,
        agg_bps={
            t: agg.get(t, cluster.tors_by_id[t].aggregator_gbps) * 1e9 / 8 for t in job_in_tor
        },
        job_in_tor=job_in_tor,
    )
    by_key = {(u.stage, u.dp_rank, u.ep_rank): u.server for u in units}
    dp_groups = [
        [by_key[(s, d, e)] for d in range(par.dp)] for s in range(par.pp) for e in range(par.ep)
    ]
    pipelines = [
        [by_key[(s, d, e)] for s in range(par.pp)] for d in range(par.dp) for e in range(par.ep)
    ]
    algorithm, dp_s = _dp_phase_s(ctx, dp_groups, dp_bytes, job.collective)
    if act is None and mbs is None and params is None:
        act, mbs = _NOMINAL_ACTIVATION_BYTES, _NOMINAL_MICROBATCHES
    pp_s = _pp_phase_s(ctx, pipelines, act or _NOMINAL_ACTIVATION_BYTES, mbs or 1)
    return LayoutEstimate(name, algorithm, dp_s, pp_s)


@dataclass(frozen=True, slots=True)
class _Ctx:
    server_bps: float
    pod_of: Mapping[str, str]
    tor_of: Mapping[str, str]
    cross_bps: Mapping[str, float]  # the job's uplink share per pod, bytes/s
    agg_bps: Mapping[str, float]  # free aggregator input per ToR, bytes/s
    job_in_tor: Mapping[str, int]


def _ring_s(size: float, n: int, bps: float) -> float:
    """SPEC ring: T = (N-1) * (2*alpha + 2*S/(N*B)), reduction compute left out (C=0)."""
    return 0.0 if n <= 1 else (n - 1) * (2 * ALPHA_S + 2 * size / (n * bps))


def _tree_s(size: float, n: int, bps: float) -> float:
    """SPEC double binary tree bound: 4*a*log2 N + 2*S/B + 2*sqrt(8*log2 N*a*S/B)."""
    if n <= 1:
        return 0.0
    log_n = math.log2(n)
    return 4 * ALPHA_S * log_n + 2 * size / bps + 2 * math.sqrt(8 * log_n * ALPHA_S * size / bps)


def _cross_edges(ctx: _Ctx, chains: Sequence[Sequence[str]], cyclic: bool) -> dict[str, int]:
    """How many chain edges leave each pod: they share that pod's uplink share."""
    out: dict[str, int] = {}
    for chain in chains:
        n = len(chain)
        for i in range(n if cyclic and n > 1 else n - 1):
            a, b = ctx.pod_of[chain[i]], ctx.pod_of[chain[(i + 1) % n]]
            if a != b:
                out[a] = out.get(a, 0) + 1
    return out


def _chain_bps(ctx: _Ctx, chain: Sequence[str], out: Mapping[str, int], cyclic: bool) -> float:
    """The slowest edge of a ring or path: full server rate inside a pod (1:1 Clos)."""
    bps = ctx.server_bps
    n = len(chain)
    for i in range(n if cyclic and n > 1 else n - 1):
        a, b = ctx.pod_of[chain[i]], ctx.pod_of[chain[(i + 1) % n]]
        if a != b:
            bps = min(bps, ctx.cross_bps[a] / out[a])
    return bps


def _dp_phase_s(
    ctx: _Ctx, groups: Sequence[Sequence[str]], size: float, forced: Collective
) -> tuple[str, float]:
    """Best (algorithm, seconds) for all DP groups reducing at once."""
    if all(len(g) <= 1 for g in groups):
        return ("none", 0.0)
    out = _cross_edges(ctx, groups, cyclic=True)
    ring = tree = 0.0
    for g in groups:
        bps = _chain_bps(ctx, g, out, cyclic=True)
        ring = max(ring, _ring_s(size, len(g), bps))
        tree = max(tree, _tree_s(size, len(g), bps))
    times = {
        Collective.RING: ring,
        Collective.TREE: tree,
        Collective.HIERARCHICAL_RING: _hierarchical_s(ctx, groups, size),
        Collective.INC: _inc_s(ctx, groups, size),
    }
    if forced is not Collective.AUTO:
        return (forced.value, times[forced])
    algorithm = min(times, key=lambda a: times[a])
    return (algorithm.value, times[algorithm])


def _hierarchical_s(ctx: _Ctx, groups: Sequence[Sequence[str]], size: float) -> float:
    """Ring inside each pod, then a ring across pods per local rank on S/n_local."""
    worst = 0.0
    leaving: dict[str, int] = {}
    split = []
    for g in groups:
        per_pod: dict[str, int] = {}
        for s in g:
            per_pod[ctx.pod_of[s]] = per_pod.get(ctx.pod_of[s], 0) + 1
        split.append(per_pod)
        if len(per_pod) > 1:
            for pod_id, n in per_pod.items():
                leaving[pod_id] = leaving.get(pod_id, 0) + n
    for per_pod in split:
        local = max(per_pod.values())
        t = _ring_s(size, local, ctx.server_bps)
        if len(per_pod) > 1:
            bps = min([ctx.server_bps] + [ctx.cross_bps[p] / leaving[p] for p in per_pod])
            t += _ring_s(size / local, len(per_pod), bps)
        worst = max(worst, t)
    return worst


def _inc_s(ctx: _Ctx, groups: Sequence[Sequence[str]], size: float) -> float:
    """Aggregation on ToR switches, a second level at the group's busiest ToR.

    Every server sends S once and receives S once through its ToR aggregator; the
    aggregator's input is shared by all the job's servers under it (they reduce
    at the same time). A group spread over ToRs sends one partial per ToR to a
    root ToR (across pods over the job's uplink share).
    """
    if any(ctx.agg_bps[t] <= 0 for t in ctx.job_in_tor):
        return math.inf
    worst = 0.0
    for g in groups:
        tors: dict[str, int] = {}
        for s in g:
            tors[ctx.tor_of[s]] = tors.get(ctx.tor_of[s], 0) + 1
        level1 = max(size / min(ctx.server_bps, ctx.agg_bps[t] / ctx.job_in_tor[t]) for t in tors)
        t_total = 2 * ALPHA_S + level1
        if len(tors) > 1:
            root = max(tors, key=lambda t: (tors[t], t))
            root_pod = ctx.pod_of[next(s for s in g if ctx.tor_of[s] == root)]
            bps = min(ctx.server_bps, ctx.agg_bps[root] / (len(tors) * len(groups)))
            for s in g:
                pod = ctx.pod_of[s]
                if pod != root_pod:
                    bps = min(bps, ctx.cross_bps[pod] / len(groups))
            t_total += 2 * ALPHA_S + size / bps
        worst = max(worst, t_total)
    return worst


def _pp_phase_s(
    ctx: _Ctx, pipelines: Sequence[Sequence[str]], act_bytes: float, microbatches: int
) -> float:
    """GPipe sends: each micro-batch's activations forward and gradients back.

    The critical path crosses (m + pp - 2) transfers each way on the slowest edge.
    """
    if not pipelines or len(pipelines[0]) <= 1:
        return 0.0
    out = _cross_edges(ctx, pipelines, cyclic=False)
    bps = min(_chain_bps(ctx, p, out, cyclic=False) for p in pipelines)
    hops = microbatches + len(pipelines[0]) - 2
    return 2 * hops * (ALPHA_S + act_bytes / bps)


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

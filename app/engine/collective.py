"""Collective algorithm choice for DP AllReduce: cost models and in-network aggregators.

Pure functions; must not import anything that does I/O (no FastAPI, SQLAlchemy,
Redis, pydantic) or read a clock. `choose_collective` is the entry point.

Cost models (SPEC section 4 item 2), T in seconds, S bytes per member, N members,
B member bandwidth in bytes/s, alpha per-hop latency in s, C reduction s/byte:

- ring: T = (N-1) * (2*alpha + 2*S/(N*B) + S*C/N)
- double binary tree: T = 4*alpha*log2(N) + 2*S/B + 2*sqrt(8*log2(N)*alpha*S/B)
  + (sqrt(2*log2(N)*alpha*S) + S) * C   (the SPEC's upper bound, used as the cost)
- hierarchical ring: ring(n, S, B_in) inside each group of n, then
  ring(G, S/n_min, B_x) across the G groups on each member's shard
- INC: T = 2*levels*alpha_inc + S/B_inc: each worker sends S once and receives
  S once (full duplex, pipelined) through the aggregator; B_inc is the
  aggregator share per input stream, at most the member's NIC bandwidth.

Aggregators, two levels as the design notes model them ("在网聚合可以分双层来做"):
a ToR aggregator combines the members under it; when a DP group spans ToRs,
each ToR's partial goes to its pod's spine aggregator (`Pod.aggregator_gbps`),
and when it spans pods, every other pod's spine partial goes over one circuit
to the root pod's spine (one stream per pod each way: fewer circuits and
bytes than a ring). Members under a ToR whose aggregator is full send straight
to the spine. Each aggregator is consumed in proportion to the bandwidth fed
into it (streams x rate), shared by all jobs, released when a job completes
(`AggregatorLedger.release`); grants name a ToR id or a pod id.

The choice is per iteration (`choose_iteration_collective`): when aggregators
free up or fill, a job's next iteration may switch between INC and a ring, and
the routing header says which.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from .cluster import Cluster
from .job import Collective, Job, Placement
from .memo import IdentityMemo
from .traffic import (
    ALGO_HIERARCHICAL_RING,
    ALGO_INC,
    ALGO_RING,
    ALGO_TREE,
    dp_groups,
    gradient_bytes,
)

# alpha per hop, seconds. NCCL 2.30.7 tuning model, data/tables/
# nccl_tuning_constants_v2.30.7.csv, column Simple (the protocol for large buffers):
ALPHA_RING_S = 14.0e-6  # row hwLatencies,NET,Ring
ALPHA_TREE_S = 14.0e-6  # row hwLatencies,NET,Tree
ALPHA_INC_S = 31.0e-6  # row hwLatencies,NET,CollNetDirect (switch aggregation)
# C: a server's 8 GPUs reduce their S/8 shards in parallel at ~1 TB/s of HBM
# each (read 2 bytes, write 1 per reduced byte at ~3 TB/s): 1 / 8e12 s per byte.
REDUCE_S_PER_BYTE = 1.0 / 8e12
# an aggregator share below this fraction of a server's NIC rate counts as full
MIN_INC_SHARE = 0.01

REASON_SINGLE = "one member per DP group: no AllReduce"
REASON_AGG_FULL = "aggregators full"


def gbps_to_bytes_per_s(gbps: float) -> float:
    """Gb/s to bytes/s: * 1e9 / 8."""
    return gbps * 1e9 / 8


def ring_time_s(
    n: int,
    size_bytes: float,
    bandwidth_bps: float,
    alpha_s: float = ALPHA_RING_S,
    reduce_s_per_byte: float = REDUCE_S_PER_BYTE,
) -> float:
    """ring: T = (N-1) * (2*alpha + 2*S/(N*B) + S*C/N); 0 for N <= 1."""
    if n <= 1:
        return 0.0
    if bandwidth_bps <= 0:
        return math.inf
    s, b, c = size_bytes, bandwidth_bps, reduce_s_per_byte
    return (n - 1) * (2 * alpha_s + 2 * s / (n * b) + s * c / n)


def tree_time_s(
    n: int,
    size_bytes: float,
    bandwidth_bps: float,
    alpha_s: float = ALPHA_TREE_S,
    reduce_s_per_byte: float = REDUCE_S_PER_BYTE,
) -> float:
    """Double binary tree: 4aL + 2S/B + 2*sqrt(8*L*a*S/B) + (sqrt(2*L*a*S) + S)*C, L=log2 N."""
    if n <= 1:
        return 0.0
    if bandwidth_bps <= 0:
        return math.inf
    lg, a, s, b, c = math.log2(n), alpha_s, size_bytes, bandwidth_bps, reduce_s_per_byte
    return (
        4 * a * lg
        + 2 * s / b
        + 2 * math.sqrt(8 * lg * a * s / b)
        + (math.sqrt(2 * lg * a * s) + s) * c
    )


def hierarchical_ring_time_s(
    group_sizes: Sequence[int],
    size_bytes: float,
    intra_bps: float,
    inter_bps: float,
    alpha_s: float = ALPHA_RING_S,
    reduce_s_per_byte: float = REDUCE_S_PER_BYTE,
) -> float:
    """ring(max n, S, B_in) inside groups + ring(G, S/min n, B_x) across the G groups."""
    sizes = [g for g in group_sizes if g > 0]
    if sum(sizes) <= 1:
        return 0.0
    inside = ring_time_s(max(sizes), size_bytes, intra_bps, alpha_s, reduce_s_per_byte)
    shard = size_bytes / min(sizes)
    across = ring_time_s(len(sizes), shard, inter_bps, alpha_s, reduce_s_per_byte)
    return inside + across


def inc_time_s(size_bytes: float, bandwidth_bps: float, levels: int) -> float:
    """INC: T = 2*levels*alpha_inc + S/B_inc (send and receive S once, full duplex)."""
    if levels <= 0 or size_bytes <= 0:
        return 0.0
    if bandwidth_bps <= 0:
        return math.inf
    return 2 * levels * ALPHA_INC_S + size_bytes / bandwidth_bps


def aggregator_capacity(cluster: Cluster, switch_id: str) -> float:
    """Gb/s of INC input a ToR (by ToR id) or a pod's spine (by pod id) aggregates."""
    tor = cluster.tors_by_id.get(switch_id)
    if tor is not None:
        return tor.aggregator_gbps
    pod = cluster.pods_by_id.get(switch_id)
    return pod.aggregator_gbps if pod is not None else 0.0


@dataclass(frozen=True, slots=True)
class AggregatorGrant:
    """Gb/s of one ToR's aggregator held by one job."""

    tor_id: str
    job_id: str
    gbps: float


@dataclass(frozen=True, slots=True)
class AggregatorLedger:
    """Every job's aggregator grants; capacity comes from the cluster's ToRs."""

    grants: tuple[AggregatorGrant, ...] = ()

    def used_gbps(self, tor_id: str) -> float:
        """Gb/s of `tor_id`'s aggregator held by all jobs."""
        return sum(g.gbps for g in self.grants if g.tor_id == tor_id)

    def free_gbps(self, cluster: Cluster, tor_id: str) -> float:
        """Gb/s of the aggregator of `tor_id` (a ToR or a pod's spine) nobody holds."""
        return max(0.0, aggregator_capacity(cluster, tor_id) - self.used_gbps(tor_id))

    def of_job(self, job_id: str) -> tuple[AggregatorGrant, ...]:
        return tuple(g for g in self.grants if g.job_id == job_id)

    def release(self, job_id: str) -> AggregatorLedger:
        """The ledger without `job_id`'s grants (on completion or re-plan)."""
        return AggregatorLedger(tuple(g for g in self.grants if g.job_id != job_id))

    def reserve(self, cluster: Cluster, grants: Iterable[AggregatorGrant]) -> AggregatorLedger:
        """The ledger with `grants` added; a grant beyond capacity is a bug (ValueError)."""
        added = tuple(grants)
        if not added:
            return self
        new = self.grants + added
        # only the switches granted to can go over (one pass over the ledger, not one
        # per switch it names: an arrival re-plans several jobs, each reserving)
        used = dict.fromkeys({g.tor_id for g in added}, 0.0)
        for g in new:
            if g.tor_id in used:
                used[g.tor_id] += g.gbps
        for tor_id, gbps in used.items():
            if gbps > aggregator_capacity(cluster, tor_id) * (1 + 1e-9):
                raise ValueError(f"aggregator capacity of {tor_id} exceeded")
        return AggregatorLedger(new)


@dataclass(frozen=True, slots=True)
class CollectiveChoice:
    """The AllReduce plan of one job: algorithm, INC grants, estimated time and why."""

    job_id: str
    algorithm: Collective
    inc: bool
    aggregators: tuple[str, ...]
    grants: tuple[AggregatorGrant, ...]
    estimated_allreduce_s: float
    reason: str
    costs: tuple[tuple[str, float], ...] = ()
    root_tors: tuple[tuple[int, str], ...] = ()  # INC: (DP group index, pod-level root ToR)

    def to_dict(self) -> dict[str, object]:
        """The `collective` field of GET /v1/jobs/{id} (non-finite times become null)."""
        est = self.estimated_allreduce_s
        return {
            "algorithm": str(self.algorithm),
            "inc": self.inc,
            "aggregators": list(self.aggregators),
            "estimated_allreduce_s": est if math.isfinite(est) else None,
            "reason": self.reason,
        }


@dataclass(frozen=True, slots=True)
class _IncOffer:
    """What INC would give this job now: per-stream rate, grants, levels, roots."""

    rate_gbps: float
    grants: tuple[AggregatorGrant, ...]
    levels: int
    root_tors: tuple[tuple[int, str], ...]
    why_not: str


def _pair(p: str, q: str) -> tuple[str, str]:
    return (p, q) if p < q else (q, p)


def _per_flow_bps(
    cluster: Cluster,
    crossings: Mapping[tuple[str, str], int],
    pod_gbps: Mapping[tuple[str, str], float] | None,
) -> float:
    """Bandwidth per flow on the most loaded pod pair (directed flow counts, duplex circuits)."""
    server = gbps_to_bytes_per_s(cluster.server_gbps)
    if pod_gbps is None or not crossings:
        return server
    worst = min(pod_gbps.get(_pair(p, q), 0.0) / count for (p, q), count in crossings.items())
    return min(server, gbps_to_bytes_per_s(worst))


# Where a DP group's members sit, in the group's (fabric) order: (pod id, ToR id)
# per member. Groups with the same signature cost the same, and a wide job has
# many alike (ep x pp groups), so the estimate works per distinct signature.
_Signature = tuple[tuple[str, str], ...]


def _signatures(cluster: Cluster, groups: Iterable[Sequence[str]]) -> list[_Signature]:
    """Each group's signature, every server looked up once."""
    server = cluster.server
    seen: dict[str, tuple[str, str]] = {}
    out = []
    for members in groups:
        sig = []
        for s in members:
            loc = seen.get(s)
            if loc is None:
                x = server(s)
                loc = seen[s] = (x.pod_id, x.tor_id)
            sig.append(loc)
        out.append(tuple(sig))
    return out


def _ring_crossings(
    rings: Iterable[tuple[Sequence[str], int]],
) -> Counter[tuple[str, str]]:
    """Directed pod pairs crossed by ring edges member i -> i+1 (wrapping).

    Each ring is given as its members' pods and how many rings alike there are.
    """
    out: Counter[tuple[str, str]] = Counter()
    for pods, times in rings:
        if len(pods) > 1:
            for a, b in zip(pods, [*pods[1:], pods[0]], strict=True):
                if a != b:
                    out[(a, b)] += times
    return out


def _pod_groups(sig: _Signature) -> dict[str, int]:
    """Members per pod (in order of appearance), or per ToR when they share one pod."""
    by_pod: dict[str, int] = {}
    for pod, _ in sig:
        by_pod[pod] = by_pod.get(pod, 0) + 1
    if len(by_pod) > 1:
        return by_pod
    by_tor: dict[str, int] = {}
    for _, tor in sig:
        by_tor[tor] = by_tor.get(tor, 0) + 1
    return by_tor


def _inc_offer(
    cluster: Cluster,
    job_id: str,
    sigs: Sequence[_Signature],
    ledger: AggregatorLedger,
    pod_gbps: Mapping[tuple[str, str], float] | None,
) -> _IncOffer:
    """The INC rate the free aggregators allow: r = min(NIC, free_a / streams_a, circuits).

    Level 1: members into their ToR aggregator (or, when it is full, straight
    into their pod's spine). Level 2: ToR partials into the pod spine; for a
    group spanning pods, one partial per other pod over a circuit into the root
    pod's spine. Every aggregator takes streams x r of its free capacity.
    """
    free = ledger.release(job_id)
    free_of: dict[str, float] = {}  # one ledger scan per switch, not per use

    def free_gbps(switch: str) -> float:
        got = free_of.get(switch)
        if got is None:
            got = free_of[switch] = free.free_gbps(cluster, switch)
        return got

    floor = MIN_INC_SHARE * cluster.server_gbps
    streams: dict[str, int] = {}
    crossings: dict[tuple[str, str], int] = {}
    roots: list[tuple[int, str]] = []
    levels = 1
    # per signature: (streams per switch, pod pairs crossed, root ToR or "" for one ToR)
    seen: dict[_Signature, tuple[dict[str, int], dict[tuple[str, str], int], str]] = {}
    for i, sig in enumerate(sigs):
        hit = seen.get(sig)
        if hit is None:
            hit = seen[sig] = _inc_group(sig, free_gbps, floor)
        for sw, n in hit[0].items():
            streams[sw] = streams.get(sw, 0) + n
        if hit[2]:
            levels = 2
            for pair, n in hit[1].items():
                crossings[pair] = crossings.get(pair, 0) + n
            roots.append((i, hit[2]))
    rate = cluster.server_gbps
    full = []
    for sw, n in sorted(streams.items()):
        avail = free_gbps(sw)
        cap = aggregator_capacity(cluster, sw)
        if avail / n < floor:
            full.append(f"{sw} {avail:g}/{cap:g} Gbps free for {n} streams")
        rate = min(rate, avail / n)
    if pod_gbps is not None and crossings:
        rate = min(rate, _per_flow_bps(cluster, crossings, pod_gbps) * 8 / 1e9)
    if full:
        return _IncOffer(0.0, (), levels, tuple(roots), f"{REASON_AGG_FULL}: " + "; ".join(full))
    if rate <= 0:
        return _IncOffer(0.0, (), levels, tuple(roots), "no optical circuits to the INC root")
    grants = tuple(
        AggregatorGrant(sw, job_id, min(n * rate, free_gbps(sw)))
        for sw, n in sorted(streams.items())
    )
    return _IncOffer(rate, grants, levels, tuple(roots), "")


def _inc_group(
    sig: _Signature, free_gbps: Callable[[str], float], floor: float
) -> tuple[dict[str, int], dict[tuple[str, str], int], str]:
    """One DP group's aggregator streams, pod pairs crossed and root ToR ("" under one ToR)."""
    tors: dict[str, int] = {}
    pods: dict[str, int] = {}
    pod_of_tor: dict[str, str] = {}
    for pod, tor in sig:
        tors[tor] = tors.get(tor, 0) + 1
        pods[pod] = pods.get(pod, 0) + 1
        pod_of_tor[tor] = pod
    streams: dict[str, int] = {}
    crossings: dict[tuple[str, str], int] = {}
    if len(tors) == 1:
        ((tor, n),) = tors.items()
        if n >= 2 and free_gbps(tor) / n < floor:
            # the ToR's aggregator is held by others: straight into the pod's spine (a
            # group under one ToR fell back to ring beside an idle spine)
            return {pod_of_tor[tor]: n}, crossings, ""
        return tors, crossings, ""
    # the root pod: most members, then most free spine aggregation
    root_pod = max(pods, key=lambda p: (pods[p], free_gbps(p), p))
    root_tor = max((t for t in tors if pod_of_tor[t] == root_pod), key=lambda t: (tors[t], t))
    into_root = 0
    for pod in pods:
        inputs = 0  # streams into this pod's spine
        for t, n in tors.items():
            if pod_of_tor[t] != pod:
                continue
            if n >= 2 and free_gbps(t) / n >= floor:
                streams[t] = n  # members into the ToR aggregator, one partial up
                inputs += 1
            else:
                inputs += n  # one member, or a full ToR aggregator: straight up
        if pod == root_pod:
            into_root += inputs
            continue
        if inputs >= 2:
            streams[pod] = inputs  # this pod's spine combines them first
        into_root += 1  # one partial per pod over a circuit to the root spine
        crossings[(pod, root_pod)] = 1
    streams[root_pod] = into_root
    return streams, crossings, root_tor


@dataclass(frozen=True, slots=True)
class _Shape:
    """Where a placement's DP groups sit, as the cost estimates read it: the same for
    every estimate of the placement, so it is worked out once (`_shape`)."""

    sigs: tuple[_Signature, ...]
    split: dict[_Signature, dict[str, int]]  # per distinct signature: `_pod_groups`
    ring: Counter[tuple[str, str]]  # directed pod pairs the rings cross
    inter: Counter[tuple[str, str]]  # those the hierarchical rings' inter-part rings cross
    sizes: frozenset[int]  # distinct group sizes
    single: bool  # every group has one member: nothing to reduce
    switches: frozenset[str]  # the ToRs and pods the groups sit under (aggregators INC may use)


def _shape(cluster: Cluster, placement: Placement) -> _Shape:
    return _SHAPES.get((cluster, placement), lambda: _make_shape(cluster, placement))


def _make_shape(cluster: Cluster, placement: Placement) -> _Shape:
    groups = dp_groups(cluster, placement)
    sigs = tuple(_signatures(cluster, groups))
    alike = Counter(sigs)
    split = {sig: _pod_groups(sig) for sig in alike}
    ring = _ring_crossings(([p for p, _ in sig], n) for sig, n in alike.items())
    # hierarchical ring: the k-th member of every part forms a ring across the
    # parts, k < the smallest part; parts split by ToR share a pod (no crossing)
    inter = _ring_crossings(
        (list(parts), n * min(parts.values()))
        for sig, n in alike.items()
        for parts in [split[sig]]
        if len({p for p, _ in sig}) > 1
    )
    return _Shape(
        sigs,
        split,
        ring,
        inter,
        frozenset(len(sig) for sig in alike),
        all(len(g) <= 1 for g in groups),
        frozenset(x for sig in alike for loc in sig for x in loc),
    )


# placements are re-estimated on every re-plan of their job (and candidates while placing)
_SHAPES: IdentityMemo[_Shape] = IdentityMemo(4096, transient=True)


def estimate_costs(
    cluster: Cluster,
    job: Job,
    placement: Placement,
    ledger: AggregatorLedger,
    pod_gbps: Mapping[tuple[str, str], float] | None = None,
    size_bytes: float | None = None,
) -> tuple[dict[Collective, float], _IncOffer]:
    """Seconds per algorithm for the job's slowest DP group, and the INC offer behind it."""
    size = gradient_bytes(job) if size_bytes is None else size_bytes
    costs = _host_costs(cluster, placement, pod_gbps, size)
    offer = _inc_offer(cluster, job.job_id, _shape(cluster, placement).sigs, ledger, pod_gbps)
    costs[ALGO_INC] = (
        inc_time_s(size, gbps_to_bytes_per_s(offer.rate_gbps), offer.levels)
        if not offer.why_not
        else math.inf
    )
    return costs, offer


def _host_costs(
    cluster: Cluster,
    placement: Placement,
    pod_gbps: Mapping[tuple[str, str], float] | None,
    size: float,
    only: Collective | None = None,
) -> dict[Collective, float]:
    """Seconds of the algorithms the servers run themselves (no aggregator); `only`:
    just that one (a re-estimate needs the chosen algorithm alone)."""
    shape = _shape(cluster, placement)
    sizes = shape.sizes
    costs: dict[Collective, float] = {}
    if only in (None, ALGO_RING, ALGO_TREE):
        ring_b = _per_flow_bps(cluster, shape.ring, pod_gbps)
        if only in (None, ALGO_RING):
            costs[ALGO_RING] = max((ring_time_s(n, size, ring_b) for n in sizes), default=0.0)
        if only in (None, ALGO_TREE):
            costs[ALGO_TREE] = max((tree_time_s(n, size, ring_b) for n in sizes), default=0.0)
    if only in (None, ALGO_HIERARCHICAL_RING):
        server = gbps_to_bytes_per_s(cluster.server_gbps)
        inter_b = _per_flow_bps(cluster, shape.inter, pod_gbps)
        costs[ALGO_HIERARCHICAL_RING] = max(
            (
                hierarchical_ring_time_s(list(parts.values()), size, server, inter_b)
                for parts in shape.split.values()
            ),
            default=0.0,
        )
    return costs


def choose_collective(
    cluster: Cluster,
    job: Job,
    placement: Placement,
    ledger: AggregatorLedger,
    pod_gbps: Mapping[tuple[str, str], float] | None = None,
    size_bytes: float | None = None,
) -> CollectiveChoice:
    """Honour a forced `job.collective`, else pick the cheapest; INC falls back when full.

    `pod_gbps` maps sorted pod pairs to the circuit Gb/s this job may use between
    them; None assumes circuits at NIC rate (before circuits are planned).
    """
    if pod_gbps is None and size_bytes is None:
        # the choice reads the ledger only for the aggregators above the job's servers,
        # held by others: an arrival re-plans jobs that gave it ports, whose
        # aggregators seldom changed (memoised on those grants)
        near = _shape(cluster, placement).switches
        others = tuple(g for g in ledger.grants if g.tor_id in near and g.job_id != job.job_id)
        return _CHOSEN.get(
            (cluster, job, placement),
            lambda: _choose_collective(cluster, job, placement, ledger, None, None),
            others,
        )
    return _choose_collective(cluster, job, placement, ledger, pod_gbps, size_bytes)


# small: it is dropped wholesale when full, and freeing thousands of entries at once
# inside an event costs milliseconds; a few hundred jobs run at a time
_CHOSEN: IdentityMemo[CollectiveChoice] = IdentityMemo(1024, transient=True)


def _choose_collective(
    cluster: Cluster,
    job: Job,
    placement: Placement,
    ledger: AggregatorLedger,
    pod_gbps: Mapping[tuple[str, str], float] | None,
    size_bytes: float | None,
) -> CollectiveChoice:
    costs, offer = estimate_costs(cluster, job, placement, ledger, pod_gbps, size_bytes)
    ordered = tuple(sorted(costs.items(), key=lambda kv: kv[0]))
    if _shape(cluster, placement).single:
        return CollectiveChoice(job.job_id, ALGO_RING, False, (), (), 0.0, REASON_SINGLE, ordered)
    forced = job.collective
    algo: Collective
    if forced != Collective.AUTO and forced != Collective.INC:
        algo = forced
        return _choice(job, algo, costs, offer, f"forced by the job: {algo}", ordered)
    if forced == Collective.INC:
        if not offer.why_not:
            return _choice(job, ALGO_INC, costs, offer, "forced by the job: inc", ordered)
        fallback: tuple[Collective, ...] = (ALGO_RING, ALGO_TREE)
        algo = min(fallback, key=lambda a: (costs[a], a))
        why = f"inc forced but unavailable ({offer.why_not}); fell back to {algo}"
        return _choice(job, algo, costs, offer, why, ordered)
    preference = (ALGO_INC, ALGO_RING, ALGO_TREE, ALGO_HIERARCHICAL_RING)  # ties: simplest
    algo = min(costs, key=lambda a: (costs[a], preference.index(a)))
    others = ", ".join(f"{a} {costs[a]:.4g}s" for a in preference if a != algo)
    why = f"auto: {algo} {costs[algo]:.4g}s is cheapest ({others})"
    if offer.why_not:
        why += f"; inc unavailable: {offer.why_not}"
    return _choice(job, algo, costs, offer, why, ordered)


def _choice(
    job: Job,
    algo: Collective,
    costs: Mapping[Collective, float],
    offer: _IncOffer,
    reason: str,
    ordered: tuple[tuple[str, float], ...],
) -> CollectiveChoice:
    inc = algo == ALGO_INC
    grants = offer.grants if inc else ()
    return CollectiveChoice(
        job.job_id,
        algo,
        inc,
        tuple(sorted({g.tor_id for g in grants})),
        grants,
        costs[algo],
        reason,
        ordered,
        offer.root_tors if inc else (),
    )


# what `reestimate` appends to a choice's reason when its circuits change its time
ON_CIRCUITS = "; on the circuits it got: "


def reestimate(
    choice: CollectiveChoice,
    cluster: Cluster,
    job: Job,
    placement: Placement,
    pod_gbps: Mapping[tuple[str, str], float],
) -> CollectiveChoice:
    """The same choice with its time recomputed on the circuits it actually got."""
    if choice.estimated_allreduce_s == 0.0:
        return choice
    if not choice.inc:
        algo = choice.algorithm
        est = _host_costs(cluster, placement, pod_gbps, gradient_bytes(job), algo)[algo]
    else:
        # INC keeps exactly its grants: offer against a ledger holding only them
        ledger = AggregatorLedger(tuple(g for g in choice.grants))
        free_ledger = AggregatorLedger(
            tuple(
                AggregatorGrant(x, "", aggregator_capacity(cluster, x) - ledger.used_gbps(x))
                for x in choice.aggregators
            )
        )
        costs, _ = estimate_costs(cluster, job, placement, free_ledger, pod_gbps)
        est = costs[choice.algorithm]
    reason = choice.reason.split(ON_CIRCUITS)[0]
    chosen_at = dict(choice.costs).get(choice.algorithm, est)  # its NIC-rate estimate
    if not math.isclose(est, chosen_at, rel_tol=1e-3):
        # the choice compared estimates at NIC rate; say what its circuits give
        reason += f"{ON_CIRCUITS}{est:.4g}s"
    return CollectiveChoice(
        choice.job_id,
        choice.algorithm,
        choice.inc,
        choice.aggregators,
        choice.grants,
        est,
        reason,
        choice.costs,
        choice.root_tors,
    )


def choose_iteration_collective(
    cluster: Cluster,
    job: Job,
    placement: Placement,
    ledger: AggregatorLedger,
    current: CollectiveChoice,
    pod_gbps: Mapping[tuple[str, str], float] | None = None,
) -> CollectiveChoice:
    """The collective for the job's next iteration, given the aggregators free now.

    `ledger` holds every job's grants (the job's own are set aside). When
    aggregators have freed up so that INC is now the cheapest, the job switches
    to INC; when they filled so that INC is unavailable or no longer cheapest,
    it falls back (a job that forced INC keeps it while it is available). An
    unchanged choice is returned as is (same object), so callers can tell a
    change by identity and write a routing header only then.
    """
    fresh = choose_collective(cluster, job, placement, ledger, pod_gbps)
    if fresh.algorithm == current.algorithm and fresh.aggregators == current.aggregators:
        return current
    if not fresh.inc and not current.inc:
        return current  # the ring/tree choice is placement's; only INC follows aggregators
    return replace(fresh, reason=f"per iteration: {fresh.reason}")

"""Port allocation across every job of the fabric, by demand: `allocate_ports`.

Pure functions; must not import anything that does I/O (no FastAPI, SQLAlchemy,
Redis, pydantic) or read a clock. The fabric controller calls `allocate_ports`
on every arrival and completion and applies the result in the jobs' compute gaps.

Model. A job's cross-pod traffic per iteration is `JobDemand.pair_bytes`: bytes
per unordered pod pair over the busier direction (a circuit is full duplex, one
port on each pod, both on the same OXC). With c circuits on a pair the pair
needs bytes / (c * port rate); the job's network time is its slowest pair, and
its estimated iteration time is compute + network. Its ideal is the time with
the circuits that make it non-blocking (`pair_ports_needed`: on each pair, each
way at the rate its pods' NICs send and receive it, a pod's uplinks split over
its pairs where they are fewer; `want` per pod is what those pairs hold there).
A one-way ring through a pod enters from one neighbour and leaves to another,
so each of those pairs needs all of the pod's NICs. The estimated slowdown is
iteration time over ideal.

Allocation, in three steps:

1. Minimum: in priority order (jobs isolated before keep their place, then
   arrival order) each job with cross-pod traffic asks for one circuit per pod
   pair it uses, all or nothing. A job that gets them is `isolated`.
2. The rest are served by sharing or by the electrical layer, whichever is
   estimated faster for the job: `shared` jobs take turns on a pool of ports
   (at least one circuit per pair of every sharer, reclaimed from the latest
   isolated jobs when no port is free), each turn paying its reconfiguration;
   their communication interleaves with the others' compute (CASSINI-style), so
   sharing costs little while the sharers' network time fits one iteration.
   `electrical` jobs send over the pods' electrical uplinks (`electrical_gbps`
   per pod, split among the electrical jobs there); with no electrical
   capacity nobody is electrical.
3. Water-filling: circuits go one level at a time to the job (or the pool) with
   the highest estimated slowdown, on its bottleneck pair, on the OXC with the
   most free ports on both pods, until every job is at its want or no OXC has a
   free port on both pods of anyone's bottleneck pair.

With `previous` and no new job (a completion, or a recomputation), every job
starts from the circuits it held (they still fit: ports were only freed), so a
completion never lowers anyone's share; the freed ports are water-filled. With
`previous`, circuits grow only for jobs on pods where something changed (a job
came or went, a held circuit could not be kept, a job changed mode or gave
circuits to an arrival): re-allocating the same jobs leaves every isolated job
as it was.
"""

from __future__ import annotations

import functools
import heapq
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from .circuits import PodCircuits
from .cluster import Cluster
from .cross_connects import (
    CrossConnect,
    CrossConnectMapping,
    fits_on_switches,
    physical_order,
    port_pods,
)
from .job import Job, Placement
from .memo import IdentityMemo
from .traffic import ALGO_RING, PHASE_DP, PHASE_PP, DemandMatrix, job_traffic

MODE_ISOLATED = "isolated"
MODE_SHARED = "shared"
MODE_ELECTRICAL = "electrical"
MODE_NONE = "none"

POOL = "(shared pool)"
_NO_TRAFFIC = "no inter-pod traffic"
# a water-filling step lowers a job's estimated slowdown to the next job's or by this factor
STEP = 0.95
# the share of spare ports handed out in proportion before water-filling
START = 0.8
# a job moves to the electrical core only if that saves at least this share of time
CORE_GAIN = 0.95
# a turn on shared ports lasts this many reconfigurations (the controller's default)
TURN_RECONFIGS = 40.0


@dataclass(frozen=True, slots=True)
class JobDemand:
    """What a job asks of the optical layer per iteration."""

    job_id: str
    pair_bytes: tuple[tuple[str, str, float], ...]  # (pod_a < pod_b, bytes over busier way)
    want: tuple[tuple[str, int], ...]  # ports per pod that make it non-blocking
    compute_s: float = 0.0  # compute per iteration (0 when unknown)
    # NICs per pod (servers x NICs, not capped by the uplinks): what bounds the job on
    # the electrical core (empty: `want` does)
    nics: tuple[tuple[str, int], ...] = ()
    # (pod_a < pod_b, circuits) that carry each way of the pair as fast as its pods'
    # NICs send and receive it (empty: each pod's `want` split over its pairs by bytes)
    pair_ports: tuple[tuple[str, str, int], ...] = ()

    @property
    def pods(self) -> tuple[str, ...]:
        return tuple(sorted({p for a, b, _ in self.pair_bytes for p in (a, b)}))

    @property
    def cross_pod(self) -> bool:
        return bool(self.pair_bytes)


@dataclass(frozen=True, slots=True)
class JobAllocation:
    """One job's share: mode, its circuits per OXC and pair, ports, expected slowdown."""

    job_id: str
    mode: str
    circuits: tuple[tuple[str, str, str, int], ...]  # (oxc, pod_a, pod_b, n): its own
    expected_ports: tuple[tuple[str, float], ...]  # ports per pod on average (shared: pool/k)
    estimated_slowdown: float
    reason: str
    # (oxc, pod, n): ports beyond its circuits, for per-phase topologies (a phase
    # may use a pod's ports on one pair that the held topology splits over several)
    spare: tuple[tuple[str, str, int], ...] = ()
    # its circuits counted as the next allocation reads them (`_held_of`), once
    _held: _Held | None = field(default=None, init=False, repr=False, compare=False)
    # the demand it was last asked about and the spare ports it wanted (`_spare_wanted`)
    _wanted: tuple[JobDemand, tuple[tuple[str, int], ...]] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    @property
    def oxc_ports(self) -> tuple[tuple[str, str, int], ...]:
        """(oxc, pod, ports) this job holds on its own (circuits and spare ports)."""
        out: dict[tuple[str, str], int] = defaultdict(int)
        for o, a, b, n in self.circuits:
            out[(o, a)] += n
            out[(o, b)] += n
        for o, p, n in self.spare:
            out[(o, p)] += n
        return tuple((o, p, n) for (o, p), n in sorted(out.items()))

    @property
    def pod_ports(self) -> tuple[tuple[str, int], ...]:
        """Ports per pod this job holds on its own."""
        out: dict[str, int] = defaultdict(int)
        for _, a, b, n in self.circuits:
            out[a] += n
            out[b] += n
        for _, p, n in self.spare:
            out[p] += n
        return tuple(sorted(out.items()))

    def pair_circuits(self) -> dict[tuple[str, str], int]:
        """Circuits per pod pair over all OXCs."""
        out: dict[tuple[str, str], int] = defaultdict(int)
        for _, a, b, n in self.circuits:
            out[(a, b)] += n
        return dict(out)

    @property
    def share(self) -> float:
        """Ports this job expects to use, over all its pods."""
        return sum(n for _, n in self.expected_ports)


@dataclass(frozen=True, slots=True)
class PortAllocation:
    """Every job's allocation, the shared pool and its turn order."""

    jobs: tuple[JobAllocation, ...]
    pool: tuple[tuple[str, str, str, int], ...]  # (oxc, pod_a, pod_b, n) the sharers rotate
    turn_order: tuple[str, ...]
    _index: dict[str, JobAllocation] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_index", {j.job_id: j for j in self.jobs})

    def job(self, job_id: str) -> JobAllocation | None:
        return self._index.get(job_id)

    def used_ports(self) -> dict[tuple[str, str], int]:
        """(oxc, pod) -> ports promised to isolated jobs and the pool."""
        out: dict[tuple[str, str], int] = defaultdict(int)
        for j in self.jobs:
            for o, p, n in j.oxc_ports:
                out[(o, p)] += n
        for o, a, b, n in self.pool:
            out[(o, a)] += n
            out[(o, b)] += n
        return dict(out)

    def pool_pair_circuits(self) -> dict[tuple[str, str], int]:
        out: dict[tuple[str, str], int] = defaultdict(int)
        for _, a, b, n in self.pool:
            out[(a, b)] += n
        return dict(out)


EMPTY_ALLOCATION = PortAllocation((), (), ())


# ------------------------------------------------------------------ demand


def job_demand(
    cluster: Cluster,
    job: Job,
    placement: Placement,
    algorithm: str = ALGO_RING,
    root_tors: Mapping[int, str] | None = None,
    compute_s: float | None = None,
) -> JobDemand:
    """The job's cross-pod bytes per iteration (pp + dp phases) and its non-blocking want."""
    traffic = job_traffic(cluster, job, placement, algorithm, root_tors)
    pair = pair_ways(t.pod_demand for t in traffic if t.phase in (PHASE_PP, PHASE_DP))
    return demand_of_pairs(
        cluster,
        job.job_id,
        placement,
        pair,
        compute_estimate_s(job) if compute_s is None else compute_s,
    )


def pair_ways(demands: Iterable[DemandMatrix]) -> dict[tuple[str, str], list[float]]:
    """Bytes per pod pair (pod_a < pod_b) and way ([a to b, b to a]), summed over demands."""
    pair: dict[tuple[str, str], list[float]] = {}
    for demand in demands:
        for p, q, b in demand.entries():
            key = (p, q) if p < q else (q, p)
            pair.setdefault(key, [0.0, 0.0])[0 if p < q else 1] += b
    return pair


def demand_of_pairs(
    cluster: Cluster,
    job_id: str,
    placement: Placement,
    pair: Mapping[tuple[str, str], Sequence[float]],
    compute_s: float,
) -> JobDemand:
    """A job's demand from its bytes per pod pair and way (`pair_ways`): modelled at
    placement, or learned from the phases it was seen to send (the controller)."""
    servers: dict[str, int] = defaultdict(int)
    for s in placement.servers:
        servers[cluster.server(s).pod_id] += 1
    per_server = max(1, round(cluster.server_gbps / cluster.nic_gbps))
    pods = {p for k in pair for p in k}
    nics = tuple((p, servers[p] * per_server) for p in sorted(pods))
    uplinks = {p: cluster.pods_by_id[p].uplink_ports for p in pods}
    pair_ports = pair_ports_needed(pair, dict(nics), uplinks)
    at_pod: dict[str, int] = defaultdict(int)
    for pod_a, pod_b, circuits in pair_ports:
        at_pod[pod_a] += circuits
        at_pod[pod_b] += circuits
    want = tuple((p, min(uplinks[p], max(n, at_pod[p]))) for p, n in nics)
    return JobDemand(
        job_id,
        tuple((a, b, max(v)) for (a, b), v in sorted(pair.items())),
        want,
        compute_s,
        nics,
        pair_ports,
    )


def pair_ports_needed(
    pair: Mapping[tuple[str, str], Sequence[float]],
    nics: Mapping[str, int],
    uplinks: Mapping[str, int],
) -> tuple[tuple[str, str, int], ...]:
    """Circuits per pair that carry it as fast as its pods' NICs send and receive.

    A pod's NICs send its outbound bytes and receive its inbound bytes at once,
    each way split over its pairs by bytes; a pair needs the larger of its two
    ways on each side. A one-way ring through a pod enters from one pod and
    leaves to another: each of those pairs needs all of the pod's NICs (one way
    each), since a circuit runs to one peer only. Where a pod's pairs need more
    than its uplinks, its uplinks are split over them in proportion; a pair gets
    no more than its scarcer side gives it.
    """
    sent: dict[str, float] = defaultdict(float)
    received: dict[str, float] = defaultdict(float)
    for (a, b), (ab, ba) in pair.items():
        sent[a] += ab
        received[b] += ab
        sent[b] += ba
        received[a] += ba

    def side(p: str, out: float, into: float) -> float:
        n = nics.get(p, 0)
        return max(
            n * out / sent[p] if sent[p] > 0 else 0.0,
            n * into / received[p] if received[p] > 0 else 0.0,
        )

    need = {(a, b): (side(a, ab, ba), side(b, ba, ab)) for (a, b), (ab, ba) in pair.items()}
    total: dict[str, float] = defaultdict(float)
    for (a, b), (at_a, at_b) in need.items():
        total[a] += at_a
        total[b] += at_b

    def scaled(p: str, n: float) -> float:
        return n * min(1.0, uplinks.get(p, 0) / total[p]) if total[p] > 0 else 0.0

    return tuple(
        (a, b, max(1, math.ceil(min(scaled(a, at_a), scaled(b, at_b)) - 1e-9)))
        for (a, b), (at_a, at_b) in sorted(need.items())
    )


def network_s(d: JobDemand, circuits: Mapping[tuple[str, str], int], port_gbps: float) -> float:
    """The demand's network time per iteration on `circuits` per pod pair (either order:
    `JobAllocation.pair_circuits`): its slowest pair's (infinite when a pair has none)."""
    port_bps = port_gbps * 1e9 / 8
    worst = 0.0
    for a, b, x in d.pair_bytes:
        c = circuits.get((a, b)) or circuits.get((b, a), 0)
        if c <= 0:
            return math.inf
        worst = max(worst, x / (c * port_bps))
    return worst


def compute_estimate_s(job: Job) -> float:
    """Compute seconds per iteration from the job's stated times (0 when unknown)."""
    c = job.compute
    m = job.model
    if c is None or c.microbatch_forward_s is None or c.microbatch_backward_s is None:
        return 0.0
    micro = (m.microbatches if m is not None else None) or 1
    per = c.microbatch_forward_s + c.microbatch_backward_s
    return (micro + job.parallelism.pp - 1) * per + (c.optimizer_s or 0.0)


# ------------------------------------------------------------------ estimates


def ideal_iteration_s(d: JobDemand, port_gbps: float) -> float:
    """The job's iteration on the circuits that make it non-blocking (as its pods stood
    when the demand was taken): what every estimated slowdown of the job is measured
    against, in the allocation and in the job's `network` view alike."""
    return _prepared(d, port_gbps * 1e9 / 8)[2]


class _Job:
    """Mutable working state of one job during allocation."""

    __slots__ = ("d", "bytes", "cap", "have", "ideal_s", "rank", "prev", "pods", "pod_set")

    def __init__(self, d: JobDemand, port_bps: float, rank: int) -> None:
        self.d = d
        self.rank = rank
        self.bytes, self.cap, self.ideal_s, self.pods, self.pod_set = _prepared(d, port_bps)
        self.have: dict[tuple[str, str], int] = dict.fromkeys(self.bytes, 0)
        self.prev: dict[tuple[str, str, str], int] = {}

    def net_s(self, have: Mapping[tuple[str, str], int], port_bps: float) -> float:
        worst = 0.0
        for k, x in self.bytes.items():
            c = have.get(k, 0)
            if c <= 0:
                return math.inf
            worst = max(worst, x / (c * port_bps))
        return worst

    def slowdown(self, port_bps: float) -> float:
        if not 0 < self.ideal_s < math.inf:
            return 1.0  # no network time to gain (or numbers past any real job's)
        return (self.d.compute_s + self.net_s(self.have, port_bps)) / self.ideal_s

    def pair_slowdown(self, pair: tuple[str, str], circuits: int, port_bps: float) -> float:
        """The slowdown the job would have if `pair` were its only constraint."""
        if not 0 < self.ideal_s < math.inf:
            return 1.0
        return (self.d.compute_s + self.bytes[pair] / (circuits * port_bps)) / self.ideal_s

    def bottleneck(self) -> tuple[str, str] | None:
        """The pair with the longest time that is still below its cap."""
        best = None
        best_t = -1.0
        for k, x in self.bytes.items():
            c = self.have[k]
            if c >= self.cap[k]:
                continue
            t = x / c if c else math.inf
            if t > best_t:
                best, best_t = k, t
        return best

    def limited_by_cap(self) -> bool:
        """Is its slowest pair at its cap (more circuits elsewhere gain nothing)?"""
        worst, worst_t = None, -1.0
        have = self.have
        for k, x in self.bytes.items():
            c = have[k]
            t = x / c if c else math.inf
            if t > worst_t:
                worst, worst_t = k, t
        return worst is not None and have[worst] >= self.cap[worst]


def _part(x: float, total: float) -> float:
    """x's share of total (1 when both are infinite: bytes past any real job's)."""
    if not total:
        return 0.0
    share = x / total
    return share if share == share else 1.0


_Prepared = tuple[
    dict[tuple[str, str], float], dict[tuple[str, str], int], float, tuple[str, ...], frozenset[str]
]
_PREPARED: IdentityMemo[_Prepared] = IdentityMemo(8192)


def _prepared(d: JobDemand, port_bps: float) -> _Prepared:
    """Bytes and ideal circuits per pair, the ideal iteration time and the pods (memoised
    per demand)."""
    return _PREPARED.get((d,), lambda: _prepare(d, port_bps), port_bps)


def _prepare(d: JobDemand, port_bps: float) -> _Prepared:
    pair = {(a, b): x for a, b, x in d.pair_bytes}
    cap: dict[tuple[str, str], int] = {(a, b): n for a, b, n in d.pair_ports}
    if not cap:
        # ideal circuits per pair: each pod's want split over its pairs by bytes
        want = dict(d.want)
        out = pod_bytes(pair)
        for (a, b), x in pair.items():
            share_a = want.get(a, 0) * _part(x, out[a])
            share_b = want.get(b, 0) * _part(x, out[b])
            cap[(a, b)] = max(1, math.ceil(min(share_a, share_b)))
    net = max((x / (cap[k] * port_bps) for k, x in pair.items()), default=0.0)
    ideal = d.compute_s + net
    if 0 < net < math.inf:
        # beyond what brings a pair to the job's slowest ideal pair, circuits gain nothing
        for k, x in pair.items():
            cap[k] = max(1, min(cap[k], math.ceil(x / (net * port_bps) - 1e-9)))
    pods = d.pods
    return (pair, cap, ideal, pods, frozenset(pods))


_WIRED: IdentityMemo[dict[str, list[int]]] = IdentityMemo(8)


class _Ports:
    """Free ports per pod and OXC (a list per pod, indexed like `oxcs`)."""

    __slots__ = ("free", "oxcs", "index")

    def __init__(self, cluster: Cluster) -> None:
        wired = _WIRED.get(
            (cluster,),
            lambda: {
                p.id: [len(o.pod_ports.get(p.id, ())) for o in cluster.oxcs] for p in cluster.pods
            },
        )
        self.oxcs = [o.id for o in cluster.oxcs]
        self.index = {o: i for i, o in enumerate(self.oxcs)}
        self.free: dict[str, list[int]] = {p: list(v) for p, v in wired.items()}

    def room(self, a: str, b: str) -> int:
        return sum(map(min, self.free[a], self.free[b]))

    def take(self, a: str, b: str, n: int) -> list[tuple[str, int]]:
        """Up to n circuits a-b, levelled over the OXCs with most free ports on both pods."""
        fa, fb = self.free[a], self.free[b]
        if n == 1:
            best, best_room = -1, 0
            for i in range(len(fa)):
                r = fa[i] if fa[i] < fb[i] else fb[i]
                if r > best_room:
                    best, best_room = i, r
            if best < 0:
                return []
            fa[best] -= 1
            fb[best] -= 1
            return [(self.oxcs[best], 1)]
        rooms = sorted(
            ((min(x, y), i) for i, (x, y) in enumerate(zip(fa, fb, strict=True)) if x and y),
            reverse=True,
        )
        if not rooms or n <= 0:
            return []
        total = sum(r for r, _ in rooms)
        n = min(n, total)
        # lower the roomiest OXCs to a common level until n circuits are taken
        take = [0] * len(rooms)
        left = n
        k = 1
        while left > 0:
            nxt = rooms[k][0] if k < len(rooms) else 0
            cur = rooms[k - 1][0] - take[k - 1]
            step = cur - nxt
            if step * k >= left or k == len(rooms):
                per, extra = divmod(left, k)
                for i in range(k):
                    take[i] += per + (1 if i < extra else 0)
                left = 0
            else:
                for i in range(k):
                    take[i] += step
                left -= step * k
                k += 1
        got = []
        for (_, i), t in zip(rooms, take, strict=True):
            if t > 0:
                fa[i] -= t
                fb[i] -= t
                got.append((self.oxcs[i], t))
        return got

    def take_at(self, o: str, a: str, b: str, n: int) -> int:
        i = self.index.get(o)
        if i is None or a not in self.free or b not in self.free:
            return 0
        k = min(n, self.free[a][i], self.free[b][i])
        if k > 0:
            self.free[a][i] -= k
            self.free[b][i] -= k
        return k

    def take_port(self, o: str, pod: str, n: int) -> int:
        """Up to n free ports of one pod on OXC o."""
        i = self.index.get(o)
        if i is None or pod not in self.free:
            return 0
        k = min(n, self.free[pod][i])
        self.free[pod][i] -= k
        return k

    def take_ports(self, pod: str, n: int) -> list[tuple[str, int]]:
        """Up to n free ports of one pod, from the OXCs with most free first."""
        got: list[tuple[str, int]] = []
        f = self.free.get(pod, [])
        if n <= 0 or max(f, default=0) <= 0:
            return got  # nothing free there (the common case on full pods)
        for i in sorted(range(len(f)), key=lambda i: -f[i]):
            if n <= 0:
                break
            k = min(n, f[i])
            if k > 0:
                f[i] -= k
                n -= k
                got.append((self.oxcs[i], k))
        return got

    def give(self, o: str, a: str, b: str, n: int) -> None:
        i = self.index[o]
        self.free[a][i] += n
        self.free[b][i] += n


# ------------------------------------------------------------------ allocation


def held_allocation(
    cluster: Cluster,
    demands: Sequence[JobDemand],
    held: Mapping[str, Mapping[tuple[str, str, str], int]],
) -> PortAllocation:
    """The allocation the switches hold: each job's circuits (oxc, pod_a < pod_b) -> n,
    on the pairs it sends across, as isolated slices with their estimated slowdown,
    for the jobs they give a circuit on every such pair. A new leader passes it as
    `previous`, so jobs keep the circuits they run on."""
    port_bps = cluster.nic_gbps * 1e9 / 8
    out: list[JobAllocation] = []
    for rank, d in enumerate(demands):
        mine = held.get(d.job_id)
        if not mine or not d.cross_pod:
            continue
        w = _Job(d, port_bps, rank)
        own = tuple((o, a, b, n) for (o, a, b), n in sorted(mine.items()) if (a, b) in w.bytes)
        if {(a, b) for _, a, b, _ in own} != set(w.bytes):
            # not a circuit on every pair (a per-phase topology was installed, say):
            # it is allocated afresh, as an arrival, from the ports others leave
            continue
        ports: dict[str, float] = defaultdict(float)
        for _, a, b, n in own:
            w.have[(a, b)] += n
            ports[a] += n
            ports[b] += n
        slowdown = round(w.slowdown(port_bps), 4)
        out.append(
            JobAllocation(
                d.job_id,
                MODE_ISOLATED,
                own,
                tuple(sorted(ports.items())),
                slowdown,
                ISOLATED_REASON + slowdown_note(slowdown),
            )
        )
    return PortAllocation(tuple(out), (), ())


def allocate_ports(
    cluster: Cluster,
    demands: Sequence[JobDemand],
    previous: PortAllocation | None = None,
    grown_pods: Collection[str] = (),
    regrown: Collection[str] = (),
) -> PortAllocation:
    """Every job's circuits, mode and expected slowdown (see module doc).

    `grown_pods`: pods whose usable uplinks grew since `previous` (failed ports back),
    where jobs may grow as on pods a job left. `regrown`: jobs whose demand grew since
    `previous` (learned from their reports): each keeps what it holds and takes more as
    an arrival does, free ports first, then circuits of jobs on its pods while they
    stay less slowed than it is.
    """
    electrical_gbps = {p.id: p.electrical_gbps for p in cluster.pods}
    port_bps = cluster.nic_gbps * 1e9 / 8
    reconfig_s = cluster.reconfig_ms / 1000.0
    turn_overhead = 1.0 / (1.0 - 1.0 / TURN_RECONFIGS) if reconfig_s > 0 else 1.0
    prev_jobs = {j.job_id: j for j in previous.jobs} if previous else {}
    # with a previous allocation every job starts from what it held; an arrival may
    # shrink others (never below one circuit per pair) or make the latest share, a
    # completion (no new job with cross-pod traffic) only adds
    arrival = previous is not None and any(
        d.cross_pod and d.job_id not in prev_jobs for d in demands
    )
    keep_floor = previous is not None and not arrival
    ports = _Ports(cluster)
    work: dict[str, _Job] = {}
    circuits: dict[str, dict[tuple[str, str, str], int]] = {}
    order = sorted(
        (d for d in demands if d.cross_pod),
        key=lambda d: (
            0 if prev_jobs.get(d.job_id, None) and prev_jobs[d.job_id].mode == MODE_ISOLATED else 1
        ),
    )
    for rank, d in enumerate(demands):
        if d.cross_pod:
            work[d.job_id] = _Job(d, port_bps, rank)
    isolated: list[str] = []
    unserved: list[str] = []
    spare: dict[str, dict[tuple[str, str], int]] = defaultdict(lambda: defaultdict(int))
    pool: dict[tuple[str, str, str], int] = defaultdict(int)

    # pods where what a job held could not be kept (failed ports, changed demand): its
    # circuits may grow back there in step 3
    unkept: set[str] = set()
    gave: set[str] = set()  # jobs that gave circuits to an arrival
    # every job keeps what it held
    if previous is not None:
        _restore(
            cluster,
            ports,
            previous,
            prev_jobs,
            order,
            work,
            circuits,
            spare,
            pool,
            unkept,
            short=not grown_pods,
        )

    # 1. minimum: one circuit per pair, all or nothing
    was = {d.job_id: prev_jobs[d.job_id].mode for d in order if d.job_id in prev_jobs}
    prev_shared = {j for j, m in was.items() if m == MODE_SHARED}
    prev_elec = {j for j, m in was.items() if m == MODE_ELECTRICAL}
    # jobs that chose the electrical core over circuits stay there (see step 4)
    elected = [
        d.job_id for d in order if d.job_id in prev_elec and _chose_core(prev_jobs[d.job_id])
    ]
    chose_core = set(elected)  # and those step 4 moves
    # held circuits were lost (failed ports) or ports came back: jobs short of their
    # minimum may shrink others, as an arrival may
    repair = bool(unkept or grown_pods)
    sharers_before = max(1, len(previous.turn_order)) if previous is not None else 1
    pool_before: dict[tuple[str, str], int] = defaultdict(int)
    for (_, a, b), n in pool.items():
        pool_before[(a, b)] += n
    for d in order:
        w = work[d.job_id]
        if d.job_id in chose_core:
            continue
        if d.job_id in prev_shared:
            # it leaves the turns only for circuits of its own at least its share
            claim = [
                ((a, b), max(1, math.ceil(pool_before[(a, b)] / sharers_before)))
                for a, b in w.bytes
            ]
            claimed = [k for k, n in claim for _ in range(n)]
            taken_all = _take_all(ports, claimed)
            if not taken_all and repair:
                # ports failed or came back: its minimum comes before others' spare
                # ports and circuits beyond theirs (a fault sweep's job, cut off from a
                # pod while its ports were dark, stayed cut off once they returned:
                # another job had grown into every port of its other pod)
                _release_spare(ports, spare, set(w.pods))
                shrink = functools.partial(
                    _shrink_pair, ports, circuits, work, isolated, port_bps, _DonorCache(gave)
                )
                taken_all = _take_all(ports, claimed, shrink)
            if not taken_all:
                continue  # keeps taking turns on a pool that only grows (below)
            prev_shared.discard(d.job_id)
            mine = circuits.setdefault(d.job_id, {})
            for o, a, b in taken_all:
                mine[(o, a, b)] = mine.get((o, a, b), 0) + 1
                w.have[(a, b)] += 1
            isolated.append(d.job_id)
            continue
        short = [k for k, c in w.have.items() if c == 0]
        # what the shrinks learn of the donors serves the arrival's rebalance too (only
        # this job gains circuits until it is placed)
        # (an arrival, or a repair: a job that lost a pair's last circuit to failed ports
        # takes its minimum back before others keep more than theirs)
        may_shrink = arrival or repair
        donor_cache = _DonorCache(gave) if may_shrink and short else None
        if not short:
            isolated.append(d.job_id)
        elif (
            (taken := _take_all(ports, short))
            or (
                may_shrink
                and _release_spare(ports, spare, set(w.pods))
                and (taken := _take_all(ports, short))
            )
            or (
                may_shrink
                and (
                    taken := _take_all(
                        ports,
                        short,
                        functools.partial(
                            _shrink_pair, ports, circuits, work, isolated, port_bps, donor_cache
                        ),
                    )
                )
            )
        ):
            mine = circuits.setdefault(d.job_id, {})
            for o, a, b in taken:
                mine[(o, a, b)] = mine.get((o, a, b), 0) + 1
                w.have[(a, b)] += 1
            isolated.append(d.job_id)
            if arrival and d.job_id not in prev_jobs:
                _rebalance_for(
                    d.job_id,
                    ports,
                    circuits,
                    work,
                    isolated,
                    port_bps,
                    donor_cache or _DonorCache(gave),
                )
        else:
            unserved.append(d.job_id)
    for j in regrown:
        if j in work and j in isolated:
            _rebalance_for(j, ports, circuits, work, isolated, port_bps, _DonorCache(gave))
    if repair:
        # a job that lost circuits (or its minimum) to failed ports takes circuits back
        # from jobs on its pods while they stay less slowed than it is, as an arrival
        # does: jobs that had grown into the ports kept them once the light was back
        # (a fault sweep: 8 and 8 circuits before a pod's outage, 15 and 1 after it)
        _rebalance_repaired(prev_jobs, ports, circuits, spare, work, isolated, port_bps, gave)

    # 2. the rest: shared pool (reclaiming minimal slices if needed) or electrical
    shared: list[str] = [d.job_id for d in order if d.job_id in prev_shared]
    electrical: list[str] = list(elected)
    if unserved:
        elec_jobs_on: dict[str, int] = defaultdict(int)
        for j in unserved:
            for p in work[j].pods:
                elec_jobs_on[p] += 1
        for j in unserved:
            w = work[j]
            e_s = _electrical_s(w, electrical_gbps, elec_jobs_on, port_bps)
            # sharing estimate: one circuit per pair, turns with every other sharer
            one = {k: 1 for k in w.bytes}
            net = w.net_s(one, port_bps)
            s_s = max(w.d.compute_s + net, net * (len(unserved) + len(shared))) * turn_overhead
            if any(k not in cluster.oxc_joined_pods for k in w.bytes):
                # no OXC joins a pair: no turn carries it, however slow the core is
                # (a sweep's cluster with a 400 Gb/s core per pod and no OXC: every
                # job crossing pods stalled, as turns looked faster than the core)
                s_s = math.inf
            if j in prev_elec or e_s < s_s:
                electrical.append(j)
            else:
                shared.append(j)
    # The pool is ports: each turn rewires them into the circuits its holder needs, so a
    # sharer is served when the pool's ports can join each of its pairs at once (one
    # circuit per pair, both ports on one OXC), whichever pool circuits hold them.
    pending = list(shared)
    if pending:
        # spare ports are headroom (taken again from what is left, below): the pool
        # may need them to join a sharer's pods (three jobs on a 2-uplink pod: the
        # third's pair never entered the pool while a spare port sat free beside it)
        _release_spare(ports, spare, set(ports.free))
    while pending:
        j = pending.pop(0)
        pairs = list(work[j].bytes)
        for _ in range(4 * len(pairs) + 4):  # each round adds a port or gives up
            if j not in shared or (pair := _unhosted(pool, pairs)) is None:
                break
            a, b = pair
            got = ports.take(a, b, 1)
            if got:
                for o, k in got:
                    pool[(o, a, b)] += k
                continue
            victim = None if keep_floor else _latest_holding(isolated, circuits, work, a, b)
            if victim is not None:
                # it takes turns from now on, on a pool its own ports join
                isolated.remove(victim)
                shared.append(victim)
                for (o, x, y), n in circuits.pop(victim, {}).items():
                    pool[(o, x, y)] += n
                work[victim].have = {k: 0 for k in work[victim].bytes}
                pending.append(victim)
                continue
            hosted = [list(work[x].bytes) for x in shared if x != j]
            hosted = [h for h in hosted if _unhosted(pool, h) is None]
            if not _extend_pool(ports, pool, a, b, hosted):
                break
    # a sharer whose pods no other sharer touches takes no turns: the pool's ports on
    # its pods become circuits of its own (a lone sharer, or those a completion left
    # apart)
    for j in list(shared):
        others = {p for x in shared if x != j for p in work[x].pods}
        if others & work[j].pod_set:
            continue
        mine_pool = {k: n for k, n in pool.items() if k[1] not in others and k[2] not in others}
        assignment = _host_assignment(mine_pool, list(work[j].bytes))
        if assignment is None:
            continue
        # and every other circuit the pool's ports on its pods can make on its pairs,
        # slowest pair first: its ports do not shrink as it leaves the turns (it held
        # 3 ports of a pod in turns, and 1 of its own after another sharer completed)
        assignment += _more_circuits(mine_pool, assignment, work[j])
        shared.remove(j)
        for key, n in mine_pool.items():
            ports.give(key[0], key[1], key[2], n)
            del pool[key]
        mine = circuits.setdefault(j, {})
        for o, x, y in assignment:
            ports.take_at(o, x, y, 1)
            mine[(o, x, y)] = mine.get((o, x, y), 0) + 1
            work[j].have[(x, y)] += 1
        isolated.append(j)
    # pool circuits on no sharer's pod go back
    sharer_pods = {p for j in shared for p in work[j].pods}
    for key in [k for k in pool if k[1] not in sharer_pods and k[2] not in sharer_pods]:
        ports.give(key[0], key[1], key[2], pool.pop(key))

    # 3. water-filling on estimated slowdown (spare ports are headroom: anyone's
    # circuits, the owner's first, may take them; what is left is spare again below)
    # (only on the pods of jobs that came or went, so jobs elsewhere stay as they are)
    present = {d.job_id for d in demands}
    changed_pods = {p for d in order if d.job_id not in prev_jobs for p in d.pods}
    changed_pods.update(grown_pods)
    changed_pods.update(p for j in regrown if j in work for p in work[j].pods)
    for gone in prev_jobs.values():
        if gone.job_id not in present:
            changed_pods.update(p for _, p, _ in gone.oxc_ports)
    # with `previous`, circuits grow only for jobs on pods where something changed: a
    # job came or went, a held circuit was lost, a job changed mode (turns, a new
    # slice) or gave circuits to an arrival; elsewhere what was water-filled stays
    grow_pods = changed_pods | unkept
    isolated_now = set(isolated)
    for j, pj in prev_jobs.items():
        if j in work and (j in gave or (j in isolated_now) != (pj.mode == MODE_ISOLATED)):
            grow_pods.update(work[j].pods)
    if previous is None:
        _release_spare(ports, spare, set(ports.free))
    else:
        # jobs on those pods may turn their own spare ports into circuits; so may jobs on
        # pods where a held circuit was lost (a failed port: a fault sweep's job stayed
        # at 5 of 7 circuits beside 3 spare ports of its own on a healthy OXC)
        opened = changed_pods | unkept
        near = {j for j in spare if j in work and work[j].pod_set & opened}
        _release_spare(ports, {j: spare[j] for j in near}, set(ports.free))
        _release_spare(ports, spare, opened)
    pool_have: dict[tuple[str, str], int] = defaultdict(int)
    for (_, a, b), n in pool.items():
        pool_have[(a, b)] += n

    def pool_slowdown() -> tuple[float, tuple[str, str] | None]:
        worst, pair = 1.0, None
        nets = {j: work[j].net_s(pool_have, port_bps) for j in shared}
        busy = sum(n for n in nets.values() if math.isfinite(n))
        for j in shared:
            w = work[j]
            if w.ideal_s <= 0:
                continue
            t = max(w.d.compute_s + nets[j], busy) * turn_overhead
            s = t / w.ideal_s
            if s > worst:
                worst = s
                pair = max(
                    (k for k in w.bytes if pool_have[k] < w.cap[k]),
                    key=lambda k: w.bytes[k] / max(pool_have[k], 1e-9),
                    default=None,
                )
        return worst, pair

    # extras are counted per pod here and mapped onto OXCs in bulk below
    pod_free = {p: sum(f) for p, f in ports.free.items()}
    extra: dict[tuple[str, str], dict[str, int]] = defaultdict(dict)

    def grant(job_id: str, a: str, b: str, n: int) -> int:
        k = min(n, pod_free[a], pod_free[b])
        if k <= 0:
            return 0
        pod_free[a] -= k
        pod_free[b] -= k
        held = extra[(a, b)]
        held[job_id] = held.get(job_id, 0) + k
        if job_id != POOL:
            work[job_id].have[(a, b)] += k
        return k

    # a proportional start: every isolated job gets the same fraction (START of what
    # its pods can spare) of the circuits it still wants, so water-filling below only
    # moves the last part one level at a time
    short_on: dict[str, float] = defaultdict(float)
    for j in isolated:
        w = work[j]
        for (a, b), c in w.have.items():
            gap = w.cap[(a, b)] - c
            if gap > 0:
                short_on[a] += gap
                short_on[b] += gap
    ratio = {p: min(1.0, pod_free[p] / n) * START for p, n in short_on.items() if n > 0}
    growing = [j for j in isolated if previous is None or work[j].pod_set & grow_pods]
    for j in growing:
        w = work[j]
        for (a, b), c in w.have.items():
            gap = w.cap[(a, b)] - c
            if gap > 0:
                k = int(gap * min(ratio.get(a, 0.0), ratio.get(b, 0.0)))
                if k > 0:
                    grant(j, a, b, k)

    heap: list[tuple[float, int, str]] = []
    has_free = {p for p, n in pod_free.items() if n > 0}
    for j in growing:
        if not work[j].pod_set.isdisjoint(has_free):  # else nothing can grow it
            heapq.heappush(heap, (-work[j].slowdown(port_bps), work[j].rank, j))
    if shared:
        s, _ = pool_slowdown()
        heapq.heappush(heap, (-s, -1, POOL))
    while heap:
        neg, _, j = heapq.heappop(heap)
        level = -heap[0][0] if heap else 1.0
        if j == POOL:
            s, pair = pool_slowdown()
            if pair is None or s <= 1.0 + 1e-9:
                continue
            if not grant(POOL, pair[0], pair[1], 1):
                continue
            pool_have[pair] += 1
            s, _ = pool_slowdown()
            heapq.heappush(heap, (-s, -1, POOL))
            continue
        w = work[j]
        if -neg <= 1.0 + 1e-9 or w.limited_by_cap():
            continue
        pair = w.bottleneck()
        if pair is None:
            continue
        # circuits that bring every pair down to the next job's level, or STEP below
        # its own (at least one on the bottleneck): few steps per job, not one per circuit
        target = min(level, -neg * STEP)
        target_net = max(target * w.ideal_s - w.d.compute_s, 1e-12)
        stuck = False
        for pk, nbytes in w.bytes.items():
            c = w.have[pk]
            if c >= w.cap[pk] or (pk != pair and nbytes / (c * port_bps) <= target_net):
                continue
            need = math.ceil(nbytes / (target_net * port_bps)) - c
            need = max(1, min(need, w.cap[pk] - c))
            if grant(j, pk[0], pk[1], need) == 0 and pk == pair:
                stuck = True  # no OXC has a free port on both pods: this job is done
        if stuck:
            continue
        heapq.heappush(heap, (-w.slowdown(port_bps), w.rank, j))

    # map the extras onto OXCs, pair by pair; what no OXC can hold is trimmed
    for (a, b), held in sorted(extra.items(), key=lambda kv: -sum(kv[1].values())):
        want = sum(held.values())
        got = ports.take(a, b, want)
        shortfall = want - sum(n for _, n in got)
        while shortfall > 0:
            top = max(held, key=lambda h: (held[h], h))
            held[top] -= 1
            shortfall -= 1
            if top == POOL:
                pool_have[(a, b)] -= 1
            else:
                work[top].have[(a, b)] -= 1
        chunks: list[tuple[str, int]] = list(got)
        for holder, n_held in sorted(held.items()):
            while n_held > 0:
                oxc, room = chunks.pop()
                moved = min(n_held, room)
                into = pool if holder == POOL else circuits.setdefault(holder, {})
                into[(oxc, a, b)] = into.get((oxc, a, b), 0) + moved
                n_held -= moved
                if room > moved:
                    chunks.append((oxc, room - moved))

    # 4. the electrical core: an isolated job whose circuits are slower than its share
    # of the core sends there instead, when that lowers the summed iteration time of
    # the jobs on the core's pods; its circuits become spare ports below. Not on a
    # completion (it never lowers anyone's share); it stays there for its life.
    if not keep_floor and any(electrical_gbps.values()):
        for j in _elect_core(
            work, isolated, electrical, circuits, ports, electrical_gbps, port_bps
        ):
            chose_core.add(j)
            _release_spare(ports, {j: spare[j]}, set(ports.free))

    # spare ports for per-phase topologies: what nobody's circuits took, up to each
    # job's want on its pods (most slowed first)
    # (this step only takes ports: a pod with no free port left gets none back)
    exhausted = {p for p, f in ports.free.items() if not any(f)}
    # what each job wants is worked out before any takes (it reads only the job's own
    # ports), on pods with a free port left
    wanting: dict[str, list[tuple[str, int]]] = {}
    for j in isolated:
        w = work[j]
        if w.pod_set <= exhausted:
            continue
        wants = [
            (pod, more)
            for pod, more in _spare_wanted(w, circuits.get(j, {}), spare[j], prev_jobs.get(j))
            if pod not in exhausted
        ]
        if wants:
            wanting.setdefault(j, wants)
    for j in sorted(wanting, key=lambda x: -work[x].slowdown(port_bps)):
        before = prev_jobs[j].spare if j in prev_jobs else ()
        for pod, more in wanting[j]:
            if pod in exhausted:
                continue
            # the same ports as before first: an unchanged job stays unchanged
            for o, p_, n in before:
                if p_ == pod and more > 0:
                    k = ports.take_port(o, pod, min(n, more))
                    spare[j][(o, pod)] += k
                    more -= k
            if more > 0:
                for o, k in ports.take_ports(pod, more):
                    spare[j][(o, pod)] += k
                    more -= k
                if more > 0:
                    exhausted.add(pod)

    # results
    isolated_set = set(isolated)
    shared_set = set(shared)
    elec_on: dict[str, int] = defaultdict(int)  # electrical jobs per pod share its core
    for x in electrical:
        for p in work[x].pods:
            elec_on[p] += 1
    out: list[JobAllocation] = []
    # per sharer, the circuits its turn rewires the pool's ports into (by pair)
    turns: dict[str, dict[tuple[str, str], int]] | None = None
    for d in demands:
        j = d.job_id
        if j not in work:
            old = prev_jobs.get(j)
            if (
                old is not None
                and old.mode == MODE_NONE
                and old.reason == _NO_TRAFFIC
                and old.estimated_slowdown == 1.0
                and not (old.circuits or old.expected_ports or old.spare)
            ):
                out.append(old)  # the same value: kept (most jobs stay inside a pod)
            else:
                out.append(JobAllocation(j, MODE_NONE, (), (), 1.0, _NO_TRAFFIC))
            continue
        w = work[j]
        if j in isolated_set:
            mine, spare_j = circuits.get(j, {}), spare[j]
            old = prev_jobs.get(j)
            if (
                old is not None
                and old.mode == MODE_ISOLATED
                # the same entries as before (old ones are sorted and positive), compared
                # as dicts: most jobs are unchanged (an entry repeated or not positive
                # makes the lengths differ: rebuilt)
                and len(mine) == len(old.circuits)
                and mine == _held_of(old).circuits
                and len(spare_j) == len(old.spare)
                and all(spare_j.get((o, pod)) == n for o, pod, n in old.spare)
            ):
                out.append(old)  # unchanged: the same allocation (and object)
                continue
            own = tuple((o, a, b, n) for (o, a, b), n in sorted(mine.items()) if n > 0)
            spare_out = tuple((o, pod, n) for (o, pod), n in sorted(spare_j.items()) if n > 0)
            if (
                old is not None
                and old.mode == MODE_ISOLATED
                and old.circuits == own
                and old.spare == spare_out
            ):
                out.append(old)  # unchanged: the same allocation (and object)
                continue
            ports_by_pod: dict[str, float] = defaultdict(float)
            for _, a, b, n in own:
                ports_by_pod[a] += n
                ports_by_pod[b] += n
            s = round(w.slowdown(port_bps), 4)
            out.append(
                JobAllocation(
                    j,
                    MODE_ISOLATED,
                    own,
                    tuple(sorted(ports_by_pod.items())),
                    s,
                    ISOLATED_REASON + slowdown_note(s),
                    spare_out,
                )
            )
        elif j in shared_set:
            k = len(shared)
            if turns is None:
                turns = {x: _turn_circuits(pool, pool_have, work[x]) for x in shared}
            on_pod: dict[str, int] = defaultdict(int)
            for (a, b), n in turns[j].items():
                on_pod[a] += n
                on_pod[b] += n
            exp = tuple((p, on_pod[p] / k) for p in w.pods)
            nets = {x: work[x].net_s(turns[x], port_bps) for x in shared}
            busy = sum(v for v in nets.values() if math.isfinite(v))
            t = max(w.d.compute_s + nets[j], busy) * turn_overhead
            s = round(t / w.ideal_s, 4) if w.ideal_s > 0 and math.isfinite(t) else math.inf
            why = (
                f"too few free ports on both pods of an OXC: takes turns with {k - 1} "
                f"other job(s) on {sum(pool_have.values())} shared circuit(s)"
            )
            if (cut := _unhosted(pool, list(w.bytes))) is not None:
                # its turn cannot join a pair: no estimate, and the reason says why
                s = math.inf
                why = _cut_off(cluster, *cut, k - 1)
            out.append(JobAllocation(j, MODE_SHARED, (), exp, s, why))
        else:
            e_s = _electrical_s(w, electrical_gbps, elec_on, port_bps)
            s = round(max(1.0, e_s / w.ideal_s), 4) if w.ideal_s > 0 else 1.0
            why = (
                CORE_FASTER
                if j in chose_core
                else "too few free ports; the electrical layer is estimated faster than turns"
            )
            out.append(JobAllocation(j, MODE_ELECTRICAL, (), (), s, why + slowdown_note(s)))
    turn = tuple(j for j in (previous.turn_order if previous else ()) if j in shared)
    turn += tuple(j for j in shared if j not in turn)
    pool_out = tuple((o, a, b, n) for (o, a, b), n in sorted(pool.items()) if n > 0)
    result = PortAllocation(tuple(out), pool_out, turn)
    # the ports it leaves free, for `_restore` when it is the next `previous`: the
    # free ports now, unless some circuit or spare port is held for a job that is not
    # isolated (then only the slow path holds again exactly what the result lists)
    held_off_books = any(
        c and (min(c.values()) < 0 or (j not in isolated_set and any(c.values())))
        for held in (circuits, spare)
        for j, c in held.items()
    )
    free_now = None if held_off_books else {p: tuple(f) for p, f in ports.free.items()}
    _FREE_AFTER.get((result, cluster), lambda: free_now)
    return result


def _restore(
    cluster: Cluster,
    ports: _Ports,
    previous: PortAllocation,
    prev_jobs: Mapping[str, JobAllocation],
    order: Sequence[JobDemand],
    work: Mapping[str, _Job],
    circuits: dict[str, dict[tuple[str, str, str], int]],
    spare: dict[str, dict[tuple[str, str], int]],
    pool: dict[tuple[str, str, str], int],
    unkept: set[str],
    *,
    short: bool = True,
) -> None:
    """Every job keeps what it held: the pool, then each isolated job's circuits and spare
    ports, in `order`, as far as they still fit (`unkept`: pods where one did not).

    The short way (`short`, and `_kept_whole` finds it applies): `previous` was
    allocated here on this very cluster, so the ports it left free are remembered
    (`_FREE_AFTER`), and an allocation made here promises no port twice, so every
    circuit fits again. The free ports are then those, plus what jobs no longer in
    `order` held; each job's circuits are copied whole. A 300-job fabric holds about
    2,000 circuits, and holding each again one by one was a sixth of an arrival's cost.
    """
    kept = _kept_whole(cluster, previous, prev_jobs, order, work) if short else None
    if kept is not None:
        free_after, keeps = kept
        free, index = ports.free, ports.index
        for p, f in free_after.items():
            free[p][:] = f
        staying = {j for j, _, _ in keeps}
        for gone in previous.jobs:
            if gone.mode == MODE_ISOLATED and gone.job_id not in staying:
                for o, a, b, n in gone.circuits:
                    ports.give(o, a, b, n)
                for o, pod, n in gone.spare:
                    free[pod][index[o]] += n
        for o, a, b, n in previous.pool:
            pool[(o, a, b)] += n
        for j, ja, held in keeps:
            circuits[j] = dict(held.circuits)
            have = work[j].have
            for pair, n in held.have.items():
                have[pair] += n
            for o, pod, n in ja.spare:
                if n > 0:
                    spare[j][(o, pod)] += n
        return
    free, index = ports.free, ports.index
    for o, a, b, n in previous.pool:
        k = ports.take_at(o, a, b, n)
        pool[(o, a, b)] += k
        if k < n:
            unkept.update((a, b))
    for d in order:
        pj = prev_jobs.get(d.job_id)
        if pj is None or pj.mode != MODE_ISOLATED:
            continue
        mine = circuits.setdefault(d.job_id, {})
        w = work[d.job_id]
        for o, a, b, n in pj.circuits:
            if (a, b) not in w.bytes:
                unkept.update((a, b))
                continue
            # ports.take_at, inlined (about 2,000 circuits are kept per event)
            i = index.get(o)
            fa, fb = free.get(a), free.get(b)
            if i is None or fa is None or fb is None:
                unkept.update((a, b))
                continue
            k = min(n, fa[i], fb[i])
            if k < n:
                unkept.update((a, b))
            if k > 0:
                fa[i] -= k
                fb[i] -= k
                mine[(o, a, b)] = mine.get((o, a, b), 0) + k
                w.have[(a, b)] += k
        for o, pod, n in pj.spare:
            k = ports.take_port(o, pod, n)
            if k:
                spare[d.job_id][(o, pod)] += k
            if k < n:
                unkept.add(pod)


def _kept_whole(
    cluster: Cluster,
    previous: PortAllocation,
    prev_jobs: Mapping[str, JobAllocation],
    order: Sequence[JobDemand],
    work: Mapping[str, _Job],
) -> tuple[dict[str, tuple[int, ...]], list[tuple[str, JobAllocation, _Held]]] | None:
    """For `_restore`'s short way: the free ports `previous` left and the isolated jobs
    that keep their circuits whole; None when it does not apply (an allocation from
    elsewhere, a job named twice, or a job whose pairs changed)."""
    free_after = _FREE_AFTER.peek((previous, cluster))
    if free_after is None:
        return None
    keeps: list[tuple[str, JobAllocation, _Held]] = []
    staying: set[str] = set()
    for d in order:
        pj = prev_jobs.get(d.job_id)
        if pj is None or pj.mode != MODE_ISOLATED:
            continue
        if d.job_id in staying:
            return None  # a job named twice: held once per mention, as the long way does
        staying.add(d.job_id)
        held = _held_of(pj)
        if not held.have.keys() <= work[d.job_id].bytes.keys():
            return None
        keeps.append((d.job_id, pj, held))
    return free_after, keeps


class _Held(NamedTuple):
    """An isolated allocation's circuits as `_restore`'s long way builds them: by (oxc, pair),
    and their count per pair."""

    circuits: dict[tuple[str, str, str], int]
    have: dict[tuple[str, str], int]


def _held_of(ja: JobAllocation) -> _Held:
    """`_count_held`, kept on the allocation itself: a memo of them, cleared wholesale
    when full, freed thousands at once inside one event (10-15 ms)."""
    held = ja._held
    if held is None:
        held = _count_held(ja)
        object.__setattr__(ja, "_held", held)
    return held


def _count_held(ja: JobAllocation) -> _Held:
    circuits: dict[tuple[str, str, str], int] = {}
    have: dict[tuple[str, str], int] = {}
    for o, a, b, n in ja.circuits:
        if n > 0:
            circuits[(o, a, b)] = circuits.get((o, a, b), 0) + n
            have[(a, b)] = have.get((a, b), 0) + n
    return _Held(circuits, have)


# per allocation made here and its cluster: each pod's free ports per OXC it left
_FREE_AFTER: IdentityMemo[dict[str, tuple[int, ...]] | None] = IdentityMemo(8)


def _extend_pool(
    ports: _Ports,
    pool: dict[tuple[str, str, str], int],
    a: str,
    b: str,
    hosted: Sequence[Sequence[tuple[str, str]]],
) -> bool:
    """Give the pool a port of a or b on an OXC where the other pod already has a pool
    port: the free port joins the pool paired with a free port of a third pod there,
    or, when none is free, in place of the port of a pool circuit that every sharer in
    `hosted` (their pairs) can do without. False when neither can."""
    for have, need in ((a, b), (b, a)):
        f_need = ports.free.get(need)
        if f_need is None:
            continue
        for o, i in ports.index.items():
            if f_need[i] <= 0 or not any(
                n > 0 and oo == o and have in (x, y) for (oo, x, y), n in pool.items()
            ):
                continue
            partner = next((p for p, f in ports.free.items() if p != need and f[i] > 0), None)
            if partner is not None:
                ports.free[need][i] -= 1
                ports.free[partner][i] -= 1
                key = _pool_key(o, need, partner)
                pool[key] = pool.get(key, 0) + 1
                return True
            # no free partner: re-pair a pool circuit on o, its other port going back
            for (oo, x, y), n in list(pool.items()):
                if oo != o or n <= 0:
                    continue
                for drop, keep in ((x, y), (y, x)):
                    if keep == need:
                        continue
                    new = _pool_key(o, need, keep)
                    pool[(oo, x, y)] -= 1
                    pool[new] = pool.get(new, 0) + 1
                    if all(_unhosted(pool, h) is None for h in hosted):
                        ports.free[need][i] -= 1
                        ports.free[drop][i] += 1
                        for k in [k for k, m in pool.items() if m <= 0]:
                            del pool[k]
                        return True
                    pool[new] -= 1
                    pool[(oo, x, y)] += 1
                    if pool[new] <= 0:
                        del pool[new]
    return False


def _host_assignment(
    pool: Mapping[tuple[str, str, str], int], pairs: Sequence[tuple[str, str]]
) -> list[tuple[str, str, str]] | None:
    """One (oxc, a, b) per pair on the pool's ports at once, or None when the pool
    cannot join them all."""
    assignment, missing = _host(pool, pairs)
    return None if missing else assignment


def _turn_circuits(
    pool: Mapping[tuple[str, str, str], int],
    pool_have: Mapping[tuple[str, str], int],
    w: _Job,
) -> dict[tuple[str, str], int]:
    """Circuits per pair a sharer counts on in its turn: the pool's circuits on the
    pair, or, on a pair the pool has none of, the one its turn rewires the pool's
    ports into (a third job on a 2-uplink pod was shown no ports and no estimate,
    though its turn joined its pods)."""
    placed, _ = _host(pool, list(w.bytes))
    hosted = {(a, b) for _, a, b in placed}
    return {k: pool_have.get(k, 0) or (1 if k in hosted else 0) for k in w.bytes}


def pool_room(pool: Iterable[tuple[str, str, str, int]]) -> dict[str, dict[str, int]]:
    """OXC -> pod -> ports, from the shared pool's (oxc, pod, pod, circuits)
    (`PortAllocation.pool`): where a turn's circuits can go."""
    return _pool_room({(o, a, b): n for o, a, b, n in pool})


_TURN_PORTS: IdentityMemo[Counter[tuple[str, str]]] = IdentityMemo(4)


def turn_ports(cluster: Cluster, allocation: PortAllocation) -> Counter[tuple[str, str]]:
    """(oxc, pod) -> ports a turn's circuits may take: the shared pool's, and wired ports
    no job's allocation (circuits, spare, the pool) holds (memoised per allocation). A
    free port beyond them may be an isolated job's, not connected yet: a turn on it
    leaves that job short of a circuit its allocation promised."""

    def count() -> Counter[tuple[str, str]]:
        used = allocation.used_ports()
        out: Counter[tuple[str, str]] = Counter()
        for o, a, b, n in allocation.pool:
            out[(o, a)] += n
            out[(o, b)] += n
        for oxc in cluster.oxcs:
            for pod, ports in oxc.pod_ports.items():
                if len(ports) > used.get((oxc.id, pod), 0):
                    out[(oxc.id, pod)] += len(ports) - used.get((oxc.id, pod), 0)
        return out

    return _TURN_PORTS.get((cluster, allocation), count)


def switch_room(oxc_ports: Iterable[tuple[str, str, int]]) -> dict[str, dict[str, int]]:
    """OXC -> pod -> ports, from (oxc, pod, ports) (`JobAllocation.oxc_ports`)."""
    room: dict[str, dict[str, int]] = defaultdict(dict)
    for o, pod, n in oxc_ports:
        room[o][pod] = n
    return room


def circuits_on_switches(room: Mapping[str, Mapping[str, int]], wanted: PodCircuits) -> PodCircuits:
    """The circuits of `wanted` that ports counted per switch (`room`: OXC -> pod ->
    ports) make at once, a circuit joining two ports of one OXC: `wanted` when they
    all fit; else one on each pair some switch still joins (most wanted first), then
    the rest in rounds. A pair no switch joins gets none (its traffic waits until
    ports return, or relays). Plans counted per pod (a turn on the pool, one phase in
    an isolated slice) may ask for more on a pair than any switch joins."""
    pairs = sorted(wanted.pairs(), key=lambda x: (-x[2], x[0], x[1]))
    left_room: dict[str, dict[str, int]] = {o: defaultdict(int, pods) for o, pods in room.items()}
    got: dict[tuple[str, str], int] = defaultdict(int)
    left = list(pairs)
    while left:  # round by round: one more circuit on each pair that still fits
        nxt = []
        for a, b, n in left:
            if got[(a, b)] < n and _take_roomiest(left_room, a, b) is not None:
                got[(a, b)] += 1
                nxt.append((a, b, n))
        left = nxt
    if all(got[(a, b)] >= n for a, b, n in pairs):
        return wanted
    # the greedy choice of switch can strand a pair: an exact count per switch
    if fits_on_switches(room, {(a, b): n for a, b, n in pairs}):
        return wanted
    return PodCircuits.from_pairs(wanted.pod_ids, ((a, b, n) for (a, b), n in got.items()))


def _more_circuits(
    pool: Mapping[tuple[str, str, str], int], placed: Sequence[tuple[str, str, str]], w: _Job
) -> list[tuple[str, str, str]]:
    """Circuits on `w`'s pairs the pool's ports still make once `placed` took theirs:
    the pair with most bytes per circuit first, on the OXC with most room on both pods."""
    room = _pool_room(pool)
    have: dict[tuple[str, str], int] = defaultdict(int)
    for o, a, b in placed:
        room[o][a] -= 1
        room[o][b] -= 1
        have[(a, b)] += 1
    out: list[tuple[str, str, str]] = []
    pairs = set(w.bytes)
    while pairs:
        a, b = max(pairs, key=lambda k: (w.bytes[k] / (have[k] + 1), k))
        best = _take_roomiest(room, a, b)
        if best is None:
            pairs.discard((a, b))
            continue
        have[(a, b)] += 1
        out.append((best, a, b))
    return out


def _unhosted(
    pool: Mapping[tuple[str, str, str], int], pairs: Sequence[tuple[str, str]]
) -> tuple[str, str] | None:
    """The first of a sharer's pairs its turn on the pool could not join (None: all)."""
    return _host(pool, pairs)[1]


def _host(
    pool: Mapping[tuple[str, str, str], int], pairs: Sequence[tuple[str, str]]
) -> tuple[list[tuple[str, str, str]], tuple[str, str] | None]:
    """Greedy: each pair in turn on the OXC with most pool ports free on both its pods;
    what was placed, and the first pair that found no OXC (None when every pair did)."""
    room = _pool_room(pool)
    out: list[tuple[str, str, str]] = []
    for a, b in pairs:
        best = _take_roomiest(room, a, b)
        if best is None:
            return out, (a, b)
        out.append((best, a, b))
    return out, None


def _pool_room(pool: Mapping[tuple[str, str, str], int]) -> dict[str, dict[str, int]]:
    """OXC -> pod -> the pool's ports there."""
    room: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for (o, x, y), n in pool.items():
        if n > 0:
            room[o][x] += n
            room[o][y] += n
    return room


def _take_roomiest(room: dict[str, dict[str, int]], a: str, b: str) -> str | None:
    """The OXC with most room on both pods a and b (one port of each taken), or None."""
    best = max(
        (o for o, r in room.items() if r[a] > 0 and r[b] > 0),
        key=lambda o: (min(room[o][a], room[o][b]), o),
        default=None,
    )
    if best is not None:
        room[best][a] -= 1
        room[best][b] -= 1
    return best


def _pool_key(o: str, p: str, q: str) -> tuple[str, str, str]:
    return (o, p, q) if p < q else (o, q, p)


def _take_all(
    ports: _Ports,
    pairs: Sequence[tuple[str, str]],
    make_room: Callable[[tuple[str, str]], bool] | None = None,
) -> list[tuple[str, str, str]]:
    """One circuit on each of `pairs`, all or none (pairs share pods): what was taken.

    With `make_room`, a pair with no OXC free on both pods asks it to free one
    (by shrinking other jobs) before giving up. Pairs are taken one at a time, so
    the room made for one pair is not counted again for the next on the same pod.
    """
    taken: list[tuple[str, str, str]] = []
    for a, b in pairs:
        got = ports.take(a, b, 1)
        if not got and make_room is not None and make_room((a, b)):
            got = ports.take(a, b, 1)
        if not got:
            for o, x, y in taken:
                ports.give(o, x, y, 1)
            return []
        taken.append((got[0][0], a, b))
    return taken


def _spare_wanted(
    w: _Job,
    mine: Mapping[tuple[str, str, str], int],
    spare_j: Mapping[tuple[str, str], int],
    old: JobAllocation | None,
) -> tuple[tuple[str, int], ...]:
    """(pod, ports) an isolated job `w` wants beyond its circuits `mine` and spare
    ports `spare_j`, in its demand's `want` order: on each of its pods, up to its want
    there and to what the pods it talks to from there want (a circuit needs a port at
    its other end too: a two-pod job held 16 ports on one pod facing 9 on the other).

    Kept on `old` when the job holds just what `old` lists: about 300 jobs are asked
    per event and most hold what they held.
    """
    if (
        old is not None
        and old.mode == MODE_ISOLATED
        and len(spare_j) == len(old.spare)
        and mine == _held_of(old).circuits
        and all(spare_j.get((o, pod)) == n for o, pod, n in old.spare)
    ):
        known = old._wanted
        if known is not None and (known[0] is w.d or known[0] == w.d):
            return known[1]
        wanted = _want_beyond(w, mine, spare_j)
        object.__setattr__(old, "_wanted", (w.d, wanted))
        return wanted
    return _want_beyond(w, mine, spare_j)


def _want_beyond(
    w: _Job,
    mine: Mapping[tuple[str, str, str], int],
    spare_j: Mapping[tuple[str, str], int],
) -> tuple[tuple[str, int], ...]:
    held_ports: dict[str, int] = defaultdict(int)
    for (_, a, b), n in mine.items():
        held_ports[a] += n
        held_ports[b] += n
    for (_, pod), n in spare_j.items():
        held_ports[pod] += n
    d = w.d
    want_on = dict(d.want)
    facing: dict[str, int] = defaultdict(int)
    for a, b, _ in d.pair_bytes:
        facing[a] += want_on.get(b, 0)
        facing[b] += want_on.get(a, 0)
    out = []
    for pod, want in d.want:
        if pod in held_ports or pod in w.pod_set:
            more = min(want, facing[pod]) - held_ports[pod]
            if more > 0:
                out.append((pod, more))
    return tuple(out)


def _release_spare(
    ports: _Ports, spare: dict[str, dict[tuple[str, str], int]], pods: set[str]
) -> bool:
    """Give back every job's spare ports on `pods` (headroom yields to a new job)."""
    freed = False
    for held in spare.values():
        for (o, pod), n in list(held.items()):
            if pod in pods and n > 0:
                ports.free[pod][ports.index[o]] += n
                held[(o, pod)] = 0
                freed = True
    return freed


def _shrink_for(
    ports: _Ports,
    circuits: dict[str, dict[tuple[str, str, str], int]],
    work: Mapping[str, _Job],
    isolated: Sequence[str],
    pairs: Sequence[tuple[str, str]],
    port_bps: float,
    below: float = math.inf,
    cache: _DonorCache | None = None,
) -> bool:
    """Free one port on both pods of each pair on a common OXC by shrinking others.

    Donors are isolated jobs with more than one circuit on the pair they give up
    (never below their minimum) whose estimated slowdown after giving stays
    below `below`. Of the OXCs where donors can free the pair, the one whose
    donors end least slowed gives (on each, a circuit joining both pods first,
    then the donor its loss slows least). Changes only the donors. False when
    some pair cannot be freed.

    A caller that asks again while no donor gains a circuit on a new OXC and pair
    (an arrival's rebalance) may keep a `cache` between calls.
    """
    cache = _DonorCache() if cache is None else cache
    index, without = cache.index, cache.without

    def after(j: str, key: tuple[str, str, str]) -> float:
        # the same on every OXC: a circuit fewer on the pair is what slows the donor
        mine = without.get(j)
        if mine is None:
            mine = without[j] = {}
        pair = (key[1], key[2])
        got = mine.get(pair)
        if got is None:
            got = mine[pair] = _slowdown_without(work[j], key, port_bps)
        return got

    for a, b in pairs:
        if ports.room(a, b) >= 1:
            continue
        on_oxc = index.get((a, b))
        if on_oxc is None:
            on_oxc = index[(a, b)] = _donor_index(circuits, work, isolated, a, b)
        heaps = cache.heaps.setdefault((a, b), {})
        best: tuple[float, list[tuple[str, tuple[str, str, str]]]] | None = None
        for i, oxc in enumerate(ports.oxcs):
            need_a, need_b = ports.free[a][i] <= 0, ports.free[b][i] <= 0
            by_pod = heaps.get(oxc)
            if by_pod is None:
                by_pod = heaps[oxc] = _donor_heaps(on_oxc.get(oxc, ()), a, b, after)
            both, on_a, on_b = by_pod
            nearest = on_a if need_a else on_b  # holds `both`'s entries too
            if not nearest or (best is not None and nearest[0][0] >= best[0]):
                # no donor here, or none that can beat the best OXC so far: a heap's top
                # never overstates its least (values only grow), so it is not looked at
                continue
            # the least of (-pods freed, slowdown after giving, job, circuit): a circuit
            # between both needed pods frees both at once, else one per needed pod
            first = (_least(both, circuits, work, after, below) if need_a and need_b else None) or (
                _least(on_a if need_a else on_b, circuits, work, after, below)
            )
            if first is None or (best is not None and first[0] >= best[0]):
                continue  # none here, or no better than the best OXC so far (cost >= first's)
            plan = [(first[1], first[2])]
            cost = first[0]
            freed = first[2][1:]
            if (need_a and a not in freed) or (need_b and b not in freed):
                second = _least(
                    on_b if need_b and b not in freed else on_a, circuits, work, after, below
                )
                if second is None:
                    continue
                plan.append((second[1], second[2]))
                cost = max(cost, second[0])
            if best is None or cost < best[0]:
                best = (cost, plan)
        if best is None:
            return False
        for j, key in best[1]:
            circuits[j][key] -= 1
            work[j].have[(key[1], key[2])] -= 1
            ports.give(key[0], key[1], key[2], 1)
            cache.gave.add(j)
            without.pop(j, None)
    return True


def _shrink_pair(
    ports: _Ports,
    circuits: dict[str, dict[tuple[str, str, str], int]],
    work: Mapping[str, _Job],
    isolated: Sequence[str],
    port_bps: float,
    cache: _DonorCache | None,
    pair: tuple[str, str],
) -> bool:
    """`_shrink_for` one pair (an arrival's `_take_all` makes room with it)."""
    return _shrink_for(ports, circuits, work, isolated, [pair], port_bps, cache=cache)


# OXC -> (job, circuit key) of the donors' circuits that touch a pair's pods
_DonorIndex = dict[str, list[tuple[str, tuple[str, str, str]]]]
# (slowdown after giving, job, circuit): a heap, least first
_DonorHeap = list[tuple[float, str, tuple[str, str, str]]]


def _donor_heaps(
    held: Sequence[tuple[str, tuple[str, str, str]]],
    a: str,
    b: str,
    after: Callable[[str, tuple[str, str, str]], float],
) -> tuple[_DonorHeap, _DonorHeap, _DonorHeap]:
    """One OXC's donor circuits for pair (a, b): those joining a and b, those on a,
    those on b (a circuit joining both is in all three)."""
    both: _DonorHeap = []
    on_a: _DonorHeap = []
    on_b: _DonorHeap = []
    for j, key in held:
        entry = (after(j, key), j, key)
        x, y = key[1], key[2]
        touches_a, touches_b = a in (x, y), b in (x, y)
        if touches_a and touches_b:
            both.append(entry)
        if touches_a:
            on_a.append(entry)
        if touches_b:
            on_b.append(entry)
    for h in (both, on_a, on_b):
        heapq.heapify(h)
    return both, on_a, on_b


def _least(
    heap: _DonorHeap,
    circuits: Mapping[str, Mapping[tuple[str, str, str], int]],
    work: Mapping[str, _Job],
    after: Callable[[str, tuple[str, str, str]], float],
    below: float,
) -> tuple[float, str, tuple[str, str, str]] | None:
    """The heap's least donor that may give (one circuit more than its minimum on the
    pair) and stays below `below`; None if none does.

    Lazy: while a cache lives donors only give, so a circuit that may not give never
    may again (dropped), and a donor's slowdown after giving only grows (an entry
    whose value went up is pushed back with it; the least is then exact)."""
    while heap:
        v, j, key = heap[0]
        if circuits[j][key] <= 0 or work[j].have[(key[1], key[2])] <= 1:
            heapq.heappop(heap)
            continue
        now = after(j, key)
        if now != v:
            heapq.heapreplace(heap, (now, j, key))
            continue
        return None if below != math.inf and not v < below else (v, j, key)
    return None


class _DonorCache:
    """What `_shrink_for` learns of the donors, valid while none gains a circuit key:
    per pair their circuits by OXC (counts are read live), per donor and pair its
    slowdown with a circuit fewer there (a donor that gives is dropped from it; `gave`
    collects the donors)."""

    __slots__ = ("index", "heaps", "without", "gave")

    def __init__(self, gave: set[str] | None = None) -> None:
        self.index: dict[tuple[str, str], _DonorIndex] = {}
        # per pair and OXC, its donors' circuits as heaps (`_donor_heaps`)
        self.heaps: dict[tuple[str, str], dict[str, tuple[_DonorHeap, _DonorHeap, _DonorHeap]]] = {}
        self.without: dict[str, dict[tuple[str, str], float]] = {}  # by donor, pair
        self.gave: set[str] = set() if gave is None else gave  # donors that gave


def _donor_index(
    circuits: Mapping[str, Mapping[tuple[str, str, str], int]],
    work: Mapping[str, _Job],
    isolated: Sequence[str],
    a: str,
    b: str,
) -> _DonorIndex:
    """The circuits of `isolated` jobs on pod a or b, by OXC (counts are read live)."""
    on_oxc: _DonorIndex = defaultdict(list)
    for j in isolated:
        if a not in work[j].pod_set and b not in work[j].pod_set:
            continue
        for key in circuits.get(j, {}):
            _, x, y = key
            if x == a or y == a or x == b or y == b:
                on_oxc[key[0]].append((j, key))
    return on_oxc


def _slowdown_without(w: _Job, key: tuple[str, str, str], port_bps: float) -> float:
    """The job's estimated slowdown with one circuit fewer on the key's pair."""
    pair = (key[1], key[2])
    w.have[pair] -= 1
    try:
        return w.slowdown(port_bps)
    finally:
        w.have[pair] += 1


def _rebalance_for(
    job_id: str,
    ports: _Ports,
    circuits: dict[str, dict[tuple[str, str, str], int]],
    work: Mapping[str, _Job],
    isolated: Sequence[str],
    port_bps: float,
    cache: _DonorCache,
) -> None:
    """Water-filling for an arrival on top of what runs: the new job takes circuits
    from jobs on its pods while they stay less slowed than it is (one at a time).
    `cache` holds what earlier shrinks for this job learnt of the donors."""
    w = work[job_id]
    mine = circuits.setdefault(job_id, {})
    near = w.pod_set
    # donors by pod: a pair's shrink looks only at the jobs on its two pods; their
    # circuits by OXC and their slowdowns are kept between shrinks (only this job
    # gains circuits here, donors only give)
    donors: dict[str, list[str]] = {p: [] for p in near}
    for x in isolated:
        if x != job_id:
            for p in work[x].pods:
                if p in near:
                    donors[p].append(x)
    for _ in range(sum(w.cap.values())):
        pair = w.bottleneck()
        if pair is None:
            return
        # the pair's own slowdown with one more circuit: donors give while they stay
        # below it (the job's slowdown is its slowest pair's, so with several pairs
        # at one level no single circuit lowers it, yet each is needed)
        gain = w.pair_slowdown(pair, w.have[pair] + 1, port_bps)
        if not ports.room(*pair) and not _shrink_for(
            ports,
            circuits,
            work,
            list(dict.fromkeys(donors[pair[0]] + donors[pair[1]])),
            [pair],
            port_bps,
            below=gain,
            cache=cache,
        ):
            return
        got = ports.take(pair[0], pair[1], 1)
        if not got:
            return
        key = (got[0][0], pair[0], pair[1])
        mine[key] = mine.get(key, 0) + 1
        w.have[pair] += 1


def _cut_off(cluster: Cluster, a: str, b: str, others: int) -> str:
    """Why a sharer's turn cannot join pods a and b."""
    if (a, b) in cluster.oxc_joined_pods:
        why = f"every OXC port that could join {a} and {b} is held"
    else:
        why = f"no OXC has a working port on both {a} and {b}"
    return (
        f"{why}: it takes turns with {others} other job(s), and its traffic between them "
        "waits until ports return"
    )


def _rebalance_repaired(
    prev_jobs: Mapping[str, JobAllocation],
    ports: _Ports,
    circuits: dict[str, dict[tuple[str, str, str], int]],
    spare: dict[str, dict[tuple[str, str], int]],
    work: Mapping[str, _Job],
    isolated: Sequence[str],
    port_bps: float,
    gave: set[str],
) -> None:
    """`_rebalance_for` each isolated job holding fewer circuits than before (most slowed
    first), its own spare ports on its pods free for it first."""
    short = []
    for j in isolated:
        was = prev_jobs.get(j)
        held = sum(n for _, _, _, n in was.circuits) if was is not None else 0
        if was is None or was.mode != MODE_ISOLATED or sum(circuits.get(j, {}).values()) < held:
            short.append(j)
    for j in sorted(short, key=lambda x: (-work[x].slowdown(port_bps), work[x].rank)):
        _release_spare(ports, {j: spare[j]}, set(work[j].pods))
        _rebalance_for(j, ports, circuits, work, isolated, port_bps, _DonorCache(gave))


def _latest_holding(
    isolated: Sequence[str],
    circuits: Mapping[str, Mapping[tuple[str, str, str], int]],
    work: Mapping[str, _Job],
    a: str,
    b: str,
) -> str | None:
    """The latest isolated job holding a port on pod a or b (it joins the turns)."""
    for j in sorted(isolated, key=lambda x: -work[x].rank):
        held = circuits.get(j, {})
        if any(n > 0 and (x in (a, b) or y in (a, b)) for (_, x, y), n in held.items()):
            return j
    return None


CORE_FASTER = "its circuits are slower than its share of the electrical core"
ISOLATED_REASON = "isolated circuits by demand"


def slowdown_note(slowdown: float) -> str:
    """The estimate as a reason states it."""
    return f" (est. slowdown {slowdown:.2f}x)"


def _chose_core(ja: JobAllocation) -> bool:
    return ja.mode == MODE_ELECTRICAL and ja.reason.startswith(CORE_FASTER)


def _elect_core(
    work: Mapping[str, _Job],
    isolated: list[str],
    electrical: list[str],
    circuits: dict[str, dict[tuple[str, str, str], int]],
    ports: _Ports,
    electrical_gbps: Mapping[str, float],
    port_bps: float,
) -> list[str]:
    """Step 4: move isolated jobs to the electrical core where that pays (most slowed
    first); returns the jobs moved."""
    on: dict[str, int] = defaultdict(int)
    for x in electrical:
        for p in work[x].pods:
            on[p] += 1
    moved = []
    for j in sorted(isolated, key=lambda x: (-work[x].slowdown(port_bps), work[x].rank)):
        w = work[j]
        if any(electrical_gbps.get(p, 0.0) <= 0 for p in w.pods):
            continue
        near = [x for x in electrical if work[x].pod_set & w.pod_set]
        with_j = defaultdict(int, on)
        for p in w.pods:
            with_j[p] += 1
        before = w.d.compute_s + w.net_s(w.have, port_bps)
        before += sum(_electrical_s(work[x], electrical_gbps, on, port_bps) for x in near)
        after = sum(_electrical_s(work[x], electrical_gbps, with_j, port_bps) for x in [j, *near])
        if after >= before * CORE_GAIN:
            continue
        isolated.remove(j)
        electrical.append(j)
        moved.append(j)
        on = defaultdict(int, with_j)
        for (o, a, b), n in circuits.pop(j, {}).items():
            ports.give(o, a, b, n)
        w.have = {k: 0 for k in w.bytes}
    return moved


def _electrical_s(
    w: _Job, electrical_gbps: Mapping[str, float], jobs_on: Mapping[str, int], port_bps: float
) -> float:
    """Iteration time over the pods' electrical uplinks, split among the jobs there (no
    faster than on the circuits that make the job non-blocking: its NICs bound it)."""
    out = pod_bytes(w.bytes)
    if any(electrical_gbps.get(p, 0.0) <= 0 for p in out):
        return math.inf
    nics = dict(w.d.nics or w.d.want)
    net = max(
        max(
            x / (electrical_gbps[p] * 1e9 / 8 / max(1, jobs_on.get(p, 1))),
            x / (max(1, nics.get(p, 0)) * port_bps),
        )
        for p, x in out.items()
    )
    return w.d.compute_s + net


def pod_bytes(pair_bytes: Mapping[tuple[str, str], float]) -> dict[str, float]:
    """Bytes per pod over its pairs (each pair's busier way): what a pod's uplinks carry
    per iteration, each way."""
    out: dict[str, float] = defaultdict(float)
    for (a, b), x in pair_bytes.items():
        out[a] += x
        out[b] += x
    return dict(out)


# ------------------------------------------------------------------ cross-connects


def pair_circuits(cluster: Cluster, circuits: Iterable[tuple[str, str, str, int]]) -> PodCircuits:
    """The pod circuit matrix of (oxc, pod_a, pod_b, n) entries."""
    return PodCircuits.from_pairs(
        tuple(p.id for p in cluster.pods), ((a, b, n) for _, a, b, n in circuits)
    )


def map_allocation(
    cluster: Cluster,
    wanted: Mapping[str, Iterable[tuple[str, str, str, int]]],
    current: Iterable[CrossConnect],
    occupied: Iterable[tuple[str, int]] = (),
) -> CrossConnectMapping:
    """Cross-connects for each job's allocated circuits, on exactly the OXCs allocated.

    The allocation already found an OXC with a free port on both pods for every
    circuit, so mapping per OXC never runs short where the allocation's budgets
    hold. A job's current cross-connect on the same OXC and pod pair is kept;
    the rest go on the lowest free ports. `occupied` ports (jobs left out) are
    never used. Circuits that find no port (the fabric changed underneath) are
    reported in `unmapped`.
    """
    where = port_pods(cluster)
    need: dict[tuple[str, str, str, str], int] = defaultdict(int)  # (job, oxc, a, b)
    for job, circuits in wanted.items():
        for o, a, b, n in circuits:
            key = (job, o, a, b) if a < b else (job, o, b, a)
            need[key] += n
    used: set[tuple[str, int]] = set(occupied)
    kept: list[CrossConnect] = []
    # (a repeated cross-connect finds its ports used: kept once)
    for cc in current:
        if cc.job_id not in wanted:
            continue
        o = cc.oxc_id
        port_a, port_b = (o, cc.port_a), (o, cc.port_b)
        pa, pb = where.get(port_a), where.get(port_b)
        if pa is None or pb is None or pa == pb:
            continue
        key = (cc.job_id, o, pa, pb) if pa < pb else (cc.job_id, o, pb, pa)
        if need.get(key, 0) <= 0 or port_a in used or port_b in used:
            continue
        need[key] -= 1
        kept.append(cc)
        used.add(port_a)
        used.add(port_b)
    by_id = {o.id: o for o in cluster.oxcs}
    free: dict[tuple[str, str], list[int]] = {}

    def free_ports(oxc_id: str, pod: str) -> list[int]:
        got = free.get((oxc_id, pod))
        if got is None:
            oxc = by_id.get(oxc_id)
            ports = oxc.pod_ports.get(pod, ()) if oxc is not None else ()
            got = sorted((p for p in ports if (oxc_id, p) not in used), reverse=True)
            free[(oxc_id, pod)] = got
        return got

    added: list[CrossConnect] = []
    unmapped: list[tuple[str, str, str, int]] = []
    for (job, o, a, b), n in sorted(need.items()):
        if n <= 0:
            continue
        fa, fb = free_ports(o, a), free_ports(o, b)
        k = min(n, len(fa), len(fb))
        for _ in range(k):
            added.append(CrossConnect.of(o, fa.pop(), fb.pop(), job))
        if k < n:
            unmapped.append((job, a, b, n - k))
    return CrossConnectMapping(
        tuple(sorted(kept + added, key=physical_order)), tuple(unmapped), len(kept), len(added)
    )

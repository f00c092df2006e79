"""Concrete cross-connects: circuit matrices mapped onto OXC port pairs, with minimal change.

Pure functions; must not import anything that does I/O (no FastAPI, SQLAlchemy,
Redis, pydantic) or read a clock.

A cross-connect joins two ports of one OXC, each wired to a pod's uplink, so a
circuit between pods p and q needs an OXC where both still have a free port.
`map_cross_connects` keeps every existing cross-connect that still serves its
job's wanted circuits, then places the missing circuits on the OXC where both
pods have the most free ports (balancing keeps later circuits placeable).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter, is_

from .circuits import PodCircuits
from .cluster import Cluster
from .memo import IdentityMemo


@dataclass(frozen=True, slots=True, order=True)
class CrossConnect:
    """Ports `port_a` < `port_b` of OXC `oxc_id` joined for `job_id`'s circuit."""

    oxc_id: str
    port_a: int
    port_b: int
    job_id: str

    def __post_init__(self) -> None:
        if not self.port_a < self.port_b:
            raise ValueError("a cross-connect joins two distinct ports, port_a < port_b")

    @staticmethod
    def of(oxc_id: str, a: int, b: int, job_id: str) -> CrossConnect:
        """A cross-connect with its ports in canonical (ascending) order."""
        return CrossConnect(oxc_id, min(a, b), max(a, b), job_id)

    @property
    def key(self) -> tuple[str, int, int]:
        """The physical identity: which ports are joined, whoever it is for."""
        return (self.oxc_id, self.port_a, self.port_b)


@dataclass(frozen=True, slots=True)
class OxcChange:
    """Port pairs one OXC must connect and disconnect, and those it keeps joined that
    pass to this change's job from another (`handover`: (port_a, port_b, from_job))."""

    oxc_id: str
    connect: tuple[tuple[int, int], ...]
    disconnect: tuple[tuple[int, int], ...]
    handover: tuple[tuple[int, int, str], ...] = ()

    @property
    def moves(self) -> bool:
        """Does the switch change (a handover alone changes only whose a circuit is)?"""
        return bool(self.connect or self.disconnect)

    def to_dict(self) -> dict[str, object]:
        """The `oxc` object of a GET /v1/decisions entry (`handover` only when some)."""
        out: dict[str, object] = {
            "id": self.oxc_id,
            "connect": [list(p) for p in self.connect],
            "disconnect": [list(p) for p in self.disconnect],
        }
        if self.handover:
            out["handover"] = [{"ports": [a, b], "from_job": job} for a, b, job in self.handover]
        return out


@dataclass(frozen=True, slots=True)
class CrossConnectMapping:
    """Desired cross-connects, circuits no OXC could hold, and change counts."""

    cross_connects: tuple[CrossConnect, ...]
    unmapped: tuple[tuple[str, str, str, int], ...]  # (job_id, pod_a, pod_b, circuits)
    kept: int
    added: int


_PORT_PODS: IdentityMemo[dict[tuple[str, int], str]] = IdentityMemo(8)


def port_pods(cluster: Cluster) -> dict[tuple[str, int], str]:
    """(oxc_id, port) -> the pod whose uplink is wired there (memoised per cluster)."""
    return _PORT_PODS.get(
        (cluster,),
        lambda: {
            (o.id, port): pod
            for o in cluster.oxcs
            for pod, ports in o.pod_ports.items()
            for port in ports
        },
    )


# sort key of cross-connects in physical order: `CrossConnect.key`, computed in C
physical_order = attrgetter("oxc_id", "port_a", "port_b")


def realised_circuits(
    cluster: Cluster, cross_connects: Iterable[CrossConnect], job_id: str | None = None
) -> PodCircuits:
    """The pod circuit matrix the cross-connects make (of one job, or all)."""
    where = port_pods(cluster)
    pairs = []
    for cc in cross_connects:
        if job_id is not None and cc.job_id != job_id:
            continue
        a, b = where.get((cc.oxc_id, cc.port_a)), where.get((cc.oxc_id, cc.port_b))
        if a is not None and b is not None and a != b:
            pairs.append((a, b, 1))
    return PodCircuits.from_pairs(tuple(p.id for p in cluster.pods), pairs)


def map_cross_connects(
    cluster: Cluster,
    wanted: Mapping[str, PodCircuits],
    current: Iterable[CrossConnect],
    occupied: Iterable[tuple[str, int]] = (),
    budget: Mapping[tuple[str, str], int] | None = None,
) -> CrossConnectMapping:
    """Cross-connects realising each job's wanted circuits, keeping current ones that fit.

    Current cross-connects of jobs not in `wanted`, or beyond a job's wanted count
    for their pod pair, are dropped. Circuits no OXC has free ports for are
    reported in `unmapped`, never placed on a used port. `occupied` ports (held by
    jobs left out of `wanted`, whose cross-connects stay as they are) are never used.
    `budget` ((oxc, pod) -> ports), for one job in `wanted`: the ports its allocation
    gives it on each switch and pod, which its cross-connects, kept or new, stay within
    (a free port beyond it may be another job's, not connected yet).
    """
    where = port_pods(cluster)
    need: dict[str, dict[tuple[str, str], int]] = {
        job: {(a, b): n for a, b, n in circ.pairs()} for job, circ in wanted.items()
    }
    kept: list[CrossConnect] = []
    used: set[tuple[str, int]] = set(occupied)
    held: Counter[tuple[str, str]] = Counter()  # ports kept per (oxc, pod)
    for cc in current:  # in order (a repeated one finds its ports used: kept once)
        wants = need.get(cc.job_id)
        if wants is None:
            continue
        port_a, port_b = (cc.oxc_id, cc.port_a), (cc.oxc_id, cc.port_b)
        a, b = where.get(port_a), where.get(port_b)
        if a is None or b is None or a == b or port_a in used or port_b in used:
            continue
        if budget is not None and not (
            held[(cc.oxc_id, a)] < budget.get((cc.oxc_id, a), 0)
            and held[(cc.oxc_id, b)] < budget.get((cc.oxc_id, b), 0)
        ):
            continue  # beyond what its allocation gives it on this switch
        pair = (a, b) if (a, b) in wants else (b, a)
        if wants.get(pair, 0) > 0:
            wants[pair] -= 1
            kept.append(cc)
            used.add(port_a)
            used.add(port_b)
            held[(cc.oxc_id, a)] += 1
            held[(cc.oxc_id, b)] += 1
    free: dict[tuple[str, str], list[int]] = defaultdict(list)
    short = {pod for job in need.values() for pair, n in job.items() if n > 0 for pod in pair}
    for o in cluster.oxcs:
        for pod, ports in o.pod_ports.items():
            if pod not in short:
                continue
            # descending, so pop() hands out the lowest free port
            free[(o.id, pod)] = sorted((p for p in ports if (o.id, p) not in used), reverse=True)
            if budget is not None:
                # the lowest free ports, as many as the job's allocation leaves it here
                ports_free = free[(o.id, pod)]
                room = max(0, budget.get((o.id, pod), 0) - held[(o.id, pod)])
                free[(o.id, pod)] = ports_free[max(0, len(ports_free) - room) :]
    oxc_ids = [o.id for o in cluster.oxcs]
    spare = {k: list(v) for k, v in free.items()}  # before the greedy pass takes any
    added, unmapped = _map_greedy(oxc_ids, need, free)
    if unmapped:
        # the greedy choice of switch can strand a pair whose pods have free ports
        # only on different OXCs; an exact assignment of counts per OXC fixes that
        exact = _map_exact(oxc_ids, need, spare)
        if exact is not None and len(exact[1]) < len(unmapped):
            added, unmapped = exact
    mapping = CrossConnectMapping(
        tuple(sorted(kept + added, key=physical_order)), tuple(unmapped), len(kept), len(added)
    )
    if unmapped and budget is not None and kept:
        # what it kept used up a pod's ports on a switch where another pair needed them
        # (a per-phase topology going back to the held one): mapped afresh within the
        # same budget, if that realises more, its kept cross-connects are rebuilt
        fresh = map_cross_connects(cluster, wanted, (), occupied, budget)
        if len(fresh.unmapped) < len(unmapped):
            return fresh
    return mapping


_Need = Mapping[str, Mapping[tuple[str, str], int]]
_Free = dict[tuple[str, str], list[int]]


def _map_greedy(
    oxc_ids: list[str], need: _Need, free: _Free
) -> tuple[list[CrossConnect], list[tuple[str, str, str, int]]]:
    """Each circuit on the OXC with most free ports on both its pods (lowest id on ties)."""
    added: list[CrossConnect] = []
    unmapped: list[tuple[str, str, str, int]] = []
    for job in sorted(need):
        for (a, b), n in sorted(need[job].items(), key=lambda kv: (-kv[1], kv[0])):
            for k in range(n):
                best = max(
                    oxc_ids,
                    key=lambda o: (min(len(free[(o, a)]), len(free[(o, b)])), -oxc_ids.index(o)),
                )
                if not free[(best, a)] or not free[(best, b)]:
                    unmapped.append((job, a, b, n - k))
                    break
                added.append(
                    CrossConnect.of(best, free[(best, a)].pop(), free[(best, b)].pop(), job)
                )
    return added, unmapped


def _map_exact(
    oxc_ids: list[str], need: _Need, free: _Free
) -> tuple[list[CrossConnect], list[tuple[str, str, str, int]]] | None:
    """Most circuits mapped: an integer program over circuits per (OXC, pod pair).

    Ports are interchangeable within an OXC and pod, so only counts matter: at
    most the free ports of each pod on each OXC, at most the wanted circuits of
    each pair. Solved with HiGHS (scipy, loaded here); None if it finds nothing.
    """
    import numpy as np
    from scipy.optimize import Bounds, LinearConstraint, milp

    pairs = sorted({pair for job in need.values() for pair, n in job.items() if n > 0})
    if not pairs or not oxc_ids:
        return None
    wanted = [sum(job.get(pair, 0) for job in need.values()) for pair in pairs]
    nv = len(oxc_ids) * len(pairs)
    rows, caps = [], []
    for oi, o in enumerate(oxc_ids):
        for pod in sorted({p for pair in pairs for p in pair}):
            row = np.zeros(nv)
            for k, pair in enumerate(pairs):
                if pod in pair:
                    row[oi * len(pairs) + k] = 1
            rows.append(row)
            caps.append(len(free.get((o, pod), ())))
    for k in range(len(pairs)):
        row = np.zeros(nv)
        row[k :: len(pairs)] = 1
        rows.append(row)
        caps.append(wanted[k])
    result = milp(
        -np.ones(nv),
        constraints=LinearConstraint(np.array(rows), -np.inf, np.array(caps, dtype=float)),
        integrality=np.ones(nv),
        bounds=Bounds(0, np.inf),
        options={"time_limit": 2.0},
    )
    if result.x is None:
        return None
    counts = {
        (o, pair): int(round(result.x[oi * len(pairs) + k]))
        for oi, o in enumerate(oxc_ids)
        for k, pair in enumerate(pairs)
    }
    free = {key: list(ports) for key, ports in free.items()}
    left = {job: dict(n) for job, n in need.items()}
    added: list[CrossConnect] = []
    for (o, (a, b)), n in sorted(counts.items()):
        for _ in range(n):
            job = next((j for j in sorted(left) if left[j].get((a, b), 0) > 0), None)
            if job is None:
                break
            left[job][(a, b)] -= 1
            added.append(CrossConnect.of(o, free[(o, a)].pop(), free[(o, b)].pop(), job))
    unmapped = [
        (job, a, b, n) for job in sorted(left) for (a, b), n in sorted(left[job].items()) if n > 0
    ]
    return added, unmapped


def fits_on_switches(
    room: Mapping[str, Mapping[str, int]], wanted: Mapping[tuple[str, str], int]
) -> bool:
    """Whether every circuit of `wanted` (per pod pair) fits ports counted per OXC and
    pod (`room`: OXC -> pod -> ports), a circuit taking one port of each of its pods
    on one switch: the exact count, for when a greedy choice of switch fell short."""
    free: _Free = {}
    n_ports = 0
    for o, pods in room.items():
        for pod, k in pods.items():  # stand-in port numbers: only counts matter
            free[(o, pod)] = list(range(n_ports, n_ports + k))
            n_ports += k
    exact = _map_exact(sorted(room), {"": wanted}, free)
    return exact is not None and not exact[1]


def cross_connects_by_job(
    cross_connects: Sequence[CrossConnect],
    grouped: Callable[[], Mapping[str, tuple[CrossConnect, ...]]] | None = None,
) -> Mapping[str, tuple[CrossConnect, ...]]:
    """Each job's cross-connects, in their order in `cross_connects` (memoised per tuple).

    A fabric of 300 jobs holds thousands of cross-connects and an event changes a few
    jobs' of them: grouped once per tuple, comparing two tuples or finding a job's
    cross-connects costs what the changed jobs hold, not what the fabric holds.
    `grouped`: the same answer, worked out from what the caller knows (a plan that
    changed a few jobs' cross-connects knows the others' groups already).
    """
    return _BY_JOB.get((cross_connects,), grouped or (lambda: _group_by_job(cross_connects)))


def _group_by_job(cross_connects: Iterable[CrossConnect]) -> dict[str, tuple[CrossConnect, ...]]:
    out: dict[str, list[CrossConnect]] = defaultdict(list)
    for cc in cross_connects:
        out[cc.job_id].append(cc)
    return {job_id: tuple(ccs) for job_id, ccs in out.items()}


# a plan's tuple is grouped when it is diffed against the one before, and again used
# as the next plan's `current`: a handful of recent tuples is all that is asked about
_BY_JOB: IdentityMemo[Mapping[str, tuple[CrossConnect, ...]]] = IdentityMemo(8)


def changed_cross_connects(
    before: Sequence[CrossConnect], after: Sequence[CrossConnect]
) -> tuple[tuple[CrossConnect, ...], tuple[CrossConnect, ...]]:
    """(in `before` only, in `after` only), each in physical order (`CrossConnect.key`).

    Compared job by job: plans keep the very objects of jobs they leave alone, so
    those are skipped by identity; a changed job's are compared
    by identity, then by value (a cross-connect in both, equal though not the same
    object, is in neither). A cross-connect belongs to one job, so equal ones are
    always the same job's.
    """
    was, now = cross_connects_by_job(before), cross_connects_by_job(after)
    gone: list[CrossConnect] = []
    new: list[CrossConnect] = []
    for job_id, old in was.items():
        cur = now.get(job_id, ())
        if len(cur) == len(old) and all(map(is_, cur, old)):
            continue  # the very same objects
        old_ids, cur_ids = {id(cc) for cc in old}, {id(cc) for cc in cur}
        lost = [cc for cc in old if id(cc) not in cur_ids]
        got = [cc for cc in cur if id(cc) not in old_ids]
        if lost and got:
            same = set(lost) & set(got)
            lost = [cc for cc in lost if cc not in same]
            got = [cc for cc in got if cc not in same]
        gone += lost
        new += got
    for job_id, cur in now.items():
        if job_id not in was:
            new += cur
    gone.sort(key=physical_order)
    new.sort(key=physical_order)
    return tuple(gone), tuple(new)


def diff_cross_connects(
    current: Iterable[CrossConnect], desired: Iterable[CrossConnect]
) -> tuple[OxcChange, ...]:
    """Per OXC, the port pairs to disconnect and connect to go from `current` to `desired`.

    Identity is physical (oxc, port_a, port_b): re-tagging a cross-connect to
    another job changes nothing on the switch.
    """
    now = {cc.key for cc in current}
    want = {cc.key for cc in desired}
    oxcs = sorted({k[0] for k in now ^ want})
    return tuple(
        OxcChange(
            o,
            tuple(sorted((a, b) for ox, a, b in want - now if ox == o)),
            tuple(sorted((a, b) for ox, a, b in now - want if ox == o)),
        )
        for o in oxcs
    )

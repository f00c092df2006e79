"""Queue policies and backfill: which queued jobs to admit now, and where.

Pure functions; no I/O imports. `admit_queued` is the one entry point the worker
and the simulator call after any arrival or completion.

Every policy orders by priority (higher first), then by its own key, then by
arrival. With backfill on, when the head job does not fit, it gets a
reservation: exactly the servers of the EP slots it will use once the jobs
running there finish (ToRs with the most free servers first). Later jobs may
start only on servers outside the reservation, so backfill never delays the head
job.

With runtime estimates (`walltime_s` of the queued jobs, `busy_until` of the
running ones) this is EASY backfill proper: the head's reserved start is when
the last running job holding a reserved server is expected to end, and a job
with a `walltime_s` that ends by then may also use reserved servers, since they
are free again when the head starts. A reserved server held by a job without an
estimate makes the reserved start unknown; then only the spatial rule applies.

`place` defaults to `place_job`; pass
`functools.partial(place_job, aggregator_free_gbps=...)` to steer INC load.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass
from enum import StrEnum

from .cluster import Cluster, Tor
from .job import Job, Placement, Unplaceable
from .placement import place_job


class QueuePolicy(StrEnum):
    """Order of service: arrival, fewest servers first, or earliest deadline first."""

    FIFO = "fifo"
    SMALLEST_FIRST = "smallest-first"
    EDF = "edf"


_KEYS: dict[QueuePolicy, Callable[[Job], tuple[float, ...]]] = {
    QueuePolicy.FIFO: lambda j: (-j.priority, j.submitted_order),
    QueuePolicy.SMALLEST_FIRST: lambda j: (-j.priority, j.servers_needed, j.submitted_order),
    QueuePolicy.EDF: lambda j: (
        -j.priority,
        j.deadline if j.deadline is not None else math.inf,
        j.submitted_order,
    ),
}


def needs_servers(needed: int, free: int, how: str = "") -> str:
    """A queued job's wait as its `queue_reason` states it ("needs 1 server, 0 free");
    `how` follows the count (" in EP groups of 8 servers inside a pod")."""
    return f"needs {needed} server{'' if needed == 1 else 's'}{how}, {free} free"


def order_queue(queue: Sequence[Job], policy: QueuePolicy) -> list[Job]:
    """The queue in the order `policy` serves it."""
    return sorted(queue, key=_KEYS[policy])


@dataclass(frozen=True, slots=True)
class Admission:
    """What to start now, and which servers are held for the blocked head job."""

    placements: tuple[Placement, ...]
    reserved_for: str | None = None
    reserved_servers: frozenset[str] = frozenset()
    reserved_start: float | None = None  # when the head is expected to start, if known


PlaceFn = Callable[[Cluster, Set[str], Job], Placement | Unplaceable]


def reserve_for(cluster: Cluster, free: Set[str], job: Job) -> frozenset[str]:
    """Servers held for the blocked head `job`: exactly its EP slots, in as few pods as it can.

    A head that one ToR holds takes the ToR with the most free servers (fewest
    running jobs to wait for); a head that needs several takes them pod by pod,
    emptiest pods first, so it spans no more pods than it must (fewer circuits;
    and `place_job` with `max_extra_pods` would not place it on scattered ToRs). In each
    ToR it holds only the servers its EP groups need, free ones before busy ones,
    so the rest of the ToR stays open to backfill. Once the busy servers in the
    reservation are released the head fits there: `place_job` needs nothing but
    whole-ToR EP slots, and backfilled jobs never take a reserved server. When
    ToRs cannot hold its EP groups whole, it holds whole groups' worth per pod.
    """
    ep = job.parallelism.ep
    need = job.parallelism.dp * job.parallelism.pp
    pod_free = {p.id: sum(1 for s in p.servers if s.id in free) for p in cluster.pods}
    candidates = [t for p in cluster.pods for t in p.tors if len(t.servers) >= ep]
    groups = {t.id: sum(1 for s in t.servers if s.id in free) // ep for t in candidates}
    one_tor = any(len(t.servers) // ep >= need for t in candidates)

    def key(t: Tor) -> tuple[int, str, int, str]:
        if one_tor:  # the ToR with the most room, whichever pod it is in
            return (-groups[t.id], "", -pod_free[t.pod_id], t.id)
        # several ToRs: in the emptiest pods, so the head does not span more pods
        return (-pod_free[t.pod_id], t.pod_id, -groups[t.id], t.id)

    tors = sorted(candidates, key=key)
    reserved: list[str] = []
    for tor in tors:
        if need <= 0:
            break
        take = min(len(tor.servers) // ep, need)
        # Free servers first: each busy one is a running job the head waits for.
        ordered = sorted(tor.servers, key=lambda s: s.id not in free)
        reserved.extend(s.id for s in ordered[: take * ep])
        need -= take
    if need > 0:
        # ToRs cannot hold its EP groups whole: they span the ToRs of a pod
        # (as `place_job` then places them), emptiest pods first
        reserved = []
        need = job.parallelism.dp * job.parallelism.pp
        for pod in sorted(cluster.pods, key=lambda p: (-pod_free[p.id], p.id)):
            if need <= 0:
                break
            take = min(len(pod.servers) // ep, need)
            ordered = sorted(pod.servers, key=lambda s: s.id not in free)
            reserved.extend(s.id for s in ordered[: take * ep])
            need -= take
    return frozenset(reserved)


def reserved_start(
    reserved: Set[str], free: Set[str], busy_until: Mapping[str, float], now: float
) -> float | None:
    """When every reserved server is free again: the latest expected end among the busy ones.

    None when a busy reserved server's job has no runtime estimate.
    """
    start = now
    for server in reserved:
        if server in free:
            continue
        ends = busy_until.get(server)
        if ends is None:
            return None
        start = max(start, ends)
    return start


def admit_queued(
    cluster: Cluster,
    free: Set[str],
    queue: Sequence[Job],
    policy: QueuePolicy,
    *,
    backfill: bool = True,
    place: PlaceFn = place_job,
    now: float = 0.0,
    busy_until: Mapping[str, float] | None = None,
) -> Admission:
    """Admit queued jobs in policy order; backfill around a blocked head if allowed.

    `busy_until` maps busy servers to the expected end of the job holding them
    (epoch seconds, like `now`); it and the queued jobs' `walltime_s` enable
    time-aware EASY backfill (see the module doc).
    """
    available = set(free)
    placements: list[Placement] = []
    reserved: frozenset[str] = frozenset()
    head: str | None = None
    start: float | None = None
    ends = dict(busy_until or {})
    for job in order_queue(queue, policy):
        usable = available - reserved if head else available
        result = place(cluster, usable, job)
        if not isinstance(result, Placement) and head and _ends_by(job, now, start):
            result = place(cluster, available, job)  # done before the head can start
        if isinstance(result, Placement):
            placements.append(result)
            available.difference_update(result.servers)
            if job.walltime_s is not None:
                ends.update({s: now + job.walltime_s for s in result.servers})
            continue
        if result.never_fits:
            continue  # refused at the door; never blocks the queue
        if head is None:
            if not backfill:
                break
            head = job.job_id
            reserved = reserve_for(cluster, available, job)
            start = reserved_start(reserved, available, ends, now)
    return Admission(tuple(placements), head, reserved if head else frozenset(), start)


def _ends_by(job: Job, now: float, start: float | None) -> bool:
    """The job states a runtime and finishes no later than the head's reserved start."""
    return start is not None and job.walltime_s is not None and now + job.walltime_s <= start

"""Placement of a job's parallel units on servers: `place_job` is the one entry point.

Pure functions over `Cluster` and the set of free servers; no I/O imports.

The foundation layout is compact: each EP group (one stage, one DP rank) under one
ToR, groups ordered stage-major so a stage's DP replicas sit together (DP traffic
is the heavier), packed best-fit into as few pods and ToRs as possible.
"""

from __future__ import annotations

from collections.abc import Iterable, Set

from .cluster import Cluster, Tor
from .job import Job, Placement, Unit, Unplaceable

NEVER_TOO_MANY_SERVERS = "needs more servers than the cluster has"
NEVER_EP_WIDER_THAN_TOR = "an EP group needs more servers than any ToR holds"
NEVER_TOO_MANY_EP_GROUPS = "the cluster's ToRs cannot hold that many EP groups at once"
NOT_NOW_BUSY = "not enough free servers in whole-ToR EP groups right now"


def _groups(job: Job) -> list[tuple[int, int]]:
    """The job's EP groups as (stage, dp_rank), stage-major."""
    par = job.parallelism
    return [(stage, dp) for stage in range(par.pp) for dp in range(par.dp)]


def never_fits(cluster: Cluster, job: Job) -> tuple[str, ...]:
    """Reasons the job could not be placed even on an empty cluster (empty: it can)."""
    par = job.parallelism
    reasons = []
    if par.servers > cluster.server_count:
        reasons.append(
            f"{NEVER_TOO_MANY_SERVERS}: {par.servers} > {cluster.server_count}"
        )
    widest = max((len(t.servers) for p in cluster.pods for t in p.tors), default=0)
    if par.ep > widest:
        reasons.append(f"{NEVER_EP_WIDER_THAN_TOR}: ep={par.ep} > {widest}")
    elif par.dp * par.pp > sum(len(t.servers) // par.ep for p in cluster.pods for t in p.tors):
        reasons.append(NEVER_TOO_MANY_EP_GROUPS)
    return tuple(reasons)


def _free_in(tor: Tor, free: Set[str]) -> list[str]:
    return [s.id for s in tor.servers if s.id in free]


def _pick_best_fit(capacities: list[tuple[str, int]], need: int) -> list[str]:
    """Keys to use for `need` slots: the smallest single one that fits, else largest first."""
    fitting = [(cap, key) for key, cap in capacities if cap >= need]
    if fitting:
        return [min(fitting)[1]]
    chosen, total = [], 0
    for key, cap in sorted(capacities, key=lambda kc: (-kc[1], kc[0])):
        if cap <= 0:
            break
        chosen.append(key)
        total += cap
        if total >= need:
            break
    return chosen


def place_job(cluster: Cluster, free: Set[str], job: Job) -> Placement | Unplaceable:
    """Place every unit of `job` on distinct servers from `free`, or say why not."""
    reasons = never_fits(cluster, job)
    if reasons:
        return Unplaceable(job.job_id, reasons, never_fits=True)
    ep = job.parallelism.ep
    groups = _groups(job)
    tor_free = {
        t.id: _free_in(t, free) for p in cluster.pods for t in p.tors
    }
    pod_caps = [
        (p.id, sum(len(tor_free[t.id]) // ep for t in p.tors)) for p in cluster.pods
    ]
    if sum(c for _, c in pod_caps) < len(groups):
        return Unplaceable(job.job_id, (NOT_NOW_BUSY,))
    units: list[Unit] = []
    remaining = list(groups)
    for pod_id in _pick_best_fit(pod_caps, len(groups)):
        pod = cluster.pods_by_id[pod_id]
        tor_caps = [(t.id, len(tor_free[t.id]) // ep) for t in pod.tors]
        for tor_id in _pick_best_fit(tor_caps, len(remaining)):
            servers = tor_free[tor_id]
            take = min(len(servers) // ep, len(remaining))
            units.extend(_units_on(servers, remaining[:take], ep))
            remaining = remaining[take:]
            if not remaining:
                break
        if not remaining:
            break
    if remaining:  # pragma: no cover - capacities above guarantee this never happens
        raise AssertionError("placement capacity accounting is broken")
    return Placement(job.job_id, tuple(units), reason="compact: best-fit pods and ToRs")


def _units_on(servers: list[str], groups: Iterable[tuple[int, int]], ep: int) -> list[Unit]:
    units = []
    for i, (stage, dp) in enumerate(groups):
        for e in range(ep):
            units.append(Unit(servers[i * ep + e], stage, dp, e))
    return units

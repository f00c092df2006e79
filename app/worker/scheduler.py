"""The scheduling handler: load a snapshot, ask the engine, record the result.

Level-triggered: it reads the current queue and server holders instead of
trusting the message that woke it, so a duplicated or lost message costs one
extra pass, never a wrong placement.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from app.engine.cluster import Cluster
from app.engine.collective import aggregator_capacity
from app.engine.job import Job, JobState, Parallelism
from app.engine.placement import (
    OPTICAL_EXTRA_PODS,
    Placer,
    fewest_pods,
    never_fits,
    spread_limit,
    uplinks_free,
)
from app.engine.queue import Admission, QueuePolicy, admit_queued, needs_servers
from app.store import ConcurrentChange, PlacedCache, Snapshot, Store
from app.store.mapping import placement_to_json
from app.store.repository import utcnow

log = logging.getLogger("lightpath.worker")

MAX_ATTEMPTS = 8
# the end_reason of a queued job the engine raised on (the rest of the queue goes on)
ENGINE_ERROR = "engine_error"
_CONTROL_JOB = "lightpath-control-probe"


@dataclass(frozen=True, slots=True)
class SchedulingResult:
    placed: tuple[str, ...]
    examined: tuple[str, ...]
    decision_seqs: tuple[int, ...]


def queue_reasons(
    cluster: Cluster,
    snapshot: Snapshot,
    admission: Admission,
    max_extra_pods: int | None = OPTICAL_EXTRA_PODS,
) -> dict[str, str]:
    """Why each job that stays queued waits, in words an operator can act on."""
    placed = {p.job_id for p in admission.placements}
    free = (
        cluster.server_count - len(snapshot.used) - sum(len(p.units) for p in admission.placements)
    )
    reasons = {}
    for job in snapshot.queued:
        if job.job_id in placed:
            continue
        # accepted on another cluster (the service restarted on a smaller file): it said
        # "needs 1875 servers, 32 free" for ever (asked of the head and of jobs larger
        # than the cluster only: the rest of the queue is not examined each pass)
        never = (
            never_fits(cluster, job)
            if job.servers_needed > cluster.server_count or job.job_id == admission.reserved_for
            else ()
        )
        if never:
            reasons[job.job_id] = (
                f"can never be placed on this cluster ({'; '.join(never)}): the cluster "
                f"changed since it was accepted; cancel it, or run on a cluster that holds it"
            )
            continue
        if job.job_id == admission.reserved_for:
            ep = job.parallelism.ep
            groups = f" in EP groups of {ep} servers inside a pod" if ep > 1 else ""
            spread = ""
            limit = spread_limit(cluster, max_extra_pods)
            enough = ep == 1 and free >= job.servers_needed
            joinable = _free_on_joined_pods(cluster, snapshot, admission) if enough else 0
            if enough and job.servers_needed > joinable:
                # the free servers lie on pods no OXC joins (a chain of two switches)
                spread = (
                    f"; no OXC joins the pods the free servers are on: at most {joinable} "
                    f"of them on pods that circuits can join"
                )
            elif limit is not None and enough:
                # enough servers, no EP groups to fit: only the spread rule holds it
                most = fewest_pods(cluster, job) + limit
                spread = (
                    f"; the free servers would spread it over more than {most} pod(s) whose "
                    f"uplinks are taken, so it waits for a compact layout"
                )
            reasons[job.job_id] = (
                f"head of the queue: {needs_servers(job.servers_needed, free, groups)}"
                f"{spread}; {len(admission.reserved_servers)} servers reserved"
            )
        elif admission.reserved_for is not None:
            reasons[job.job_id] = (
                f"waiting behind {admission.reserved_for}; needs {job.servers_needed} "
                f"server{'' if job.servers_needed == 1 else 's'} outside its reservation"
            )
        else:
            reasons[job.job_id] = needs_servers(job.servers_needed, free)
    return reasons


def _free_on_joined_pods(cluster: Cluster, snapshot: Snapshot, admission: Admission) -> int:
    """The most free servers on one set of pods that circuits can join."""
    taken = set(snapshot.used).union(*(p.servers for p in admission.placements))
    free_on = {p.id: sum(1 for s in p.servers if s.id not in taken) for p in cluster.pods}
    return max((sum(free_on[p] for p in joined) for joined in cluster.joined_pod_sets), default=0)


def schedule(
    store: Store,
    cluster: Cluster,
    policy: QueuePolicy,
    *,
    backfill: bool,
    reason: str,
    max_extra_pods: int | None = OPTICAL_EXTRA_PODS,
    cache: PlacedCache | None = None,
) -> SchedulingResult:
    """Admit what fits now; retried on a concurrent change (e.g. a job completed meanwhile).

    `cache`: the worker's memory of placed jobs, so a pass reads only what changed.
    """
    for _attempt in range(MAX_ATTEMPTS):
        snapshot = store.load_snapshot(cache)
        if not snapshot.queued:
            return SchedulingResult((), (), ())
        free = frozenset(cluster.server_ids).difference(snapshot.used)
        queue: list[Job] = list(snapshot.queued)
        # INC capacity other jobs leave free steers DP groups toward idle aggregators
        # (ToRs', and pods' for their spines)
        agg_free = {
            switch: max(
                0.0,
                aggregator_capacity(cluster, switch)
                - snapshot.aggregator_used_gbps.get(switch, 0.0),
            )
            for switch in (*cluster.tors_by_id, *cluster.pods_by_id)
        }
        uplinks = uplinks_free(cluster, snapshot.uplinks_held, snapshot.failed_ports)
        place = Placer(agg_free, uplinks, max_extra_pods)
        try:
            admission = admit_queued(
                cluster,
                free,
                queue,
                policy,
                backfill=backfill,
                place=place,
                now=time.time(),
                busy_until=snapshot.busy_until,
            )
        except Exception as exc:  # the engine is pure: its failure is a job's facts
            poison = _poison(cluster, free, queue, policy, agg_free, uplinks, max_extra_pods)
            if not poison:
                raise
            # a job the engine cannot judge must not stop every later placement
            for job_id in poison:
                store.end_job(
                    job_id,
                    JobState.FAILED,
                    from_states=(JobState.QUEUED,),
                    reason=f"{ENGINE_ERROR}: {type(exc).__name__}",
                )
                log.error(
                    "queued job failed: the engine cannot place it",
                    extra={"job_id": job_id, "error": type(exc).__name__, "detail": str(exc)},
                )
            continue
        now = utcnow()
        try:
            written = store.record_admission(
                admission.placements,
                examined=snapshot.unexamined,
                queue_reasons=queue_reasons(cluster, snapshot, admission, max_extra_pods),
                reason=reason,
                now=now,
            )
        except ConcurrentChange as exc:
            log.info(
                "scheduling pass raced a concurrent change, retrying", extra={"detail": str(exc)}
            )
            continue
        if written.left:
            # a completion or cancel during the pass: those jobs are gone, the other
            # placements stand; the freed servers are used by the next pass
            log.info("jobs left the queue during admission", extra={"jobs": list(written.left)})
        if cache is not None:  # committed: the next pass need not read these rows back
            jobs = {j.job_id: j for j in snapshot.queued}
            stored = set(written.placed)
            for p in admission.placements:
                if p.job_id in stored:
                    cache.add(
                        p.job_id,
                        placement_to_json(p),
                        now,
                        jobs[p.job_id].walltime_s,
                        p.job_id in snapshot.leased,
                        # counted until its fabric pass reports what it was granted
                        inc_use=place.inc_use.get(p.job_id),
                    )
        servers = {p.job_id: len(p.units) for p in admission.placements}
        for job_id, seq in zip(written.placed, written.seqs, strict=True):
            log.info(
                "job placed",
                extra={"job_id": job_id, "seq": seq, "servers": servers[job_id], "reason": reason},
            )
        return SchedulingResult(written.placed, tuple(snapshot.unexamined), written.seqs)
    raise ConcurrentChange(f"scheduling did not settle after {MAX_ATTEMPTS} attempts")


def _poison(
    cluster: Cluster,
    free: frozenset[str],
    queue: list[Job],
    policy: QueuePolicy,
    agg_free: dict[str, float],
    uplinks: dict[str, int],
    max_extra_pods: int | None,
) -> list[str]:
    """The queued jobs the engine fails on alone. None are to blame when it fails on a
    job of one server that states nothing too (the control)."""

    def fails(job: Job) -> bool:
        place = Placer(agg_free, uplinks, max_extra_pods)
        try:
            admit_queued(cluster, free, [job], policy, backfill=False, place=place, now=time.time())
        except Exception:
            return True
        return False

    if fails(Job(_CONTROL_JOB, Parallelism(dp=1, pp=1))):
        return []
    return [job.job_id for job in queue if fails(job)]

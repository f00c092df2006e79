"""Queue policies and EASY-style backfill with a spatial reservation for the head."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.cluster import build_cluster, preset
from app.engine.job import Job, Parallelism, Placement
from app.engine.placement import place_job
from app.engine.queue import (
    QueuePolicy,
    admit_queued,
    needs_servers,
    order_queue,
    reserved_start,
)

CLUSTER = build_cluster(
    "q",
    pods=3,
    tors_per_pod=2,
    servers_per_tor=5,
    uplink_ports_per_pod=4,
    oxcs=2,
    oxc_ports=8,
)

jobs = st.builds(
    lambda i, dp, pp, ep, prio, deadline: Job(
        f"job-{i}",
        Parallelism(dp=dp, pp=pp, ep=ep),
        priority=prio,
        deadline=deadline,
        submitted_order=i,
    ),
    st.integers(0, 10_000),
    st.integers(1, 8),
    st.integers(1, 3),
    st.integers(1, 3),
    st.integers(0, 1),
    st.one_of(st.none(), st.floats(0, 100)),
)
queues = st.lists(jobs, max_size=12, unique_by=lambda j: j.job_id)


def _key(job: Job, policy: QueuePolicy) -> tuple[float, ...]:
    if policy is QueuePolicy.FIFO:
        return (-job.priority, job.submitted_order)
    if policy is QueuePolicy.SMALLEST_FIRST:
        return (-job.priority, job.servers_needed, job.submitted_order)
    deadline = job.deadline if job.deadline is not None else math.inf
    return (-job.priority, deadline, job.submitted_order)


@settings(max_examples=200, deadline=None)
@given(queues, st.sampled_from(list(QueuePolicy)), st.booleans(), st.data())
def test_admission_properties(
    queue: list[Job], policy: QueuePolicy, backfill: bool, data: st.DataObject
) -> None:
    free = set(data.draw(st.lists(st.sampled_from(CLUSTER.server_ids), unique=True)))
    ordered = order_queue(queue, policy)
    assert [_key(j, policy) for j in ordered] == sorted(_key(j, policy) for j in queue)
    admission = admit_queued(CLUSTER, free, queue, policy, backfill=backfill)
    placed = [p.job_id for p in admission.placements]
    rank = {j.job_id: i for i, j in enumerate(ordered)}
    assert placed == sorted(placed, key=rank.__getitem__)  # policy order respected
    used = [s for p in admission.placements for s in p.servers]
    assert len(used) == len(set(used)) and set(used) <= free  # no double booking
    head = admission.reserved_for
    if head is None:
        # Nothing blocked (or no backfill): everything up to the first blocked job ran.
        if not backfill:
            for job in ordered:
                if job.job_id not in placed and not _never(job):
                    break
            else:
                return
            later = [j.job_id for j in ordered[ordered.index(job) + 1 :]]
            assert not set(later) & set(placed)  # no backfill: nothing jumps the queue
        return
    assert backfill
    head_job = next(j for j in ordered if j.job_id == head)
    assert all(j.job_id in placed or _never(j) for j in ordered[: rank[head]])
    # Backfill never touches the head's reservation, and once the servers in it
    # are released the head fits there: it is not delayed by what was backfilled.
    reserved = admission.reserved_servers
    backfilled = {s for p in admission.placements if rank[p.job_id] > rank[head] for s in p.servers}
    assert not reserved & backfilled
    assert len(reserved) == head_job.servers_needed
    after = (free - backfilled) | reserved
    assert isinstance(place_job(CLUSTER, reserved, head_job), Placement)
    assert isinstance(place_job(CLUSTER, after, head_job), Placement)


def _never(job: Job) -> bool:
    result = place_job(CLUSTER, set(CLUSTER.server_ids), job)
    return not isinstance(result, Placement) and result.never_fits


def test_policies_order() -> None:
    a = Job("a", Parallelism(dp=4, pp=1), deadline=30.0, submitted_order=0)
    b = Job("b", Parallelism(dp=1, pp=1), deadline=20.0, submitted_order=1)
    c = Job("c", Parallelism(dp=2, pp=1), deadline=10.0, submitted_order=2)
    d = Job("d", Parallelism(dp=8, pp=1), priority=1, submitted_order=3)
    ids = lambda p: [j.job_id for j in order_queue([a, b, c, d], p)]  # noqa: E731
    assert ids(QueuePolicy.FIFO) == ["d", "a", "b", "c"]
    assert ids(QueuePolicy.SMALLEST_FIRST) == ["d", "b", "c", "a"]
    assert ids(QueuePolicy.EDF) == ["d", "c", "b", "a"]


def test_seed_backfill_around_blocked_head() -> None:
    seed = preset("seed-15k")
    # 1,800 servers busy, pod-24's 75 free. The head (20 EP groups of 4) waits:
    # the 5 free ToRs hold 3 groups each. It reserves those 60 servers plus 20
    # busy ones; the 3-server scraps left in each free ToR are backfilled.
    free = set(seed.server_ids[1800:])
    head = Job("head", Parallelism(dp=20, pp=1, ep=4), submitted_order=0)
    small = [Job(f"s{i}", Parallelism(dp=1, pp=1), submitted_order=i + 1) for i in range(30)]
    admission = admit_queued(seed, free, [head, *small], QueuePolicy.FIFO)
    assert admission.reserved_for == "head"
    reserved = admission.reserved_servers
    assert len(reserved) == 80 and len(reserved & free) == 60
    used = {s for p in admission.placements for s in p.servers}
    assert len(admission.placements) == 15 and used == free - reserved
    # When the 20 busy reserved servers are released, the head starts at once.
    after = (free - used) | reserved
    assert isinstance(place_job(seed, after, head), Placement)


def test_no_backfill_stops_at_head() -> None:
    seed = preset("seed-15k")
    # 10 free servers in one ToR, 1 in the next: the head (3 groups of 4) holds
    # the first ToR's 10 and waits for 2 more there; the lone server backfills.
    tors = seed.pods[0].tors
    free = {s.id for s in tors[0].servers[:10]} | {tors[1].servers[0].id}
    head = Job("head", Parallelism(dp=3, pp=1, ep=4), submitted_order=0)
    small = Job("small", Parallelism(dp=1, pp=1), submitted_order=1)
    admission = admit_queued(seed, free, [head, small], QueuePolicy.FIFO, backfill=False)
    assert admission.placements == () and admission.reserved_for is None
    admission = admit_queued(seed, free, [head, small], QueuePolicy.FIFO)
    assert admission.reserved_for == "head"
    assert [p.job_id for p in admission.placements] == ["small"]


timed_jobs = st.builds(
    lambda i, dp, pp, ep, walltime: Job(
        f"job-{i}", Parallelism(dp=dp, pp=pp, ep=ep), submitted_order=i, walltime_s=walltime
    ),
    st.integers(0, 10_000),
    st.integers(1, 8),
    st.integers(1, 3),
    st.integers(1, 3),
    st.one_of(st.none(), st.floats(1, 500)),
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(timed_jobs, min_size=1, max_size=10, unique_by=lambda j: j.job_id),
    st.sampled_from(list(QueuePolicy)),
    st.data(),
)
def test_easy_backfill_never_delays_the_reserved_start(
    queue: list[Job], policy: QueuePolicy, data: st.DataObject
) -> None:
    now = 1000.0
    free = set(data.draw(st.lists(st.sampled_from(CLUSTER.server_ids), unique=True)))
    busy = [s for s in CLUSTER.server_ids if s not in free]
    # Running jobs' expected ends; a server missing here runs a job with no estimate.
    busy_until = {
        s: now + data.draw(st.floats(0, 400))
        for s in busy
        if data.draw(st.booleans(), label=f"estimate {s}") or len(busy) < 4
    }
    admission = admit_queued(CLUSTER, free, queue, policy, now=now, busy_until=busy_until)
    head = admission.reserved_for
    if head is None:
        return
    reserved = admission.reserved_servers
    by_id = {j.job_id: j for j in queue}
    rank = {j.job_id: i for i, j in enumerate(order_queue(queue, policy))}
    ends = dict(busy_until)
    free_at_head = set(free)
    for p in admission.placements:
        walltime = by_id[p.job_id].walltime_s
        if rank[p.job_id] < rank[head]:  # started before the head blocked: it runs as usual
            free_at_head -= set(p.servers)
            ends.update({s: now + walltime for s in p.servers} if walltime else {})
    assert admission.reserved_start == reserved_start(reserved, free_at_head, ends, now)
    still_free = set(free_at_head)
    for p in admission.placements:
        if rank[p.job_id] < rank[head] or not reserved & set(p.servers):
            continue
        # Only a job that states its runtime and ends by the reserved start uses the reservation.
        walltime = by_id[p.job_id].walltime_s
        assert walltime is not None and admission.reserved_start is not None
        assert now + walltime <= admission.reserved_start
        ends.update({s: now + walltime for s in p.servers})
        still_free -= set(p.servers)
    assert reserved_start(reserved, still_free, ends, now) == admission.reserved_start
    head_job = by_id[head]
    assert isinstance(place_job(CLUSTER, reserved, head_job), Placement)


def test_easy_backfill_admits_a_short_job_inside_the_reservation() -> None:
    # One pod of 2 ToRs x 5 servers. A running job holds 6 servers until t=100;
    # the head needs all 10. A 2-server job of 50 s fits before the head's start,
    # one of 500 s or with no estimate does not.
    cluster = build_cluster(
        "one",
        pods=1,
        tors_per_pod=2,
        servers_per_tor=5,
        uplink_ports_per_pod=4,
        oxcs=1,
        oxc_ports=8,
    )
    servers = list(cluster.server_ids)
    free = set(servers[:4])
    busy_until = {s: 100.0 for s in servers[4:]}
    head = Job("head", Parallelism(dp=10, pp=1), submitted_order=0)
    long = Job("long", Parallelism(dp=2, pp=1), submitted_order=1, walltime_s=500.0)
    unknown = Job("unknown", Parallelism(dp=2, pp=1), submitted_order=2)
    short = Job("short", Parallelism(dp=2, pp=1), submitted_order=3, walltime_s=50.0)
    admission = admit_queued(
        cluster,
        free,
        [head, long, unknown, short],
        QueuePolicy.FIFO,
        now=0.0,
        busy_until=busy_until,
    )
    assert admission.reserved_for == "head" and admission.reserved_start == 100.0
    assert [p.job_id for p in admission.placements] == ["short"]
    # Without runtime estimates of the running job the reservation is spatial only.
    spatial = admit_queued(cluster, free, [head, short], QueuePolicy.FIFO, now=0.0)
    assert spatial.placements == () and spatial.reserved_start is None


def test_a_head_that_needs_several_tors_reserves_them_in_as_few_pods_as_it_can() -> None:
    """Two pods each have one whole ToR free. A 40-server head used to reserve both ToRs
    (the two fullest) and one more, two pods apart or more; it now reserves three ToRs of
    pod-0, so once they free it starts on one pod."""
    cluster = preset("seed-15k")
    free = {s.id for s in cluster.pods[0].tors[0].servers} | {
        s.id for s in cluster.pods[1].tors[0].servers
    }
    head = Job("head", Parallelism(dp=40, pp=1))
    admission = admit_queued(cluster, free, [head], QueuePolicy.FIFO)
    assert admission.reserved_for == "head"
    assert {cluster.server(s).pod_id for s in admission.reserved_servers} == {"pod-0"}
    assert len(admission.reserved_servers) == 40
    # a head one ToR holds still takes the ToR with the most free servers
    small = Job("small", Parallelism(dp=6, pp=1))
    some = {s.id for s in cluster.pods[0].tors[0].servers[:2]} | {
        s.id for s in cluster.pods[1].tors[0].servers[:3]
    }
    admission = admit_queued(cluster, some, [small], QueuePolicy.FIFO)
    assert admission.reserved_for == "small"
    assert {cluster.server(s).tor_id for s in admission.reserved_servers} == {"pod-1/tor-0"}


def test_a_queue_reason_counts_servers_in_english() -> None:
    assert needs_servers(1, 0) == "needs 1 server, 0 free"
    assert needs_servers(4, 2) == "needs 4 servers, 2 free"
    assert needs_servers(8, 3, " in EP groups of 8") == "needs 8 servers in EP groups of 8, 3 free"

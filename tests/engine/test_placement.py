"""Placement: properties on generated fabrics and occupancies, scenarios on seed-15k."""

from __future__ import annotations

import dataclasses
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.allocation import job_demand
from app.engine.cluster import Cluster, Oxc, build_cluster, preset
from app.engine.collective import AggregatorLedger, choose_collective
from app.engine.controller import ControllerConfig, JobPlaced, network_view, new_controller, step
from app.engine.job import Collective, Job, ModelFacts, Parallelism, Placement, Unplaceable
from app.engine.placement import (
    NEVER_PODS_NOT_JOINED,
    NEVER_TOO_FEW_UPLINKS,
    NOT_NOW_BUSY,
    NOT_NOW_SPREAD,
    NOT_NOW_UPLINKS,
    Placer,
    _free_servers,
    fewest_pods,
    never_fits,
    place_job,
    spread_limit,
    uplinks_free,
)

SEED = preset("seed-15k")
FACTS = ModelFacts(
    parameters=70e9, bytes_per_parameter=2, activation_bytes=64 << 20, microbatches=16
)


def _job(dp: int, pp: int = 1, ep: int = 1, **kw: object) -> Job:
    return Job(f"j{dp}x{pp}x{ep}", Parallelism(dp=dp, pp=pp, ep=ep), **kw)  # type: ignore[arg-type]


def _capacity(cluster: Cluster, free: set[str], ep: int) -> int:
    return sum(
        sum(1 for s in t.servers if s.id in free) // ep for p in cluster.pods for t in p.tors
    )


def _check(cluster: Cluster, free: set[str], job: Job, placement: Placement) -> None:
    par = job.parallelism
    servers = placement.servers
    assert len(servers) == len(set(servers)) == par.servers  # no double booking
    assert set(servers) <= free
    keys = [(u.stage, u.dp_rank, u.ep_rank) for u in placement.units]
    expected = {(s, d, e) for s in range(par.pp) for d in range(par.dp) for e in range(par.ep)}
    assert len(keys) == len(expected) and set(keys) == expected  # every unit exactly once
    group_of: dict[tuple[int, int], list[str]] = {}
    for u in placement.units:
        group_of.setdefault((u.stage, u.dp_rank), []).append(u.server)
    spanning_pods: set[str] = set()
    whole_in_tor: dict[str, int] = {}  # servers of ToR-whole groups per ToR
    for members in group_of.values():
        pods = {cluster.server(s).pod_id for s in members}
        tors = {cluster.server(s).tor_id for s in members}
        assert len(pods) == 1  # EP never across pods
        if len(tors) > 1:
            spanning_pods |= pods
        else:
            (tor,) = tors
            whole_in_tor[tor] = whole_in_tor.get(tor, 0) + len(members)
    # A group spans ToRs only when, once the job's ToR-whole groups are in, no ToR
    # of its pod has room for a whole group; and the reason says so exactly then.
    for pod_id in spanning_pods:
        for tor in cluster.pods_by_id[pod_id].tors:
            room = sum(1 for s in tor.servers if s.id in free) - whole_in_tor.get(tor.id, 0)
            assert room < par.ep, (tor.id, room)
    assert ("span ToRs of one pod" in placement.reason) == bool(spanning_pods)
    # one pod when one holds the job, else the fewest pods that can
    caps = sorted(
        (sum(1 for s in p.servers if s.id in free) // par.ep for p in cluster.pods), reverse=True
    )
    fewest = next(k for k in range(1, len(caps) + 1) if sum(caps[:k]) >= par.dp * par.pp)
    assert len({cluster.server(s).pod_id for s in servers}) == fewest


def _short(cluster: Cluster, job: Job, placement: Placement, ports: dict[str, int] | None) -> bool:
    """Some pod of the placement has fewer free uplinks than the job's circuits need."""
    free = ports if ports is not None else {p.id: p.uplink_ports for p in cluster.pods}
    need: dict[str, int] = {}
    for a, b, n in job_demand(cluster, job, placement).pair_ports:
        need[a] = need.get(a, 0) + n
        need[b] = need.get(b, 0) + n
    return any(free[p] < n for p, n in need.items())


def _pod_capacity(cluster: Cluster, free: set[str], ep: int) -> int:
    return sum(sum(1 for s in p.servers if s.id in free) // ep for p in cluster.pods)


fabrics = st.builds(
    lambda pods, tors, servers, ports: build_cluster(
        "gen",
        pods=pods,
        tors_per_pod=tors,
        servers_per_tor=servers,
        uplink_ports_per_pod=ports * 2,
        oxcs=2,
        oxc_ports=ports * pods,
    ),
    st.integers(1, 4),
    st.integers(1, 4),
    st.integers(1, 9),
    st.integers(1, 8),
)


@settings(max_examples=300, deadline=None)
@given(fabrics, st.data())
def test_placement_properties(cluster: Cluster, data: st.DataObject) -> None:
    ids = list(cluster.server_ids)
    free = set(data.draw(st.lists(st.sampled_from(ids), unique=True)))
    ep = data.draw(st.integers(1, 4))
    dp = data.draw(st.integers(1, 8))
    pp = data.draw(st.integers(1, 4))
    collective = data.draw(st.sampled_from(list(Collective)))
    facts = data.draw(st.sampled_from([None, FACTS]))
    job = _job(dp, pp, ep, model=facts, collective=collective)
    ports = data.draw(
        st.none()
        | st.fixed_dictionaries({p.id: st.integers(0, p.uplink_ports) for p in cluster.pods})
    )
    agg = data.draw(
        st.none()
        | st.fixed_dictionaries(
            {t.id: st.sampled_from([0.0, t.aggregator_gbps]) for p in cluster.pods for t in p.tors}
        )
    )
    limit = data.draw(st.none() | st.integers(0, 2))
    result = place_job(
        cluster, free, job, aggregator_free_gbps=agg, ports_free=ports, max_extra_pods=limit
    )
    unlimited = place_job(cluster, free, job, aggregator_free_gbps=agg, ports_free=ports)
    if isinstance(result, Placement):
        _check(cluster, free, job, result)
        assert result.reason.startswith("layout ")
        spans = len({cluster.server(s).pod_id for s in result.servers})
        effective = spread_limit(cluster, limit)  # 0 where pods have fewer uplinks than servers
        if effective is not None and spans > fewest_pods(cluster, job) + effective:
            # spread beyond the limit only where that starves nobody: a job bigger than a
            # quarter pod (never held back), or every pod with the uplinks it needs
            widest = max(len(p.servers) for p in cluster.pods)
            assert job.parallelism.servers * 4 > widest or not _short(cluster, job, result, ports)
        assert result == unlimited  # the limit only ever says "wait", never moves a job
    elif not result.never_fits:
        if result.reasons == (NOT_NOW_SPREAD,):
            # it waits for a compact layout only when the free servers would scatter a
            # small job over pods short of the uplinks its circuits need
            effective = spread_limit(cluster, limit)
            assert effective is not None and isinstance(unlimited, Placement)
            spans = len({cluster.server(s).pod_id for s in unlimited.servers})
            assert spans > fewest_pods(cluster, job) + effective
            assert job.parallelism.servers * 4 <= max(len(p.servers) for p in cluster.pods)
            assert _short(cluster, job, unlimited, ports)
        elif result.reasons == (NOT_NOW_UPLINKS,):
            # every layout of these free servers has a pod with fewer uplinks than the
            # pairs it would cross: the same servers on pods with ample uplinks place it
            assert _pod_capacity(cluster, free, ep) >= dp * pp
            assert _places_with_ample_uplinks(cluster, free, job, agg)
        else:
            # Else a job waits only when the free servers hold too few whole EP groups in pods.
            assert result.reasons == (NOT_NOW_BUSY,)
            assert _pod_capacity(cluster, free, ep) < dp * pp
    else:
        assert never_fits(cluster, job) == result.reasons


def _places_with_ample_uplinks(
    cluster: Cluster, free: set[str], job: Job, agg: dict[str, float] | None = None
) -> bool:
    """The same free servers on the same pods with 64 uplinks each place `job`."""
    ample = _with_uplinks(cluster, 64, oxcs=2, oxc_ports=32 * len(cluster.pods))
    return isinstance(place_job(ample, free, job, aggregator_free_gbps=agg), Placement)


def _with_uplinks(cluster: Cluster, uplinks: int, *, oxcs: int, oxc_ports: int) -> Cluster:
    """The same pods, ToRs and servers with `uplinks` per pod over `oxcs` OXCs."""
    pod = cluster.pods[0]
    return build_cluster(
        f"{cluster.name}-{uplinks}",
        pods=len(cluster.pods),
        tors_per_pod=len(pod.tors),
        servers_per_tor=len(pod.tors[0].servers),
        uplink_ports_per_pod=uplinks,
        oxcs=oxcs,
        oxc_ports=oxc_ports,
    )


def test_never_fits_reasons() -> None:
    small = preset("small")
    # too many servers, said once: the EP-groups reason was added with ep = 1 too
    assert never_fits(small, _job(64)) == ("needs more servers than the cluster has: 64 > 32",)
    (groups,) = never_fits(small, _job(9, ep=3))  # 2 groups of 3 per 8-server pod: 8
    assert "EP groups" in groups
    assert never_fits(small, _job(1, ep=9))  # a pod holds 8 servers
    assert not never_fits(small, _job(1, ep=5))  # wider than a ToR: spans ToRs of a pod
    result = place_job(small, set(small.server_ids), _job(1, ep=9))
    assert isinstance(result, Unplaceable) and result.never_fits


def test_seed_pod_sized_job_takes_one_pod_and_small_jobs_fill_fragments() -> None:
    free = set(SEED.server_ids)
    big = place_job(SEED, free, _job(75, model=FACTS))
    assert isinstance(big, Placement)
    assert len({SEED.server(s).pod_id for s in big.servers}) == 1
    free -= set(big.servers)
    first = place_job(SEED, free, _job(10))
    assert isinstance(first, Placement)
    free -= set(first.servers)
    tor = SEED.server(first.servers[0]).tor_id
    # Best fit: a 5-server job goes to the ToR the 10-server job left with 5 free.
    second = place_job(SEED, free, _job(5))
    assert isinstance(second, Placement)
    assert {SEED.server(s).tor_id for s in second.servers} == {tor}


def test_seed_big_job_spans_fewest_pods() -> None:
    result = place_job(SEED, set(SEED.server_ids), _job(32, pp=4, model=FACTS))
    assert isinstance(result, Placement)
    assert len({SEED.server(s).pod_id for s in result.servers}) == 2  # 128 servers > 75


def test_seed_ep_groups_packed_by_best_fit() -> None:
    free = set(SEED.server_ids)
    # Leave one ToR with exactly 8 free servers: an ep=8 group goes there, not
    # into a whole ToR it would leave 7-server scraps in.
    seven = [s.id for s in SEED.pods[3].tors[2].servers[:7]]
    free -= set(seven)
    result = place_job(SEED, free, _job(1, ep=8))
    assert isinstance(result, Placement)
    assert {SEED.server(s).tor_id for s in result.servers} == {"pod-3/tor-2"}


def test_layout_chosen_by_estimated_time() -> None:
    free = set(SEED.server_ids)
    result = place_job(SEED, free, _job(64, pp=2, model=FACTS))
    assert isinstance(result, Placement)
    chosen = float(re.search(r"est\. ([0-9.]+) ms", result.reason).group(1))  # type: ignore[union-attr]
    others = [float(x) for x in re.findall(r"; \S+ ([0-9.]+) ms \(", result.reason)]
    assert others and all(chosen <= o for o in others)


def test_forced_collective_is_respected() -> None:
    result = place_job(
        SEED, set(SEED.server_ids), _job(8, pp=2, model=FACTS, collective=Collective.TREE)
    )
    assert isinstance(result, Placement)
    assert "DP tree" in result.reason


def test_inc_chosen_when_aggregators_are_plentiful() -> None:
    # An aggregator that takes every server's full rate halves the AllReduce: each
    # worker sends and receives S once instead of a ring's 2*S*(N-1)/N.
    cluster = build_cluster(
        "inc",
        pods=2,
        tors_per_pod=2,
        servers_per_tor=4,
        uplink_ports_per_pod=2,
        oxcs=1,
        oxc_ports=8,
        aggregator_gbps=1e6,
    )
    result = place_job(cluster, set(cluster.server_ids), _job(4, model=FACTS))
    assert isinstance(result, Placement)
    assert "DP inc" in result.reason
    busy = {t.id: 0.0 for p in cluster.pods for t in p.tors}
    result = place_job(
        cluster, set(cluster.server_ids), _job(4, model=FACTS), aggregator_free_gbps=busy
    )
    assert isinstance(result, Placement)
    assert "DP inc" not in result.reason  # aggregators full: a ring instead


def test_idle_aggregator_preferred_on_ties() -> None:
    cluster = preset("small")
    busy = {t.id: 0.0 for p in cluster.pods for t in p.tors}
    busy["pod-2/tor-1"] = 800.0
    result = place_job(cluster, set(cluster.server_ids), _job(2), aggregator_free_gbps=busy)
    assert isinstance(result, Placement)
    assert {cluster.server(s).tor_id for s in result.servers} == {"pod-2/tor-1"}


def test_jobs_forcing_inc_back_to_back_each_get_an_idle_aggregator_while_one_is_left() -> None:
    """Before, the second of two forced-INC jobs went by best fit under the ToR whose
    aggregator the first had just filled (scheduling learnt of the grant only from
    the fabric pass), and fell back to ring while other ToRs' aggregators idled.
    The placer counts what each placement will be granted; a forced-INC job goes
    under a ToR, then into a pod, whose aggregator has room."""
    cluster = preset("small")  # 4 pods x 2 ToRs of 4 servers, 800 Gb/s aggregators
    place = Placer({})
    free = set(cluster.server_ids)
    ledger = AggregatorLedger()  # what the fabric controller grants, job by job
    algorithms, tors = [], []
    for i in range(13):
        job = Job(f"inc-{i}", Parallelism(dp=2, pp=1), FACTS, collective=Collective.INC)
        result = place(cluster, free, job)
        assert isinstance(result, Placement)
        free -= set(result.servers)
        choice = choose_collective(cluster, job, result, ledger)
        ledger = ledger.reserve(cluster, choice.grants)
        algorithms.append(choice.algorithm)
        tors.append({cluster.server(s).tor_id for s in result.servers})
        # what the placer counted is what the controller granted
        assert place.inc_use.get(job.job_id, {}) == {g.tor_id: g.gbps for g in choice.grants}
    # one per ToR aggregator, then one per pod's spine once every ToR's is held (the
    # tenth used to land beside the ninth, under a held spine, while three idled);
    # with every aggregator held the thirteenth falls back to ring
    assert algorithms == ["inc"] * 12 + ["ring"]
    assert all(len(t) == 1 for t in tors[:8]) and len(set().union(*tors[:8])) == 8
    spine_pods = [cluster.tors_by_id[next(iter(t))].pod_id for t in tors[8:12]]
    assert sorted(spine_pods) == sorted(p.id for p in cluster.pods)


def test_the_placer_counts_a_spine_grant_against_the_spine_not_a_tor() -> None:
    """A DP group spanning ToRs of a pod is granted the pod's spine (the second level):
    the placer counts the ToR part against the ToRs and the spine's against the pod
    (it left spines out, so the next job counted on a spine already taken)."""
    cluster = build_cluster(
        "spines",
        pods=2,
        tors_per_pod=2,
        servers_per_tor=2,
        uplink_ports_per_pod=2,
        oxcs=1,
        oxc_ports=4,
        pod_aggregator_gbps=1e6,
    )
    place = Placer({})
    job = Job("wide", Parallelism(dp=4, pp=1), FACTS, collective=Collective.INC)
    result = place(cluster, set(cluster.server_ids), job)
    assert isinstance(result, Placement)
    use = place.inc_use["wide"]
    assert "pod-0" in use or "pod-1" in use  # the spine of the pod it spans
    tors = {t.id for p in cluster.pods for t in p.tors}
    assert all(place.aggregator_free_gbps[t] < 800.0 for t in use if t in tors)
    for spine in set(use) - tors:
        assert place.aggregator_free_gbps[spine] == 1e6 - use[spine]


def test_where_pods_have_fewer_uplinks_than_servers_a_small_job_takes_no_extra_pod() -> None:
    """seed-15k with 48 uplinks a pod (75 servers): a 4-server job that the free servers
    would split over two pods, whose uplinks others' slices hold, waits for one pod
    there; with 192 uplinks the same split is within the limit of one extra pod. With
    the uplinks free it spreads at once either way."""
    pod0, pod1 = SEED.pods[0], SEED.pods[1]
    free = {s.id for s in pod0.servers[:2]} | {s.id for s in pod1.servers[:2]}
    job = _job(4, model=FACTS)
    scarce = _with_uplinks(SEED, 48, oxcs=len(SEED.oxcs), oxc_ports=SEED.oxcs[0].ports)
    assert spread_limit(SEED, 1) == 1 and spread_limit(scarce, 1) == 0
    assert spread_limit(scarce, None) is None
    taken = {p.id: 2 for p in SEED.pods}
    rich = place_job(SEED, free, job, ports_free=taken, max_extra_pods=1)
    assert isinstance(rich, Placement)
    assert len({SEED.server(s).pod_id for s in rich.servers}) == 2
    waits = place_job(scarce, free, job, ports_free=taken, max_extra_pods=1)
    assert isinstance(waits, Unplaceable) and waits.reasons == (NOT_NOW_SPREAD,)
    assert isinstance(place_job(scarce, free, job, max_extra_pods=1), Placement)
    # no limit set: the cluster's uplinks do not make one
    assert isinstance(place_job(scarce, free, job, ports_free=taken), Placement)


def test_a_job_the_free_servers_would_scatter_waits_for_a_compact_layout() -> None:
    """seed-15k, 300-job scale: fragmentation leaves one free server per pod and other
    jobs' slices hold most uplinks. A 4-server job would take one server in each of four
    pods (a ring through four pods: a server's worth of circuits in and out at each, 16
    ports a pod); with 8 uplinks free a pod it waits, and takes two pods once one of
    them has room for three of its servers. With the uplinks free it spreads at once."""
    cluster = SEED
    one_each = {p.servers[0].id for p in cluster.pods}
    job = _job(4, model=FACTS)
    assert fewest_pods(cluster, job) == 1
    taken = {p.id: 8 for p in cluster.pods}
    scattered = place_job(cluster, one_each, job, ports_free=taken)
    assert isinstance(scattered, Placement)
    assert len({cluster.server(s).pod_id for s in scattered.servers}) == 4
    waits = place_job(cluster, one_each, job, ports_free=taken, max_extra_pods=1)
    assert isinstance(waits, Unplaceable) and waits.reasons == (NOT_NOW_SPREAD,)
    assert not waits.never_fits
    pod = cluster.pods[3]
    two_pods = one_each | {s.id for s in pod.servers[:3]}  # 3 free there, 1 elsewhere
    placed = place_job(cluster, two_pods, job, ports_free=taken, max_extra_pods=1)
    assert isinstance(placed, Placement)
    pods = {cluster.server(s).pod_id for s in placed.servers}
    assert len(pods) == 2 and pod.id in pods
    # uplinks free everywhere: spreading costs the job nothing, so it does not wait
    free_ports = place_job(cluster, one_each, job, max_extra_pods=1)
    assert isinstance(free_ports, Placement)
    assert len({cluster.server(s).pod_id for s in free_ports.servers}) == 4
    # a job bigger than a pod counts from the fewest pods it needs
    assert fewest_pods(cluster, _job(100, model=FACTS)) == 2
    assert fewest_pods(cluster, _job(10, ep=8)) == 2  # 9 groups of 8 per 75-server pod


def test_a_job_spanning_pods_goes_where_uplinks_are_free() -> None:
    """Two pods stand empty, but one has every uplink taken: a 2-pod job avoids it."""
    cluster = preset("small")  # 4 pods of 8 servers, 16 uplinks each
    free = set(cluster.server_ids)
    ports = {"pod-0": 0, "pod-1": 16, "pod-2": 16, "pod-3": 16}
    job = _job(12, model=FACTS)
    result = place_job(cluster, free, job, ports_free=ports)
    assert isinstance(result, Placement)
    pods = {cluster.server(s).pod_id for s in result.servers}
    assert len(pods) == 2 and "pod-0" not in pods
    # a job inside one pod needs no uplinks: it leaves the free ones to others
    small = place_job(cluster, free, _job(8), ports_free=ports)
    assert isinstance(small, Placement)
    assert {cluster.server(s).pod_id for s in small.servers} == {"pod-0"}


def test_the_tail_of_a_job_spanning_pods_avoids_a_pod_whose_uplinks_are_taken() -> None:
    """The issue's case: a first job fills pod-0 and half of pod-1 and its slice holds
    both pods' uplinks. The next 12-server job needs two pods; its tail would best-fit
    the 4 servers left on pod-1, but pod-3 has room and free uplinks."""
    cluster = preset("small")
    free = set(cluster.server_ids)
    first = place_job(cluster, free, _job(12, model=FACTS))
    assert isinstance(first, Placement)
    assert {cluster.server(s).pod_id for s in first.servers} == {"pod-0", "pod-1"}
    free -= set(first.servers)
    held = {"pod-0": 16.0, "pod-1": 16.0}
    ports = uplinks_free(cluster, held)
    assert ports == {"pod-0": 0, "pod-1": 0, "pod-2": 16, "pod-3": 16}
    second = place_job(cluster, free, _job(12, model=FACTS), ports_free=ports)
    assert isinstance(second, Placement)
    assert {cluster.server(s).pod_id for s in second.servers} == {"pod-2", "pod-3"}
    # with no port held anywhere best fit takes pod-1's leftover, as before
    blind = place_job(cluster, free, _job(12, model=FACTS))
    assert isinstance(blind, Placement)
    assert "pod-1" in {cluster.server(s).pod_id for s in blind.servers}


def test_layouts_are_estimated_on_the_circuits_the_job_would_get() -> None:
    cluster = preset("small")
    free = set(cluster.server_ids)
    job = _job(12, model=FACTS)
    roomy = place_job(cluster, free, job)
    starved = place_job(cluster, free, job, ports_free={p.id: 1 for p in cluster.pods})
    assert isinstance(roomy, Placement) and isinstance(starved, Placement)
    est = re.compile(r"est\. ([0-9.]+) ms")
    assert float(est.search(starved.reason).group(1)) > float(  # type: ignore[union-attr]
        est.search(roomy.reason).group(1)  # type: ignore[union-attr]
    )


def test_ep_groups_span_tors_of_one_pod_only_when_no_tor_fits() -> None:
    free = set(SEED.server_ids)
    # every ToR keeps 7 free servers: no ep=8 group fits a ToR, but pods hold 35
    for pod in SEED.pods:
        for tor in pod.tors:
            free -= {s.id for s in tor.servers[7:]}
    result = place_job(SEED, free, _job(2, ep=8, model=FACTS))
    assert isinstance(result, Placement)
    _check(SEED, free, _job(2, ep=8, model=FACTS), result)
    assert "span ToRs of one pod" in result.reason
    groups: dict[int, set[str]] = {}
    for u in result.units:
        groups.setdefault(u.dp_rank, set()).add(SEED.server(u.server).pod_id)
    assert all(len(p) == 1 for p in groups.values())
    # in the best-fitting pod (two ToRs of 8 free: nothing stranded), the group
    # stays under one ToR
    free -= {s.id for s in SEED.pods[4].servers}
    free |= {s.id for s in SEED.pods[4].tors[1].servers[:8]}
    free |= {s.id for s in SEED.pods[4].tors[2].servers[:8]}
    one = place_job(SEED, free, _job(1, ep=8))
    assert isinstance(one, Placement)
    assert len({SEED.server(s).tor_id for s in one.servers}) == 1
    assert {SEED.server(s).pod_id for s in one.servers} == {"pod-4"}
    assert "span ToRs" not in one.reason


def _busy_but(cluster: Cluster, free_per_tor: dict[str, int]) -> set[str]:
    """Free servers: the first n of each named ToR, every other server busy."""
    return {s.id for t, n in free_per_tor.items() for s in cluster.tors_by_id[t].servers[:n]}


def test_ep_job_takes_the_tor_gaps_of_a_partly_used_pod_not_a_whole_pod() -> None:
    """The gap case: whole-ToR ep=8 groups left 8, 8, 7, 7, 7 free on pod-0's ToRs.

    A 4-group ep=8 job fits pod-0 only if two groups span its ToRs; placing all
    four under ToRs of the whole pod-1 instead (as placement did when some ToR of
    the cluster had room) strands pod-0's 7-server gaps and breaks pod-1, and the
    75-server job that follows finds no pod (48 free servers in two pods).
    """
    gaps = {"pod-0/tor-0": 8, "pod-0/tor-1": 8, "pod-0/tor-2": 7, "pod-0/tor-3": 7}
    gaps["pod-0/tor-4"] = 7
    free = _busy_but(SEED, gaps) | {s.id for s in SEED.pods[1].servers}
    job = _job(4, ep=8, model=FACTS)
    moe = place_job(SEED, free, job)
    assert isinstance(moe, Placement)
    _check(SEED, free, job, moe)
    assert {SEED.server(s).pod_id for s in moe.servers} == {"pod-0"}
    assert "span ToRs of one pod" in moe.reason
    groups: dict[int, set[str]] = {}
    for u in moe.units:
        groups.setdefault(u.dp_rank, set()).add(SEED.server(u.server).tor_id)
    whole = sorted(t for tors in groups.values() if len(tors) == 1 for t in tors)
    assert whole == ["pod-0/tor-0", "pod-0/tor-1"]  # the ToRs with room keep theirs
    free -= set(moe.servers)
    big = place_job(SEED, free, _job(75, model=FACTS))
    assert isinstance(big, Placement)
    assert {SEED.server(s).pod_id for s in big.servers} == {"pod-1"}


def test_ep_job_uses_seven_server_gaps_of_one_pod_rather_than_two_pods() -> None:
    """Every ToR has 7 free servers: an 8-group ep=4 job fits one pod (5 groups under
    ToRs, 3 from the 3-server remainders), not two pods' whole-ToR slots."""
    free = _busy_but(SEED, {t.id: 7 for p in SEED.pods for t in p.tors})
    job = _job(8, ep=4, model=FACTS)
    result = place_job(SEED, free, job)
    assert isinstance(result, Placement)
    _check(SEED, free, job, result)
    assert len({SEED.server(s).pod_id for s in result.servers}) == 1
    tors: dict[int, set[str]] = {}
    for u in result.units:
        tors.setdefault(u.dp_rank, set()).add(SEED.server(u.server).tor_id)
    assert sorted(len(t) for t in tors.values()) == [1, 1, 1, 1, 1, 2, 2, 2]


def test_inc_keeps_each_dp_group_under_one_tor_or_pod() -> None:
    job = _job(8, pp=4, model=FACTS, collective=Collective.INC)
    result = place_job(SEED, set(SEED.server_ids), job)
    assert isinstance(result, Placement)
    tors: dict[int, set[str]] = {}
    pods: dict[int, set[str]] = {}
    for u in result.units:
        tors.setdefault(u.stage, set()).add(SEED.server(u.server).tor_id)
        pods.setdefault(u.stage, set()).add(SEED.server(u.server).pod_id)
    assert all(len(p) == 1 for p in pods.values()), result.reason
    # slots of 15 + 15 + 2 servers: two groups of 8 can sit under one ToR each
    assert sum(1 for t in tors.values() if len(t) == 1) >= 2, result.reason
    assert "DP inc" in result.reason
    small = preset("small")  # 2 ToRs of 4 per pod
    job = _job(2, pp=4, model=FACTS, collective=Collective.INC)
    result = place_job(small, set(small.server_ids), job)
    assert isinstance(result, Placement)
    by_stage: dict[int, set[str]] = {}
    for u in result.units:
        by_stage.setdefault(u.stage, set()).add(small.server(u.server).tor_id)
    assert all(len(t) == 1 for t in by_stage.values()), result.reason


@settings(max_examples=60, deadline=None)
@given(fabrics, st.data())
def test_placement_invariants_hold_over_arrivals_and_completions(
    cluster: Cluster, data: st.DataObject
) -> None:
    """A sequence of arrivals and completions: every placement keeps the rules of `_check`
    against the servers free at that moment, no server is ever held by two running
    jobs, and a job waits only when the pods hold too few whole EP groups for it, or
    when every layout of the free servers has a pod with too few uplinks for its pairs."""
    free = set(cluster.server_ids)
    running: dict[str, tuple[str, ...]] = {}
    for i in range(data.draw(st.integers(1, 12))):
        if running and data.draw(st.booleans()):
            done = data.draw(st.sampled_from(sorted(running)))
            free |= set(running.pop(done))
            continue
        ep, dp, pp = (data.draw(st.integers(1, n)) for n in (4, 6, 3))
        job = Job(f"j{i}", Parallelism(dp=dp, pp=pp, ep=ep), model=FACTS)
        result = place_job(cluster, free, job)
        if isinstance(result, Placement):
            _check(cluster, free, job, result)
            held = {s for servers in running.values() for s in servers}
            assert held.isdisjoint(result.servers)
            running[job.job_id] = result.servers
            free -= set(result.servers)
        elif result.reasons == (NOT_NOW_UPLINKS,):
            # waits for a layout whose pods can join its pairs (a pod in a ring and a
            # pipeline's middle crosses more pairs than it has uplinks): the same
            # servers on pods with ample uplinks place it
            assert _places_with_ample_uplinks(cluster, free, job)
        elif not result.never_fits:
            assert _pod_capacity(cluster, free, ep) < dp * pp
    held = [s for servers in running.values() for s in servers]
    assert len(held) == len(set(held)) and free.isdisjoint(held)
    assert free | set(held) == set(cluster.server_ids)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_free_servers_are_the_same_visited_by_server_or_by_fabric(data: st.DataObject) -> None:
    """A busy cluster's free servers are found by visiting them, an idle one's by
    walking the fabric; both give the same ToR lists in fabric order (placement,
    and so every layout, depends on that order)."""
    cluster = data.draw(st.sampled_from([SEED, preset("small")]))
    ids = list(cluster.server_ids)
    free = set(data.draw(st.lists(st.sampled_from(ids), max_size=len(ids) // 3)))
    free |= set(data.draw(st.lists(st.sampled_from(["not-a-server", "pod-9/x"]), max_size=2)))
    by_server = _free_servers(cluster, free, visit_free=True)
    by_fabric = _free_servers(cluster, free, visit_free=False)
    assert by_server == by_fabric
    assert sum(by_fabric[1].values()) == len(free & set(ids))
    # fewer free servers than the job needs: busy at once, as the full scan says
    job = _job(max(1, len(free) + 1))
    if not never_fits(cluster, job):
        result = place_job(cluster, free, job)
        assert isinstance(result, Unplaceable) and result.reasons == (NOT_NOW_BUSY,)


STARVED = build_cluster(
    "starved",
    pods=6,
    tors_per_pod=1,
    servers_per_tor=3,
    uplink_ports_per_pod=1,
    oxcs=1,
    oxc_ports=6,
)


def test_a_job_whose_pods_cannot_be_joined_by_circuits_never_fits() -> None:
    """Three-server pods with one uplink each: a 7-server job spans 3 pods, which one
    port each cannot join (a connected graph over 3 pods needs 4 port ends). Before,
    it was placed and never served; now it is refused as never fitting."""
    wide = Job("wide", Parallelism(dp=7, pp=1), FACTS)
    reasons = never_fits(STARVED, wide)
    assert reasons and reasons[0].startswith(NEVER_TOO_FEW_UPLINKS), reasons
    result = place_job(STARVED, set(STARVED.server_ids), wide)
    assert isinstance(result, Unplaceable) and result.never_fits
    # two pods need one circuit: that still fits
    pair = Job("pair", Parallelism(dp=5, pp=1), FACTS)
    assert never_fits(STARVED, pair) == ()
    placed = place_job(STARVED, set(STARVED.server_ids), pair)
    assert isinstance(placed, Placement)


def _wired(pods: int, wiring: dict[str, tuple[str, ...]], electrical_gbps: float = 0.0) -> Cluster:
    """`pods` pods of 2 ToRs x 4 servers, 16 uplinks each, on OXCs wired as `wiring`
    says (OXC id -> the pods with uplinks on it) instead of every pod on every OXC."""
    base = build_cluster(
        "wired",
        pods=pods,
        tors_per_pod=2,
        servers_per_tor=4,
        uplink_ports_per_pod=16,
        oxcs=2,
        oxc_ports=64,
        pod_electrical_gbps=electrical_gbps,
    )
    reconfig_ms = base.oxcs[0].reconfig_ms
    oxcs = tuple(
        Oxc(oxc, 64, reconfig_ms, {p: tuple(range(16 * i, 16 * (i + 1))) for i, p in enumerate(on)})
        for oxc, on in wiring.items()
    )
    return dataclasses.replace(base, oxcs=oxcs)


def _split_fabric(electrical_gbps: float = 0.0) -> Cluster:
    """`small`'s 4 pods with pods 0-1 wired only to oxc-0 and pods 2-3 only to oxc-1."""
    halves = {"oxc-0": ("pod-0", "pod-1"), "oxc-1": ("pod-2", "pod-3")}
    return _wired(4, halves, electrical_gbps)


def test_a_job_never_spans_pods_no_oxc_joins() -> None:
    """A fabric whose OXCs reach pods 0-1 and pods 2-3 apart (a helper's held-out
    cluster file): a job needing all four pods was placed with its pipeline's flows
    between the halves unrouted and reported `shared` on circuits that could never
    carry them. It never fits; a smaller one goes into one half; with only servers
    across the halves free it waits."""
    cluster = _split_fabric()
    assert cluster.joined_pod_sets == (
        frozenset({"pod-0", "pod-1"}),
        frozenset({"pod-2", "pod-3"}),
    )
    whole = place_job(cluster, set(cluster.server_ids), _job(32, model=FACTS))
    assert isinstance(whole, Unplaceable) and whole.never_fits
    assert whole.reasons == (NEVER_PODS_NOT_JOINED,)
    job = Job("half", Parallelism(dp=6, pp=2), FACTS)
    free = {s for s in cluster.server_ids if not s.startswith("pod-0/")}
    placed = place_job(cluster, free, job)
    assert isinstance(placed, Placement)
    assert {cluster.server(s).pod_id for s in placed.servers} == {"pod-2", "pod-3"}
    across = {s for s in cluster.server_ids if s.startswith(("pod-1/", "pod-2/"))}
    waits = place_job(cluster, across, job)
    assert isinstance(waits, Unplaceable) and waits.reasons == (NOT_NOW_UPLINKS,)
    # a job stating no model facts waits too, with or without the spread limit: the
    # pods' reach is checked whatever traffic the job is modelled to send
    bare = Job("bare", Parallelism(dp=6, pp=2))
    for limit in (None, 1):
        waits = place_job(cluster, across, bare, max_extra_pods=limit)
        assert isinstance(waits, Unplaceable) and waits.reasons == (NOT_NOW_UPLINKS,)
    # electrical cores join every pod: the same job spans the halves over them
    cored = _split_fabric(electrical_gbps=800.0)
    assert len(cored.joined_pod_sets) == 1
    assert isinstance(place_job(cored, set(cored.server_ids), _job(32, model=FACTS)), Placement)
    assert isinstance(place_job(cored, across, job), Placement)


def test_pods_with_an_electrical_core_need_no_uplinks_to_be_joined() -> None:
    """One uplink per pod and an 800 Gb/s electrical core each (a helper's held-out
    cluster): a 24-server job over three pods was refused as never fitting for want
    of uplinks, though the core carries what circuits cannot."""

    def thin(electrical_gbps: float) -> Cluster:
        return build_cluster(
            "thin",
            pods=4,
            tors_per_pod=2,
            servers_per_tor=4,
            uplink_ports_per_pod=1,
            oxcs=1,
            oxc_ports=4,
            pod_electrical_gbps=electrical_gbps,
        )

    bare = thin(0.0)
    job = Job("wide", Parallelism(dp=8, pp=3), FACTS)
    refused = place_job(bare, set(bare.server_ids), job)
    assert isinstance(refused, Unplaceable) and refused.never_fits
    assert refused.reasons[0].startswith(NEVER_TOO_FEW_UPLINKS)
    cored = thin(800.0)
    assert isinstance(place_job(cored, set(cored.server_ids), job), Placement)


def test_a_job_spans_only_pods_every_two_of_which_an_oxc_joins() -> None:
    """oxc-0 wires pods 0-1, oxc-1 pods 1-2. A job over all three was admitted (pod 1
    relays between 0 and 2) and ran `shared`, alone in the turns: the allocation builds
    a circuit only on an OXC wired to both pods, never one relayed through a pod. A
    sweep then found the relay outside the job: a two-pod job on pods 0 and 3 of
    oxc-0 = {0, 1, 2}, oxc-1 = {1, 2, 3} got no circuit at all. A job now spans only
    pods every two of which one OXC joins."""
    chain = _wired(3, {"oxc-0": ("pod-0", "pod-1"), "oxc-1": ("pod-1", "pod-2")})
    assert chain.joined_pod_sets == (
        frozenset({"pod-0", "pod-1"}),
        frozenset({"pod-1", "pod-2"}),
    )
    for job in (_job(24, model=FACTS), Job("pp", Parallelism(dp=12, pp=2), FACTS)):
        assert never_fits(chain, job) == (NEVER_PODS_NOT_JOINED,)
    pair = Job("pair", Parallelism(dp=8, pp=2), FACTS)
    placed = place_job(chain, set(chain.server_ids), pair)
    assert isinstance(placed, Placement)
    pods = {chain.server(s).pod_id for s in placed.servers}
    assert pods in ({"pod-0", "pod-1"}, {"pod-1", "pod-2"})
    # with pod 1 busy, only pods 0 and 2 are free: it waits
    free = {s for s in chain.server_ids if not s.startswith("pod-1/")}
    waits = place_job(chain, free, pair)
    assert isinstance(waits, Unplaceable) and waits.reasons == (NOT_NOW_UPLINKS,)


def test_two_overlapping_sets_of_joined_pods_place_a_job_inside_one() -> None:
    """The sweep's cluster: oxc-0 wired to pods 0-2, oxc-1 to pods 1-3. A 16-server job
    went on pods 0 and 3, which no OXC joins; it now goes on two pods of one set and
    every pair it crosses gets circuits."""
    overlap = _wired(
        4, {"oxc-0": ("pod-0", "pod-1", "pod-2"), "oxc-1": ("pod-1", "pod-2", "pod-3")}
    )
    assert overlap.joined_pod_sets == (
        frozenset({"pod-0", "pod-1", "pod-2"}),
        frozenset({"pod-1", "pod-2", "pod-3"}),
    )
    job = Job("c2", Parallelism(dp=7, pp=2), FACTS)

    def on(pod: str) -> list[str]:
        return [s for s in overlap.server_ids if s.startswith(pod + "/")]

    # as the sweep's pods of 8, 7 and 6 servers: the best fit for the job's tail was
    # pod 3, across from pod 0
    free = {*on("pod-0"), *on("pod-2")[:7], *on("pod-3")[:6]}
    placed = place_job(overlap, free, job)
    assert isinstance(placed, Placement)
    pods = sorted({overlap.server(s).pod_id for s in placed.servers})
    assert all(overlap.can_join(a, b) for a in pods for b in pods if a < b), pods
    fresh = new_controller(overlap, ControllerConfig(reconfig_ms=25.0))
    state, _ = step(fresh, JobPlaced(job, placed, 0.0))
    view = network_view(state, job.job_id)
    assert view is not None and view.mode == "isolated" and view.pod_ports, view


def test_joined_sets_of_an_oddly_wired_hundred_pods_take_polynomial_time() -> None:
    """Every maximal clique of 100 pods each wired to 5 of 24 OXCs numbered 242,513 (9 s
    to list, a review found) and placement walked them all per job: the sets are
    grown greedily now, at most one per pod, each a set of pods every two of which an
    OXC joins."""
    import random

    from app.engine.cluster import cluster_from_dict

    rng = random.Random(7)
    wired: dict[str, list[str]] = {f"oxc-{o}": [] for o in range(24)}
    pods = []
    for p in range(100):
        on = rng.sample(sorted(wired), 5)
        for o in on:
            wired[o].append(f"pod-{p}")
        servers = [{"id": f"pod-{p}/tor-0/srv-{k}"} for k in range(4)]
        pods.append(
            {
                "id": f"pod-{p}",
                "uplink_ports": 5,
                "tors": [{"id": f"pod-{p}/tor-0", "servers": servers}],
            }
        )
    oxcs = [
        {"id": o, "ports": len(on), "pod_ports": {pod: [k] for k, pod in enumerate(on)}}
        for o, on in wired.items()
    ]
    cluster = cluster_from_dict({"pods": pods, "oxcs": oxcs})
    sets = cluster.joined_pod_sets
    assert 1 <= len(sets) <= 100  # at most one per pod (every maximal clique: 10**5)
    for s in sets:
        assert all(cluster.can_join(a, b) for a in s for b in s if a < b)
    job = Job("wide", Parallelism(dp=6, pp=2), FACTS)  # 12 servers: at least 3 pods
    placed = place_job(cluster, set(cluster.server_ids), job)
    assert isinstance(placed, Placement)
    used = {cluster.server(x).pod_id for x in placed.servers}
    assert all(cluster.can_join(a, b) for a in used for b in used if a < b), used


def test_a_job_no_layout_of_which_has_the_uplinks_never_fits() -> None:
    """A sweep: a 6-server ring over three 2-server pods, the middle one with a single
    uplink, passed admission's counts (7 uplinks over 3 pods), waited for ever at the
    head of the queue, and its reservation held a 1-server job behind it on an empty
    cluster."""
    from app.engine.cluster import cluster_from_dict
    from app.engine.placement import NEVER_NO_LAYOUT, never_fits, place_job

    def pod(i: int, uplinks: int) -> dict[str, object]:
        servers = [{"id": f"p{i}/s{k}"} for k in range(2)]
        return {
            "id": f"p{i}",
            "uplink_ports": uplinks,
            "tors": [{"id": f"p{i}/t0", "servers": servers}],
        }

    cluster = cluster_from_dict(
        {
            "pods": [pod(0, 2), pod(1, 1), pod(2, 2)],
            "oxcs": [{"id": "o0", "ports": 5, "reconfig_ms": 25,
                      "pod_ports": {"p0": [0, 1], "p1": [2], "p2": [3, 4]}}],
        }
    )  # fmt: skip
    wide = Job("wide", Parallelism(dp=6, pp=1))
    assert never_fits(cluster, wide) == (NEVER_NO_LAYOUT,)
    got = place_job(cluster, frozenset(cluster.server_ids), wide)
    assert isinstance(got, Unplaceable) and got.never_fits
    # two pods (4 servers): p0 and p2 have the uplinks for their one pair
    assert never_fits(cluster, Job("four", Parallelism(dp=4, pp=1))) == ()
    assert never_fits(cluster, Job("one", Parallelism(dp=1, pp=1))) == ()


def test_a_job_the_better_wired_pods_hold_is_not_refused() -> None:
    """A review: the placer on the empty cluster chose a 3-server pod with 1 uplink for a
    6-server ring, found it short and the job was refused for good, while three pods of
    2 servers and 2 uplinks each held it."""
    _better_wired([(3, 1), (2, 2), (2, 2), (2, 2)], 6)
    # a review: the retry kept pods with an uplink per other pod of the fewest (4 for
    # 12 servers: 3 uplinks), so none, while six pods of 2 uplinks held a 6-pod ring
    _better_wired([(6, 1)] + [(2, 2)] * 6, 12)


def _better_wired(sizes: list[tuple[int, int]], servers: int) -> None:
    from app.engine.cluster import cluster_from_dict
    from app.engine.placement import never_fits, place_job

    pods, ports, nxt = [], {}, 0
    for i, (size, uplinks) in enumerate(sizes):
        srv = [{"id": f"p{i}/s{k}"} for k in range(size)]
        pods.append({"id": f"p{i}", "uplink_ports": uplinks,
                     "tors": [{"id": f"p{i}/t0", "servers": srv}]})  # fmt: skip
        ports[f"p{i}"] = list(range(nxt, nxt + uplinks))
        nxt += uplinks
    cluster = cluster_from_dict(
        {"pods": pods, "oxcs": [{"id": "o0", "ports": nxt, "reconfig_ms": 25, "pod_ports": ports}]}
    )
    job = Job("ring", Parallelism(dp=servers, pp=1))
    assert never_fits(cluster, job) == ()
    # placed on the empty cluster itself, not left waiting for a short-wired pod
    got = place_job(cluster, frozenset(cluster.server_ids), job)
    assert isinstance(got, Placement) and "p0/s0" not in got.servers, got

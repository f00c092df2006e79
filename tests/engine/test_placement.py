"""Placement: properties on generated fabrics and occupancies, scenarios on seed-15k."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.cluster import Cluster, build_cluster, preset
from app.engine.job import Collective, Job, ModelFacts, Parallelism, Placement, Unplaceable
from app.engine.placement import NOT_NOW_BUSY, never_fits, place_job

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
    tor_of_group: dict[tuple[int, int], set[str]] = {}
    pod_of_group: dict[tuple[int, int], set[str]] = {}
    for u in placement.units:
        tor_of_group.setdefault((u.stage, u.dp_rank), set()).add(cluster.server(u.server).tor_id)
        pod_of_group.setdefault((u.stage, u.dp_rank), set()).add(cluster.server(u.server).pod_id)
    assert all(len(pods) == 1 for pods in pod_of_group.values())  # EP never across pods
    if _capacity(cluster, free, par.ep) >= par.dp * par.pp:
        assert all(len(tors) == 1 for tors in tor_of_group.values())  # EP under one ToR
    else:
        assert "span ToRs of one pod" in placement.reason


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


@settings(max_examples=150, deadline=None)
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
    result = place_job(cluster, free, job)
    if isinstance(result, Placement):
        _check(cluster, free, job, result)
        assert result.reason.startswith("layout ")
    elif not result.never_fits:
        # A job waits only when the free servers hold too few whole EP groups in pods.
        assert result.reasons == (NOT_NOW_BUSY,)
        assert _pod_capacity(cluster, free, ep) < dp * pp
    else:
        assert never_fits(cluster, job) == result.reasons


def test_never_fits_reasons() -> None:
    small = preset("small")
    assert never_fits(small, _job(64))
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
    # with one ToR of 8 free servers, the group stays under it
    free |= {s.id for s in SEED.pods[4].tors[1].servers}
    one = place_job(SEED, free, _job(1, ep=8))
    assert isinstance(one, Placement)
    assert {SEED.server(s).tor_id for s in one.servers} == {"pod-4/tor-1"}
    assert "span ToRs" not in one.reason


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

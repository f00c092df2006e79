"""Collective cost models and INC aggregator accounting."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.cluster import preset
from app.engine.collective import (
    ALPHA_INC_S,
    ALPHA_RING_S,
    REDUCE_S_PER_BYTE,
    AggregatorGrant,
    AggregatorLedger,
    CollectiveChoice,
    choose_collective,
    choose_iteration_collective,
    hierarchical_ring_time_s,
    inc_time_s,
    ring_time_s,
    tree_time_s,
)
from app.engine.job import Collective, Job, ModelFacts, Parallelism, Placement, Unit

SMALL = preset("small")


def _job(
    dp: int, pp: int = 1, collective: Collective = Collective.AUTO, params: float = 1e9
) -> Job:
    return Job("j", Parallelism(dp=dp, pp=pp), ModelFacts(params, 2.0), collective=collective)


def _placement(servers: list[str], pp: int = 1) -> Placement:
    dp = len(servers) // pp
    units = tuple(Unit(s, i // dp, i % dp, 0) for i, s in enumerate(servers))
    return Placement("j", units)


def test_ring_matches_hand_computed_value() -> None:
    # N=4, S=1e9 B, B=5e10 B/s: 3 * (2a + 2e9/(4*5e10) + 1e9*C/4)
    expected = 3 * (2 * ALPHA_RING_S + 0.01 + 1e9 * REDUCE_S_PER_BYTE / 4)
    assert math.isclose(ring_time_s(4, 1e9, 5e10), expected)
    assert math.isclose(
        ring_time_s(4, 1e9, 5e10, alpha_s=1e-5, reduce_s_per_byte=0), 3 * (2e-5 + 0.01)
    )


def test_ring_limits_follow_spec() -> None:
    # large S: T -> 2S/B + S*C (N large); tiny S: T -> 2(N-1)alpha
    n, s, b = 1000, 1e12, 5e10
    assert math.isclose(ring_time_s(n, s, b), 2 * s / b + s * REDUCE_S_PER_BYTE, rel_tol=0.01)
    assert math.isclose(ring_time_s(n, 1.0, b), 2 * (n - 1) * ALPHA_RING_S, rel_tol=0.01)


def test_tree_matches_hand_computed_value() -> None:
    a, s, b = 1e-5, 1e8, 1e10
    lg = 3.0  # N = 8
    expected = 4 * a * lg + 2 * s / b + 2 * math.sqrt(8 * lg * a * s / b)
    assert math.isclose(tree_time_s(8, s, b, alpha_s=a, reduce_s_per_byte=0), expected)


def test_tree_beats_ring_for_tiny_messages_on_many_nodes() -> None:
    assert tree_time_s(1024, 1e3, 5e10) < ring_time_s(1024, 1e3, 5e10)


def test_hierarchical_ring_is_two_rings() -> None:
    got = hierarchical_ring_time_s([4, 4], 1e9, 5e10, 2.5e10)
    assert math.isclose(got, ring_time_s(4, 1e9, 5e10) + ring_time_s(2, 1e9 / 4, 2.5e10))


def test_inc_hand_value_and_single_member_is_free() -> None:
    assert math.isclose(inc_time_s(1e9, 5e10, 2), 4 * ALPHA_INC_S + 0.02)
    assert ring_time_s(1, 1e9, 1.0) == tree_time_s(1, 1e9, 1.0) == 0.0


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(2, 512),
    s=st.floats(1.0, 1e11),
    grow=st.floats(1.0, 10.0),
    b=st.floats(1e8, 1e12),
)
def test_costs_are_monotone_in_size(n: int, s: float, grow: float, b: float) -> None:
    assert ring_time_s(n, s * grow, b) >= ring_time_s(n, s, b)
    assert tree_time_s(n, s * grow, b) >= tree_time_s(n, s, b)
    assert inc_time_s(s * grow, b, 1) >= inc_time_s(s, b, 1)
    assert hierarchical_ring_time_s([n, n], s * grow, b, b) >= hierarchical_ring_time_s(
        [n, n], s, b, b
    )


def test_auto_picks_inc_when_latency_bound_and_reserves_capacity() -> None:
    # S = 2e5 B: ring pays 2*(N-1)*alpha = 84 us, INC 2*alpha_inc + S/B ~ 70 us
    tor = SMALL.pods[0].tors[0]
    servers = [s.id for s in tor.servers]
    choice = choose_collective(SMALL, _job(4, params=1e5), _placement(servers), AggregatorLedger())
    assert choice.algorithm == "inc" and choice.inc
    assert choice.aggregators == (tor.id,)
    assert sum(g.gbps for g in choice.grants) <= tor.aggregator_gbps + 1e-9
    assert choice.to_dict()["estimated_allreduce_s"] == choice.estimated_allreduce_s


def test_auto_avoids_inc_when_the_aggregator_is_slower_than_a_ring() -> None:
    # 4 members share 800 Gb/s of aggregator: 200 Gb/s each, a ring runs at 3.2 Tb/s
    servers = [s.id for s in SMALL.pods[0].tors[0].servers]
    choice = choose_collective(SMALL, _job(4, params=1e9), _placement(servers), AggregatorLedger())
    assert not choice.inc and "inc" in choice.reason


def test_full_aggregators_fall_back_and_say_why() -> None:
    tor = SMALL.pods[0].tors[0]
    full = AggregatorLedger((AggregatorGrant(tor.id, "other", tor.aggregator_gbps),))
    job = _job(4, collective=Collective.INC)
    choice = choose_collective(SMALL, job, _placement([s.id for s in tor.servers]), full)
    assert not choice.inc and choice.algorithm in ("ring", "tree")
    assert "aggregators full" in choice.reason and tor.id in choice.reason


def test_forced_algorithm_is_honoured() -> None:
    servers = [s.id for s in SMALL.pods[0].tors[0].servers]
    for forced in (Collective.RING, Collective.TREE, Collective.HIERARCHICAL_RING):
        choice = choose_collective(
            SMALL, _job(4, collective=forced), _placement(servers), AggregatorLedger()
        )
        assert choice.algorithm == forced.value and not choice.inc


def test_two_level_inc_across_pods_uses_a_root() -> None:
    # one member per pod: no ToR combines anything, the root pod's spine takes both
    servers = [SMALL.pods[0].tors[0].servers[0].id, SMALL.pods[1].tors[0].servers[0].id]
    choice = choose_collective(
        SMALL, _job(2, collective=Collective.INC), _placement(servers), AggregatorLedger()
    )
    assert choice.inc and choice.root_tors
    root_pod = SMALL.tors_by_id[choice.root_tors[0][1]].pod_id
    assert choice.aggregators == (root_pod,)
    assert {g.tor_id: g.gbps for g in choice.grants}[root_pod] <= 1600.0 + 1e-9


def test_no_circuits_makes_ring_infinite_and_inc_avoids_it() -> None:
    servers = [SMALL.pods[0].tors[0].servers[0].id, SMALL.pods[1].tors[0].servers[0].id]
    choice = choose_collective(SMALL, _job(2), _placement(servers), AggregatorLedger(), pod_gbps={})
    costs = dict(choice.costs)
    assert math.isinf(costs["ring"])


@settings(max_examples=40, deadline=None)
@given(
    jobs=st.lists(
        st.tuples(st.integers(0, 7), st.integers(2, 4), st.sampled_from(list(Collective))),
        min_size=1,
        max_size=8,
    )
)
def test_aggregator_capacity_is_never_exceeded(jobs: list[tuple[int, int, Collective]]) -> None:
    ledger = AggregatorLedger()
    all_tors = [t for p in SMALL.pods for t in p.tors]
    for k, (start, dp, forced) in enumerate(jobs):
        servers = [all_tors[(start + i) % len(all_tors)].servers[k % 4].id for i in range(dp)]
        job = Job(f"j{k}", Parallelism(dp=dp, pp=1), ModelFacts(1e9, 2.0), collective=forced)
        placement = Placement(job.job_id, tuple(Unit(s, 0, i, 0) for i, s in enumerate(servers)))
        choice = choose_collective(SMALL, job, placement, ledger)
        ledger = ledger.reserve(SMALL, choice.grants)
        for tor in all_tors:
            assert ledger.used_gbps(tor.id) <= tor.aggregator_gbps * (1 + 1e-9)
    released = ledger.release("j0")
    assert not released.of_job("j0")


def test_inc_wins_across_pods_when_circuits_are_scarce() -> None:
    """Two pods, 4 members each under one ToR, 2 circuits between the pods.

    A ring crosses the pods twice each way with 2(N-1)/N x S per edge; INC sends
    one S per pod over the circuits, so it wins while the ToR aggregators keep up.
    """
    cluster = preset("seed-15k")
    a = [s.id for s in cluster.pods[0].tors[0].servers[:2]]
    b = [s.id for s in cluster.pods[1].tors[0].servers[:2]]
    job = _job(4, params=70e9)
    scarce = {("pod-0", "pod-1"): 2 * cluster.nic_gbps}
    choice = choose_collective(cluster, job, _placement(a + b), AggregatorLedger(), scarce)
    assert choice.algorithm == "inc", choice.reason
    assert set(choice.aggregators) == {"pod-0/tor-0", "pod-1/tor-0", choice_root(choice)}
    roomy = {("pod-0", "pod-1"): 64 * cluster.nic_gbps}
    plenty = choose_collective(cluster, job, _placement(a + b), AggregatorLedger(), roomy)
    assert plenty.algorithm != "inc"  # with circuits to spare a ring beats the aggregators


def choice_root(choice: CollectiveChoice) -> str:
    return SEED.tors_by_id[choice.root_tors[0][1]].pod_id


SEED = preset("seed-15k")


def test_the_iteration_choice_follows_aggregators_filling_and_freeing() -> None:
    cluster = SEED
    a = [s.id for s in cluster.pods[0].tors[0].servers[:2]]
    b = [s.id for s in cluster.pods[1].tors[0].servers[:2]]
    job = _job(4, params=70e9)
    placement = _placement(a + b)
    scarce = {("pod-0", "pod-1"): 2 * cluster.nic_gbps}
    first = choose_collective(cluster, job, placement, AggregatorLedger(), scarce)
    assert first.inc
    ledger = AggregatorLedger(first.grants)
    # nothing changed: the same choice, no new header
    assert choose_iteration_collective(cluster, job, placement, ledger, first, scarce) is first
    # another job fills pod-0/tor-0's aggregator: its members go straight to the spine
    tor_cap = cluster.tors_by_id["pod-0/tor-0"].aggregator_gbps
    hog = AggregatorGrant("pod-0/tor-0", "hog", tor_cap)
    spine = choose_iteration_collective(
        cluster, job, placement, AggregatorLedger((hog,)), first, scarce
    )
    assert spine.inc and "pod-0" in spine.aggregators and "pod-0/tor-0" not in spine.aggregators
    # and when the spine fills too, the next iteration falls back to a ring
    spine_cap = cluster.pods_by_id["pod-0"].aggregator_gbps
    busy = AggregatorLedger((hog, AggregatorGrant("pod-0", "hog", spine_cap)))
    fallback = choose_iteration_collective(cluster, job, placement, busy, spine, scarce)
    assert not fallback.inc and fallback.algorithm != "inc"
    assert "per iteration" in fallback.reason
    # the hog completes: INC comes back for the iteration after
    back = choose_iteration_collective(
        cluster, job, placement, AggregatorLedger(), fallback, scarce
    )
    assert back.inc and back.algorithm == "inc"
    # and the routing header of the dp phase says which, iteration by iteration
    from app.engine.circuits import PodCircuits
    from app.engine.fabric import route_phases
    from app.engine.traffic import job_traffic

    circuits = PodCircuits.from_pairs(("pod-0", "pod-1"), [("pod-0", "pod-1", 2)])
    budget = {"pod-0": 2, "pod-1": 2}
    headers = []
    for choice in (first, fallback, back):
        traffic = job_traffic(cluster, job, placement, choice.algorithm, dict(choice.root_tors))
        dp = next(
            r
            for r in route_phases(cluster, "j", traffic, choice, circuits, budget)
            if r.phase == "dp"
        )
        headers.append((dp.algorithm, dp.inc, dp.aggregators))
    assert headers[0][1] and not headers[1][1] and headers[2][1]
    assert headers[0] == headers[2] and headers[0] != headers[1]

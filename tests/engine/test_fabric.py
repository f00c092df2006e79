"""The multi-job fabric plan: slices, minimal change, routing and decisions."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.circuits import PodCircuits
from app.engine.cluster import preset
from app.engine.collective import AggregatorLedger
from app.engine.cross_connects import cross_connects_by_job, port_pods, realised_circuits
from app.engine.fabric import (
    MODE_ISOLATED,
    MODE_NONE,
    MODE_TIME_DIVISION,
    FabricPlan,
    PlacedJob,
    diff_plans,
    plan_fabric,
    plan_topology,
    route_observed,
)
from app.engine.job import Collective, Job, ModelFacts, Parallelism, Placement, Unit
from app.engine.traffic import DemandMatrix, Flow

SMALL = preset("small")


def _spread_job(job_id: str, pods: list[int], slot: int, dp: int = 2) -> PlacedJob:
    """A dp x pp=len(pods) job with stage s in pods[s], using server `slot`.. of each ToR."""
    job = Job(
        job_id,
        Parallelism(dp=dp, pp=len(pods)),
        ModelFacts(2e9, 2.0, 3e7, 8),
        collective=Collective.RING,
    )
    units = []
    for stage, pod in enumerate(pods):
        for rank in range(dp):
            tor = SMALL.pods[pod].tors[rank % 2]
            units.append(Unit(tor.servers[slot + rank // 2].id, stage, rank, 0))
    return PlacedJob(job, Placement(job_id, tuple(units)))


def _check_fabric(plan: FabricPlan) -> None:
    where = port_pods(SMALL)
    seen: set[tuple[str, int]] = set()
    for cc in plan.cross_connects:
        for port in (cc.port_a, cc.port_b):
            assert (cc.oxc_id, port) in where and (cc.oxc_id, port) not in seen
            seen.add((cc.oxc_id, port))
    for pod in SMALL.pods:
        assert realised_circuits(SMALL, plan.cross_connects).row_sum(pod.id) <= pod.uplink_ports
    for tor in (t for p in SMALL.pods for t in p.tors):
        assert plan.aggregators.used_gbps(tor.id) <= tor.aggregator_gbps * (1 + 1e-9)


def test_single_job_gets_isolated_slice_and_routes() -> None:
    pj = _spread_job("a", [0, 1], 0)
    plan = plan_fabric(SMALL, [pj], (), AggregatorLedger())
    _check_fabric(plan)
    jf = plan.job("a")
    assert jf is not None and jf.slice.mode == MODE_ISOLATED
    assert jf.circuits.get("pod-0", "pod-1") > 0
    assert {cc.job_id for cc in plan.cross_connects} == {"a"}
    pp = next(r for r in jf.routing if r.phase == "pp")
    assert pp.algorithm == "send_recv"
    assert all(r.path == ("pod-0", "pod-1") or r.path == ("pod-1", "pod-0") for r in pp.routes)
    dp = next(r for r in jf.routing if r.phase == "dp")
    assert dp.algorithm == "ring" and all(len(r.path) == 1 for r in dp.routes)
    decisions = diff_plans(None, plan, "arrival")
    assert {d.kind for d in decisions} == {"oxc", "routing"}
    body = decisions[0].to_dict()
    assert body["kind"] == "oxc" and body["reason"] == "arrival"


def test_job_inside_one_pod_needs_no_ports() -> None:
    pj = _spread_job("a", [2, 2], 0)
    plan = plan_fabric(SMALL, [pj], (), AggregatorLedger())
    jf = plan.job("a")
    assert jf is not None and jf.slice.mode == MODE_NONE and not plan.cross_connects


def test_arrival_keeps_existing_job_and_emits_only_changes() -> None:
    a = _spread_job("a", [0, 1], 0)
    first = plan_fabric(SMALL, [a], (), AggregatorLedger())
    b = _spread_job("b", [2, 3], 0)
    second = plan_fabric(SMALL, [a, b], first.cross_connects, first.aggregators, previous=first)
    _check_fabric(second)
    a_before = {cc for cc in first.cross_connects if cc.job_id == "a"}
    assert a_before <= set(second.cross_connects)
    decisions = diff_plans(first, second, "arrival")
    assert decisions and all(d.job_id == "b" for d in decisions)
    assert all(not d.oxc or not d.oxc.disconnect for d in decisions)
    # completion of b: only b's cross-connects go
    third = plan_fabric(SMALL, [a], second.cross_connects, second.aggregators, previous=second)
    gone = diff_plans(second, third, "completion")
    assert gone and all(d.kind == "oxc" and d.oxc and not d.oxc.connect for d in gone)
    assert set(third.cross_connects) == a_before


def test_ports_run_out_then_time_division() -> None:
    # pods 0 and 1 have 16 uplinks; two 4-server-per-pod jobs want 32 ports each
    big = [_spread_job("a", [0, 1], 0, dp=4), _spread_job("b", [0, 1], 2, dp=4)]
    plan = plan_fabric(SMALL, big, (), AggregatorLedger())
    _check_fabric(plan)
    modes = {j.job_id: j.slice.mode for j in plan.jobs}
    assert modes["a"] == MODE_ISOLATED and modes["b"] == MODE_TIME_DIVISION
    b = plan.job("b")
    assert b is not None and "too few free uplink ports" in b.slice.reason
    assert plan.time_division == ("b",)


@settings(max_examples=20, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 3)).filter(lambda t: t[0] != t[1]),
        min_size=1,
        max_size=4,
    )
)
def test_fabric_invariants_and_minimal_change(pairs: list[tuple[int, int]]) -> None:
    jobs = [_spread_job(f"j{i}", [p, q], i, dp=2) for i, (p, q) in enumerate(pairs)]
    plan = None
    current: tuple = ()
    ledger = AggregatorLedger()
    for k in range(1, len(jobs) + 1):
        new = plan_fabric(SMALL, jobs[:k], current, ledger, previous=plan)
        _check_fabric(new)
        if plan is not None:
            for jf in plan.jobs:
                after = new.job(jf.job_id)
                # an arrival changes only the cross-connects of jobs whose slice it changes
                if jf.slice.mode == MODE_ISOLATED and after and after.slice == jf.slice:
                    mine = {cc for cc in plan.cross_connects if cc.job_id == jf.job_id}
                    assert mine <= set(new.cross_connects)
        _check_served(new)
        # the grouping a plan remembers for its cross-connects (worked out from the jobs
        # it left alone and those it mapped) is the one grouping the tuple gives
        grouped: dict[str, list] = {}
        for cc in new.cross_connects:
            grouped.setdefault(cc.job_id, []).append(cc)
        by_job = cross_connects_by_job(new.cross_connects)
        assert {j: list(ccs) for j, ccs in by_job.items()} == grouped
        plan, current, ledger = new, new.cross_connects, new.aggregators


def _check_served(plan: FabricPlan) -> None:
    """Every job with cross-pod traffic has its own ports or ports to take turns on."""
    pool: dict[str, int] = {p.id: p.uplink_ports for p in SMALL.pods}
    for jf in plan.jobs:
        if jf.slice.mode == MODE_ISOLATED:
            assert all(n >= 1 for _, n in jf.slice.pod_ports)
            for p, n in jf.slice.pod_ports:
                pool[p] -= n
    for jf in plan.jobs:
        if jf.slice.mode == MODE_TIME_DIVISION:
            assert jf.plan.circuits.total > 0, f"{jf.job_id} has nothing to take turns on"


def test_plan_topology_for_the_predictor() -> None:
    pods = tuple(p.id for p in SMALL.pods)
    demand = DemandMatrix.from_entries(pods, [("pod-0", "pod-3", 1e10), ("pod-3", "pod-0", 1e10)])
    plan = plan_topology(SMALL, demand)
    assert plan.circuits.get("pod-0", "pod-3") == 16
    assert plan == plan_topology(SMALL, demand)  # deterministic: comparable plans


def test_a_flow_without_a_path_costs_the_others_of_its_phase_no_route() -> None:
    """Circuits join pod-0 and pod-1 only (a pp phase's topology installed); the dp
    phase also sends pod-0 -> pod-2. Planned as a whole it had no route for any flow,
    so the dp header went out with no cross-pod route, pod-0 -> pod-1 included."""
    small = preset("small")
    a, b, c = (small.pods[i].tors[0].servers[0].id for i in range(3))
    circuits = PodCircuits.from_pairs(tuple(p.id for p in small.pods), [("pod-0", "pod-1", 4)])
    flows = (Flow(a, b, 1e9), Flow(a, c, 1e9))
    header = route_observed(small, "j", "plan-x", flows, circuits, {"pod-0": 4, "pod-1": 4})
    assert [(r.src, r.dst, r.path) for r in header.routes] == [(a, b, ("pod-0", "pod-1"))]
    # a two-hop path counts: with pod-1 joined to pod-2 too, both flows are routed
    both = PodCircuits.from_pairs(
        tuple(p.id for p in small.pods), [("pod-0", "pod-1", 4), ("pod-1", "pod-2", 4)]
    )
    budget = {"pod-0": 4, "pod-1": 8, "pod-2": 4}
    header = route_observed(small, "j", "plan-x", flows, both, budget)
    assert {r.dst: r.path for r in header.routes} == {
        b: ("pod-0", "pod-1"),
        c: ("pod-0", "pod-1", "pod-2"),
    }


def test_a_plan_remembers_its_cross_connects_by_job_in_physical_order() -> None:
    """Given the switches' state in another order (a stored state read back unordered),
    the plan's per-job grouping is still that of its own sorted cross-connects, which
    the next plan maps from (a review found the given order carried over)."""
    a, b = _spread_job("a", [0, 1], 0), _spread_job("b", [2, 3], 0)
    first = plan_fabric(SMALL, [a], (), AggregatorLedger())
    given = tuple(reversed(first.cross_connects))
    second = plan_fabric(SMALL, [a, b], given, first.aggregators, previous=first)
    grouped: dict[str, list] = {}
    for cc in second.cross_connects:
        grouped.setdefault(cc.job_id, []).append(cc)
    by_job = cross_connects_by_job(second.cross_connects)
    assert {j: list(ccs) for j, ccs in by_job.items()} == grouped

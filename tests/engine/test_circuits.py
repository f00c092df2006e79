"""Pod circuit planning: budgets, symmetry, optimality against the exact MILP."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.circuits import (
    PodCircuits,
    evaluate_circuits,
    plan_circuits,
    plan_circuits_exact,
    port_bound_s,
    route_circuits_lp,
    uniform_circuits,
)
from app.engine.traffic import DemandMatrix

PORT_GBPS = 400.0
BW = PORT_GBPS * 1e9 / 8


@st.composite
def instances(draw: st.DrawFn) -> tuple[DemandMatrix, dict[str, int]]:
    n = draw(st.integers(2, 6))
    pods = tuple(f"pod-{i}" for i in range(n))
    rows = tuple(
        tuple(
            0.0 if i == j else draw(st.sampled_from([0.0, 0.0, 1e8, 1e9, 5e9, 2e10]))
            for j in range(n)
        )
        for i in range(n)
    )
    ports = {p: draw(st.integers(0, 12)) for p in pods}
    return DemandMatrix(pods, rows), ports


def _check_valid(circuits: PodCircuits, ports: dict[str, int]) -> None:
    n = len(circuits.pod_ids)
    for i in range(n):
        assert circuits.counts[i][i] == 0
        for j in range(n):
            assert circuits.counts[i][j] == circuits.counts[j][i] >= 0
    for p in circuits.pod_ids:
        assert circuits.row_sum(p) <= ports[p]


@settings(max_examples=60, deadline=None)
@given(instances())
def test_greedy_circuits_are_symmetric_and_within_ports(
    inst: tuple[DemandMatrix, dict[str, int]],
) -> None:
    demand, ports = inst
    plan = plan_circuits(demand, ports, PORT_GBPS)
    _check_valid(plan.circuits, ports)
    if math.isfinite(plan.completion_s):
        # completion never beats the uplink bound, and the routes carry all demand
        assert plan.completion_s >= port_bound_s(demand, ports, PORT_GBPS) * (1 - 1e-6)
        for src, dst, size in demand.entries():
            routed = sum(r.size_bytes for r in plan.routes if (r.src, r.dst) == (src, dst))
            assert math.isclose(routed, size, rel_tol=1e-6)


@settings(max_examples=15, deadline=None)
@given(instances())
def test_exact_is_never_worse_than_greedy(inst: tuple[DemandMatrix, dict[str, int]]) -> None:
    demand, ports = inst
    exact = plan_circuits_exact(demand, ports, PORT_GBPS)
    greedy = plan_circuits(demand, ports, PORT_GBPS)
    _check_valid(exact.circuits, ports)
    assert exact.completion_s <= greedy.completion_s * (1 + 1e-6)


def test_two_pods_hand_computed() -> None:
    demand = DemandMatrix(("a", "b"), ((0.0, 8e9), (2e9, 0.0)))
    plan = plan_circuits(demand, {"a": 4, "b": 3}, PORT_GBPS)
    assert plan.circuits.get("a", "b") == 3
    # 8e9 B over 3 x 50 GB/s; the port bound is b's 8e9 / (3 * 50e9)
    assert math.isclose(plan.completion_s, 8e9 / (3 * BW), rel_tol=1e-5)
    assert math.isclose(plan.mlu, 1.0, rel_tol=1e-5)


def test_two_hop_relays_when_a_pair_has_no_circuit() -> None:
    pods = ("a", "b", "c")
    circuits = PodCircuits.from_pairs(pods, [("a", "c", 1), ("c", "b", 1)])
    demand = DemandMatrix.from_entries(pods, [("a", "b", 1e9)])
    plan = evaluate_circuits(demand, circuits, {"a": 1, "b": 1, "c": 2}, PORT_GBPS)
    assert [r.path for r in plan.routes] == [("a", "c", "b")]
    assert math.isclose(plan.completion_s, 1e9 / BW, rel_tol=1e-5)
    lp = route_circuits_lp(demand, circuits, {"a": 1, "b": 1, "c": 2}, PORT_GBPS)
    assert math.isclose(lp.completion_s, plan.completion_s, rel_tol=1e-5)


def test_skewed_demand_beats_uniform_static() -> None:
    pods = tuple(f"pod-{i}" for i in range(4))
    demand = DemandMatrix.from_entries(pods, [("pod-0", "pod-1", 1e10), ("pod-1", "pod-0", 1e10)])
    ports = dict.fromkeys(pods, 6)
    plan = plan_circuits(demand, ports, PORT_GBPS)
    static = evaluate_circuits(demand, uniform_circuits(pods, ports), ports, PORT_GBPS)
    assert plan.completion_s < static.completion_s
    assert plan.circuits.get("pod-0", "pod-1") == 6


def test_no_demand_and_disconnected_demand() -> None:
    pods = ("a", "b")
    empty = plan_circuits(DemandMatrix.from_entries(pods, []), {"a": 1, "b": 1}, PORT_GBPS)
    assert empty.completion_s == 0.0 and empty.circuits.total == 0
    stuck = plan_circuits(
        DemandMatrix.from_entries(pods, [("a", "b", 1.0)]), {"a": 0, "b": 1}, PORT_GBPS
    )
    assert math.isinf(stuck.completion_s) and stuck.reason


def test_to_dict_lists_both_directions() -> None:
    c = PodCircuits.from_pairs(("a", "b"), [("a", "b", 2)])
    assert c.to_dict() == {"a": {"b": 2}, "b": {"a": 2}}

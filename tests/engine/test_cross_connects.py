"""Mapping circuits onto OXC ports with minimal change, and diffs."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.circuits import PodCircuits
from app.engine.cluster import build_cluster, preset
from app.engine.cross_connects import (
    CrossConnect,
    changed_cross_connects,
    cross_connects_by_job,
    diff_cross_connects,
    map_cross_connects,
    port_pods,
    realised_circuits,
)

SMALL = preset("small")
PODS = tuple(p.id for p in SMALL.pods)


@st.composite
def wanted_circuits(draw: st.DrawFn) -> dict[str, PodCircuits]:
    jobs = draw(st.integers(1, 3))
    out = {}
    for k in range(jobs):
        pairs = [
            (PODS[i], PODS[j], draw(st.integers(0, 6)))
            for i in range(len(PODS))
            for j in range(i + 1, len(PODS))
        ]
        out[f"job-{k}"] = PodCircuits.from_pairs(PODS, pairs)
    return out


def _check(mapping_ccs: tuple[CrossConnect, ...]) -> None:
    where = port_pods(SMALL)
    seen: set[tuple[str, int]] = set()
    for cc in mapping_ccs:
        for port in (cc.port_a, cc.port_b):
            assert (cc.oxc_id, port) in where  # a wired port
            assert (cc.oxc_id, port) not in seen  # no port in two cross-connects
            seen.add((cc.oxc_id, port))
    for pod in SMALL.pods:  # port budgets
        assert realised_circuits(SMALL, mapping_ccs).row_sum(pod.id) <= pod.uplink_ports


@settings(max_examples=60, deadline=None)
@given(wanted_circuits(), wanted_circuits())
def test_mapping_is_valid_and_minimal_change(
    first: dict[str, PodCircuits], second: dict[str, PodCircuits]
) -> None:
    m1 = map_cross_connects(SMALL, first, ())
    _check(m1.cross_connects)
    for job in first:  # each job gets at most what it asked for, per pair
        got = realised_circuits(SMALL, m1.cross_connects, job)
        for a, b, n in got.pairs():
            assert n <= first[job].get(a, b)
    # job-0 keeps its wanted circuits; other jobs change: job-0 is not disturbed
    changed = dict(second)
    changed["job-0"] = first["job-0"]
    m2 = map_cross_connects(SMALL, changed, m1.cross_connects)
    _check(m2.cross_connects)
    before = {cc for cc in m1.cross_connects if cc.job_id == "job-0"}
    after = {cc for cc in m2.cross_connects if cc.job_id == "job-0"}
    assert before <= after
    # mapping the same wish again changes nothing
    m3 = map_cross_connects(SMALL, changed, m2.cross_connects)
    assert m3.cross_connects == m2.cross_connects and m3.added == 0
    assert diff_cross_connects(m2.cross_connects, m3.cross_connects) == ()


def test_full_budget_fits_and_realises_exactly() -> None:
    # each of 4 pods: 16 ports; a uniform 16-port wish (6 or 5 per peer... ) fits
    wish = PodCircuits.from_pairs(
        PODS, [(PODS[i], PODS[j], 5) for i in range(4) for j in range(i + 1, 4)]
    )
    m = map_cross_connects(SMALL, {"j": wish}, ())
    assert not m.unmapped
    assert realised_circuits(SMALL, m.cross_connects) == wish


def test_over_budget_is_reported_unmapped() -> None:
    wish = PodCircuits.from_pairs(PODS, [("pod-0", "pod-1", 20)])
    m = map_cross_connects(SMALL, {"j": wish}, ())
    assert m.unmapped == (("j", "pod-0", "pod-1", 4),)
    assert realised_circuits(SMALL, m.cross_connects).get("pod-0", "pod-1") == 16


def test_diff_connects_and_disconnects_per_oxc() -> None:
    a = CrossConnect.of("oxc-0", 5, 1, "j")
    b = CrossConnect.of("oxc-1", 2, 20, "j")
    c = CrossConnect.of("oxc-1", 3, 21, "k")
    changes = diff_cross_connects([a, b], [b, c])
    assert [ch.to_dict() for ch in changes] == [
        {"id": "oxc-0", "connect": [], "disconnect": [[1, 5]]},
        {"id": "oxc-1", "connect": [[3, 21]], "disconnect": []},
    ]
    # re-tagging is not a physical change
    assert diff_cross_connects([a], [CrossConnect.of("oxc-0", 1, 5, "other")]) == ()


def test_dropped_job_cross_connects_are_removed() -> None:
    wish = PodCircuits.from_pairs(PODS, [("pod-0", "pod-1", 2)])
    m = map_cross_connects(SMALL, {"gone": wish, "stay": wish}, ())
    m2 = map_cross_connects(SMALL, {"stay": wish}, m.cross_connects)
    assert {cc.job_id for cc in m2.cross_connects} == {"stay"}
    assert m2.added == 0


def test_circuits_the_greedy_switch_choice_strands_are_mapped_exactly() -> None:
    """Two OXCs with two ports per pod each; another job holds a pod-0 and a pod-1 port
    on oxc-1. Greedy puts both pod-0/pod-2 circuits on oxc-0 and strands pod-1/pod-2;
    an assignment exists (one pod-0/pod-2 and the pod-1/pod-2 circuit on oxc-1)."""
    cluster = build_cluster(
        "narrow",
        pods=3,
        tors_per_pod=1,
        servers_per_tor=2,
        uplink_ports_per_pod=4,
        oxcs=2,
        oxc_ports=6,
    )
    pods = tuple(p.id for p in cluster.pods)
    wanted = {
        "j2": PodCircuits.from_pairs(
            pods, [("pod-0", "pod-2", 2), ("pod-0", "pod-1", 1), ("pod-1", "pod-2", 1)]
        )
    }
    where = port_pods(cluster)
    held = [p for p in sorted(where) if p[0] == "oxc-1" and where[p] in ("pod-0", "pod-1")]
    occupied = [held[0], held[-1]]  # one pod-0 and one pod-1 port of oxc-1
    mapping = map_cross_connects(cluster, wanted, (), occupied)
    assert mapping.unmapped == ()
    ports = [(cc.oxc_id, p) for cc in mapping.cross_connects for p in (cc.port_a, cc.port_b)]
    assert len(ports) == len(set(ports)) and not set(ports) & set(occupied)
    assert realised_circuits(cluster, mapping.cross_connects) == wanted["j2"]


@st.composite
def two_fabrics(draw: st.DrawFn) -> tuple[tuple[CrossConnect, ...], tuple[CrossConnect, ...]]:
    """A fabric and the next one: some of the very objects kept, some dropped, some
    rebuilt equal (a new object of the same value), some new."""
    ports = draw(st.lists(st.integers(0, 40), min_size=0, max_size=30, unique=True))
    before = tuple(
        CrossConnect(f"oxc-{p % 3}", 2 * p, 2 * p + 1, f"job-{draw(st.integers(0, 4))}")
        for p in ports
    )
    after: list[CrossConnect] = []
    for cc in before:
        fate = draw(st.sampled_from(["keep", "drop", "rebuild", "retag"]))
        if fate == "keep":
            after.append(cc)
        elif fate == "rebuild":
            after.append(CrossConnect(cc.oxc_id, cc.port_a, cc.port_b, cc.job_id))
        elif fate == "retag":
            after.append(CrossConnect(cc.oxc_id, cc.port_a, cc.port_b, "job-9"))
    for p in draw(st.lists(st.integers(41, 60), max_size=5, unique=True)):
        after.append(CrossConnect(f"oxc-{p % 3}", 2 * p, 2 * p + 1, f"job-{p % 6}"))
    return before, tuple(draw(st.permutations(after)))


@given(two_fabrics())
@settings(max_examples=200, deadline=None)
def test_changed_cross_connects_is_the_difference_by_value(
    fabrics: tuple[tuple[CrossConnect, ...], tuple[CrossConnect, ...]],
) -> None:
    """Compared job by job (each job's cross-connects grouped once per fabric), the
    change is still exactly what one fabric holds and the other does not, by value: a
    cross-connect rebuilt equal is no change, one re-tagged to another job is both."""
    before, after = fabrics
    gone, new = changed_cross_connects(before, after)
    assert set(gone) == set(before) - set(after)
    assert set(new) == set(after) - set(before)
    assert list(gone) == sorted(gone, key=lambda c: c.key)
    assert list(new) == sorted(new, key=lambda c: c.key)
    by_job = cross_connects_by_job(after)
    assert sorted(cc for ccs in by_job.values() for cc in ccs) == sorted(after)
    assert all(cc.job_id == j for j, ccs in by_job.items() for cc in ccs)

"""A job's `network` view: one yardstick for its estimated slowdown, before and after faults."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.cluster import Cluster, preset, without_failed_ports
from app.engine.controller import (
    ControllerConfig,
    ControllerState,
    JobPlaced,
    PortsChanged,
    network_view,
    new_controller,
    step,
)
from app.engine.job import ComputeTimes, Job, ModelFacts, Parallelism, Placement
from app.engine.placement import place_job

SMALL = preset("small")
FIGURE = re.compile(r"est\. slowdown ([0-9.]+)x")


def _place(cluster: Cluster, dps: list[int]) -> ControllerState:
    state = new_controller(cluster, ControllerConfig(reconfig_ms=25.0))
    free = {s.id for p in cluster.pods for t in p.tors for s in t.servers}
    for k, dp in enumerate(dps):
        job = Job(
            f"j{k}",
            Parallelism(dp=dp, pp=1),
            ModelFacts(2e9, 2.0, 3e7, 8),
            ComputeTimes(0.01, 0.02, 0.05),
        )
        placed = place_job(cluster, free, job)
        if not isinstance(placed, Placement):
            continue
        free -= set(placed.servers)
        state, _ = step(state, JobPlaced(job, placed, float(k)))
    return state


def _isolated_figures(state: ControllerState) -> dict[str, tuple[float, float, float]]:
    """Job -> (estimated_slowdown, the figure its reason states, the allocation's
    direct-circuit estimate), isolated jobs only."""
    out = {}
    for pj in state.jobs:
        view = network_view(state, pj.job.job_id)
        if view is None or view.mode != "isolated" or view.estimated_slowdown is None:
            continue
        stated = FIGURE.search(view.reason)
        assert stated, view.reason
        allocated = state.allocation.job(pj.job.job_id)
        assert allocated is not None
        out[pj.job.job_id] = (
            view.estimated_slowdown,
            float(stated.group(1)),
            allocated.estimated_slowdown,
        )
    return out


def test_losing_uplinks_raises_the_figure_and_the_reason_says_the_same() -> None:
    # two dp=12 jobs share pod-1; then three quarters of pod-0's uplinks go dark
    state = _place(SMALL, [12, 12])
    before = network_view(state, "j0")
    assert before is not None and before.estimated_slowdown is not None
    dead = {
        o.id: frozenset(o.pod_ports["pod-0"][: len(o.pod_ports["pod-0"]) * 3 // 4])
        for o in SMALL.oxcs
    }
    state, _ = step(state, PortsChanged(without_failed_ports(SMALL, dead), 5.0))
    after = network_view(state, "j0")
    assert after is not None and after.estimated_slowdown is not None
    assert dict(after.pod_ports)["pod-0"] < dict(before.pod_ports)["pod-0"]
    # measured against the job's own non-blocking iteration, not the degraded pods' bound
    assert after.estimated_slowdown > before.estimated_slowdown + 0.05
    for shown, stated, _ in _isolated_figures(state).values():
        assert abs(shown - stated) <= 0.005 + 1e-9


@settings(max_examples=60, deadline=None)
@given(
    dps=st.lists(st.sampled_from([4, 6, 8, 10, 12]), min_size=1, max_size=4),
    failed=st.sets(st.tuples(st.sampled_from(["oxc-0", "oxc-1"]), st.integers(0, 31))),
)
def test_after_any_failure_the_figure_is_at_least_one_and_no_worse_than_the_allocation(
    dps: list[int], failed: set[tuple[str, int]]
) -> None:
    state = _place(SMALL, dps)
    dead = {o.id: frozenset(p for x, p in failed if x == o.id) for o in SMALL.oxcs}
    state, _ = step(state, PortsChanged(without_failed_ports(SMALL, dead), 5.0))
    for pj in state.jobs:
        view = network_view(state, pj.job.job_id)
        assert view is not None
        if view.estimated_slowdown is not None:
            assert view.estimated_slowdown >= 1.0
    for shown, stated, allocated in _isolated_figures(state).values():
        assert abs(shown - stated) <= 0.005 + 1e-9
        # the realised circuits carry the job at least as fast as the allocation
        # estimated (direct circuits only; two-hop routes can only help)
        assert shown <= allocated + 1e-4

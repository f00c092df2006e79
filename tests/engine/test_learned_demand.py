"""A job's ports follow the traffic it is seen to send where its model facts fall short
(SPEC 3: with facts missing, the network works from observed traffic alone)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.cluster import preset
from app.engine.controller import (
    ControllerConfig,
    ControllerState,
    JobPlaced,
    PhaseObserved,
    network_view,
    new_controller,
    step,
)
from app.engine.cross_connects import port_pods
from app.engine.job import Collective, ComputeTimes, Job, ModelFacts, Parallelism, Placement, Unit
from app.engine.traffic import PHASE_DP, DemandMatrix, job_traffic

SMALL = preset("small")
CONFIG = ControllerConfig(reconfig_ms=25.0)


def _job(
    job_id: str, slot: int, parameters: float | None, compute: ComputeTimes | None
) -> JobPlaced:
    servers = [
        [s.id for t in SMALL.pods[p].tors for s in t.servers][slot + k]
        for p in (0, 1)
        for k in (0, 1)
    ]
    job = Job(
        job_id,
        Parallelism(dp=4, pp=1),
        ModelFacts(parameters, 2.0, 3e7, 8) if parameters else None,
        compute,
        collective=Collective.RING,
    )
    units = tuple(Unit(s, 0, i, 0) for i, s in enumerate(servers))
    return JobPlaced(job, Placement(job_id, units), 0.0)


STATED = ComputeTimes(0.05, 0.1, 0.1)  # 8 micro-batches: 1.3 s of compute per iteration


def _dp_demand(placed: JobPlaced, scale: float) -> DemandMatrix:
    dp = {t.phase: t.pod_demand for t in job_traffic(SMALL, placed.job, placed.placement, "ring")}
    d = dp[PHASE_DP]
    return DemandMatrix.from_entries(d.pod_ids, [(p, q, scale * x) for p, q, x in d.entries()])


def _report(state: ControllerState, job_id: str, demand: DemandMatrix, every_s: float, n: int):  # type: ignore[no-untyped-def]
    reasons = []
    t = 1.0
    for _ in range(n):
        state, decisions = step(state, PhaseObserved(job_id, demand, t, t + 0.1))
        reasons += [(d.kind, d.reason) for d in decisions]
        t += every_s
    return state, reasons


def _circuits(state: ControllerState, job_id: str) -> int:
    jf = state.job_fabric(job_id)
    assert jf is not None
    return jf.circuits.get("pod-0", "pod-1")


def test_a_job_sending_more_than_its_defaults_say_gets_more_circuits() -> None:
    """A launcher stated no model for a job that sends a 700B model's gradients: its
    ports followed the default 7B model for its whole life."""
    small, big = _job("small", 0, None, STATED), _job("big", 2, 2e11, STATED)
    state = new_controller(SMALL, CONFIG)
    for placed in (small, big):
        state, _ = step(state, placed)
    before = _circuits(state, "small")
    assert before < _circuits(state, "big")
    state, reasons = _report(state, "small", _dp_demand(small, 100.0), 1.5, 8)
    assert ("oxc", "prediction") in reasons
    assert _circuits(state, "small") > before
    ports = [(cc.oxc_id, p) for cc in state.desired for p in (cc.port_a, cc.port_b)]
    assert len(ports) == len(set(ports)) and set(ports) <= set(port_pods(SMALL))
    # learned once: more of the same reports change nothing
    state, again = _report(state, "small", _dp_demand(small, 100.0), 1.5, 4)
    assert ("oxc", "prediction") not in again


@pytest.mark.parametrize("parameters", [None, 2e9])
@pytest.mark.parametrize("scale", [1.0, 100.0])
def test_reports_within_the_model_or_of_stated_facts_change_no_circuit(
    parameters: float | None, scale: float
) -> None:
    """Reports the model foresees change nothing; nor do reports that exceed facts the
    launcher stated (they are trusted: the simulator's jobs state theirs)."""
    if parameters is None and scale > 1:
        return  # the test above
    a, b = _job("a", 0, parameters, STATED), _job("b", 2, 2e9, STATED)
    state = new_controller(SMALL, CONFIG)
    for placed in (a, b):
        state, _ = step(state, placed)
    demands = dict(state.demands)
    state, reasons = _report(state, "a", _dp_demand(a, scale), 1.5, 10)
    assert state.demands == demands
    assert ("oxc", "prediction") not in reasons


def test_a_job_that_states_no_compute_learns_it_from_its_period() -> None:
    """Without compute times every estimated slowdown was the circuit ratio alone: a job
    with a second of compute per iteration and a tenth of a second of gradients read
    1.78x on 9 of its 16 circuits."""
    a, b = _job("a", 0, 2e9, None), _job("b", 2, 2e9, None)
    state = new_controller(SMALL, CONFIG)
    for placed in (a, b):
        state, _ = step(state, placed)
    assert state.demands["a"].compute_s == 0
    state, reasons = _report(state, "a", _dp_demand(a, 1.0), 1.0, 8)
    learned = state.demands["a"].compute_s
    # a 1 s period less the gradients' time on the circuits it holds
    assert 0.9 < learned < 1.0, learned
    view = network_view(state, "a")
    assert view is not None and view.estimated_slowdown is not None
    assert 1.0 <= view.estimated_slowdown < 1.1, view
    assert ("oxc", "prediction") not in reasons  # no circuit moves for a compute time


@settings(max_examples=30, deadline=None)
@given(
    scale=st.floats(0.01, 1000.0),
    every_s=st.floats(0.2, 5.0),
    compute=st.sampled_from([None, STATED]),
    parameters=st.sampled_from([None, 2e8, 2e9]),
)
def test_learning_never_promises_a_port_twice_nor_leaves_a_job_unserved(
    scale: float, every_s: float, compute: ComputeTimes | None, parameters: float | None
) -> None:
    a, b = _job("a", 0, parameters, compute), _job("b", 2, 2e9, STATED)
    c = replace(_job("c", 4, 2e9, compute), at_s=0.5)
    state = new_controller(SMALL, CONFIG)
    for placed in (a, b, c):
        state, _ = step(state, placed)
    state, _ = _report(state, "a", _dp_demand(a, scale), every_s, 8)
    ports = [(cc.oxc_id, p) for cc in state.desired for p in (cc.port_a, cc.port_b)]
    assert len(ports) == len(set(ports))
    for job_id in ("a", "b", "c"):
        jf = state.job_fabric(job_id)
        assert jf is not None and (jf.circuits.total or jf.slice.mode != "isolated"), job_id
    # bytes are learned only upwards: never below what the model asks
    modelled = _dp_demand(a, 1.0)
    assert state.demands["a"].pair_bytes[0][2] >= max(x for _, _, x in modelled.entries())

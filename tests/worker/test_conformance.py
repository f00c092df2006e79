"""The worker and the simulator drive one controller: the same trace, the same decisions.

One scripted trace (arrivals, completions, phase reports with their start times,
switch latency) goes through the real worker code (embedded SQLite store, the
in-process mock switches, the switch controller, a controllable clock) and
through the simulator's trace loop (`app.sim.trace.replay_trace`). Both must log
the same cross-connect changes and routing headers, in the same order, and score
the same hits, held phases, misses and exposed seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.engine.cluster import preset
from app.engine.controller import (
    ControllerConfig,
    Event,
    JobCompleted,
    JobPlaced,
    PhaseObserved,
    Tick,
    network_view,
)
from app.engine.plan_signature import Demand, aggregate_pod_demand
from app.settings import Settings
from app.sim.trace import replay_trace
from app.southbound import InProcessDriver
from app.store.fabric_repository import FabricRepository
from app.store.migrate import upgrade_to_head
from app.store.traffic_repository import TrafficRepository
from app.wiring import build_store
from app.worker.fabric_driver import FabricDriver
from app.worker.metrics import WorkerMetrics
from app.worker.switch_controller import SwitchController
from tests.engine.test_controller import cross_job

SMALL = preset("small")
LATENCY_S = 0.025
CONFIG = ControllerConfig(reconfig_ms=LATENCY_S * 1000)


@dataclass(frozen=True)
class Step:
    """One scripted event: `kind` in place|complete|phase, at `at` (phase start for phases)."""

    at: float
    kind: str
    job: str
    demands: tuple[tuple[str, str, float], ...] = ()


def _servers(job: str, slot: int) -> tuple[str, ...]:
    return cross_job(job, slot).placement.servers


def _pp(job: str, slot: int) -> tuple[tuple[str, str, float], ...]:
    s = _servers(job, slot)  # stage-major: s0r0, s0r1, s1r0, s1r1
    return ((s[0], s[2], 4e9), (s[1], s[3], 4e9))


def _dp(job: str, slot: int) -> tuple[tuple[str, str, float], ...]:
    s = _servers(job, slot)
    return ((s[0], s[1], 8e9), (s[2], s[3], 8e9))


SLOTS = {"a": 0, "b": 1}


def scripted(gap_s: float, b_at: float, a_done: float, phases: int = 16) -> list[Step]:
    steps = [Step(0.0, "place", "a")]
    for k in range(phases):
        t = 1.0 + k * gap_s
        steps.append(Step(t, "phase", "a", (_pp if k % 2 == 0 else _dp)("a", 0)))
    steps.append(Step(b_at, "place", "b"))
    for k in range(phases // 2):
        t = b_at + 0.3 + k * gap_s
        steps.append(Step(t, "phase", "b", (_pp if k % 2 == 0 else _dp)("b", 1)))
    steps.append(Step(a_done, "complete", "a"))
    return sorted(steps, key=lambda s: (s.at, s.kind != "complete"))


def run_simulated(
    steps: list[Step], facts: bool = True, views: dict[str, Any] | None = None
) -> tuple[list[tuple[Any, ...]], dict[str, tuple]]:
    """`facts` False: the jobs state no model facts (the controller learns their demand
    from the reports). `views`: filled with each running job's `network` at the end."""
    events: list[Event] = []
    for s in steps:
        if s.kind == "place":
            pj = cross_job(s.job, SLOTS[s.job])
            job = pj.job if facts else replace(pj.job, model=None)
            events += [JobPlaced(job, pj.placement, s.at), Tick(s.at)]
        elif s.kind == "complete":
            events += [JobCompleted(s.job, s.at), Tick(s.at)]
        else:
            demand = aggregate_pod_demand(SMALL, [Demand(*d) for d in s.demands])
            events += [Tick(s.at), PhaseObserved(s.job, demand, s.at, s.at)]
    result = replay_trace(SMALL, CONFIG, events, switch_latency_s=LATENCY_S)
    assert result.state is not None
    for job in SLOTS:
        view = network_view(result.state, job)
        if views is not None and view is not None:
            views[job] = view.to_dict()
    log = [_key(d.to_dict()) for _, d in result.decisions]
    scores = {}
    for job in SLOTS:
        a = result.accounting(job)
        scores[job] = (a.hits, a.held, a.misses, round(a.exposed_s, 9))
    return log, scores


def _key(d: dict[str, Any]) -> tuple[Any, ...]:
    return (d["kind"], d["job_id"], d["reason"], repr(d.get("oxc")), repr(d.get("routing")))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _fail_once(obj: Any, method: str, nth: int) -> None:
    """`obj.method`'s call number `nth` (1 = the first) raises, as if the database went
    away mid-transaction; the others go through."""
    real, calls = getattr(obj, method), [0]

    def flaky(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == nth:
            raise RuntimeError(f"the database went away in {method}")
        return real(*args, **kwargs)

    setattr(obj, method, flaky)


def run_worker(
    steps: list[Step],
    db: Path,
    settle: bool = False,
    metrics: WorkerMetrics | None = None,
    fail_commit: int | None = None,
    fail_record: int | None = None,
    facts: bool = True,
    views: dict[str, Any] | None = None,
) -> tuple[list[tuple[Any, ...]], dict[str, tuple]]:
    """`settle`: after the last step, the switches confirm what is pending and the fabric
    pass runs once more, with no report after it. `fail_commit`: the traffic pass's
    commit of that number (1 = the first) fails once; the driver starts again from the
    durable state, as the fabric loop does. `fail_record`: the same for the fabric pass's
    write of that number."""
    settings = Settings(database_url=f"sqlite:///{db}", cluster="small")
    upgrade_to_head(settings)
    store = build_store(settings)
    clock = Clock()
    repo = FabricRepository(store)
    traffic = TrafficRepository(store)
    fabric = FabricDriver(repo, traffic, SMALL, CONFIG, metrics or WorkerMetrics(), clock=clock)
    if fail_commit is not None:
        _fail_once(traffic, "commit_predictions", fail_commit)
    if fail_record is not None:
        _fail_once(repo, "record_fabric", fail_record)
    switches = InProcessDriver.for_cluster(SMALL, reconfig_ms=0.0)
    controller = SwitchController(
        repo, switches, SMALL, WorkerMetrics(), on_confirmed=fabric.confirmed
    )
    pending: float | None = None
    seen = 0
    log: list[tuple[Any, ...]] = []
    for s in steps:
        if pending is not None and pending <= s.at:
            clock.now = pending  # the switches confirm `LATENCY_S` after the request
            controller.run_once()
            pending = None
        clock.now = s.at
        if s.kind == "place":
            pj = cross_job(s.job, SLOTS[s.job])
            # the simulated side's job (`cross_job`): the same model facts
            body: dict[str, Any] = {"job_id": s.job, "parallelism": {"dp": 2, "pp": 2, "ep": 1}}
            if facts:
                body["model"] = {
                    "parameters": 2e9,
                    "bytes_per_parameter": 2,
                    "activation_bytes": 3e7,
                    "microbatches": 8,
                }
            store.submit_job(s.job, body, s.job, servers_needed=4, priority=0, deadline=None)
            store.record_admission(
                [pj.placement], examined=[s.job], queue_reasons={}, reason="arrival"
            )
        elif s.kind == "complete":
            store.complete_job(s.job)
        else:
            report = {"job_id": s.job, "phase_started_at": s.at, "demands": list(s.demands)}
            traffic.ingest([report])
        try:
            fabric.sync("reconcile")
            fabric.consume()
        except RuntimeError:
            fabric.reset()
            fabric.sync("reconcile")
            fabric.consume()
        fresh = store.decisions_after(seen, 10_000)
        if fresh:
            seen = fresh[-1].seq
        made = [
            _key({"kind": d.kind, "job_id": d.job_id, "reason": d.reason, **d.payload})
            for d in fresh
            if d.kind in ("oxc", "routing")
        ]
        log += made
        if any(m[0] == "oxc" for m in made):
            pending = s.at + LATENCY_S
    if settle and pending is not None:
        clock.now = pending
        controller.run_once()
        fabric.sync("reconcile")
    scores = {}
    for job in SLOTS:
        row = traffic.prediction(job)
        held = int(row.state.get("held", 0)) if row else 0
        scores[job] = (
            (row.hits, held, row.misses, round(row.exposed_reconfig_s, 9)) if row else (0, 0, 0, 0)
        )
    for job in SLOTS:
        record = store.get_job(job)
        network = ((record.collective or {}).get("network") if record else None) or None
        if views is not None and network is not None and record and record.state == "placed":
            views[job] = network
    store.dispose()
    return log, scores


def test_worker_and_simulator_agree_on_demand_learned_from_reports(tmp_path: Path) -> None:
    """Jobs with no model facts: their pp reports carry 30 times the default model's
    activations, so the controller learns their demand, and both loops alike."""
    steps = scripted(gap_s=0.5, b_at=4.05, a_done=9.02)
    sim_log, sim_scores = run_simulated(steps, facts=False)
    live_log, live_scores = run_worker(steps, tmp_path / "w.db", facts=False)
    assert sim_log == live_log
    assert sim_scores == live_scores
    assert sim_log != run_simulated(steps)[0]  # the learning changed decisions


def test_a_learned_compute_time_reaches_the_stored_view(tmp_path: Path) -> None:
    """A sweep: the worker recomputed a job's `network` view only when its circuits
    changed; a compute time learned from reports moves none, so GET /v1/jobs kept the
    old estimate while the controller's was another."""
    # two jobs on the same pods (each short of circuits); one plan (dp) a second apart:
    # the job holds its topology, no circuit moves
    steps = [Step(0.0, "place", "a"), Step(0.0, "place", "b")]
    steps += [Step(1.0 + k, "phase", "b", _dp("b", 1)) for k in range(10)]
    sim_views: dict[str, Any] = {}
    live_views: dict[str, Any] = {}
    run_simulated(steps, facts=False, views=sim_views)
    run_worker(steps, tmp_path / "w.db", settle=True, facts=False, views=live_views)
    assert live_views == sim_views and set(sim_views) == {"a", "b"}, (live_views, sim_views)
    unlearned: dict[str, Any] = {}
    run_simulated(steps[:3], facts=False, views=unlearned)  # before any compute time
    assert sim_views["b"]["estimated_slowdown"] < unlearned["b"]["estimated_slowdown"]


def test_worker_and_simulator_make_the_same_decisions(tmp_path: Path) -> None:
    steps = scripted(gap_s=0.5, b_at=4.05, a_done=9.02)
    sim_log, sim_scores = run_simulated(steps)
    live_log, live_scores = run_worker(steps, tmp_path / "w.db")
    assert sim_log == live_log
    assert sim_scores == live_scores
    # the trace exercises the interesting parts: per-phase rewiring with hits
    assert sim_scores["a"][0] > 0
    assert any(k[2] == "prediction" for k in sim_log)
    assert any(k[2] == "completion" for k in sim_log)


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    gap=st.sampled_from([0.01, 0.05, 0.3, 0.5, 0.9]),
    b_at=st.floats(1.5, 6.0).map(lambda x: round(x, 3)),
    a_done=st.floats(6.5, 12.0).map(lambda x: round(x, 3)),
)
def test_the_same_on_generated_traces(
    tmp_path_factory: Any, gap: float, b_at: float, a_done: float
) -> None:
    steps = scripted(gap_s=gap, b_at=b_at, a_done=a_done, phases=12)
    sim = run_simulated(steps)
    live = run_worker(steps, tmp_path_factory.mktemp("w") / "w.db")
    assert sim == live


def test_a_phase_scored_after_the_jobs_last_report_is_stored() -> None:
    """A phase waiting for the switches is scored when they confirm; the worker stored
    it only with the job's next report, so a job whose last phase waited read one
    phase short (for good once it ended) and /metrics disagreed with the API."""
    import tempfile

    steps = [Step(0.0, "place", "a")] + [
        Step(1.0 + k * 0.5, "phase", "a", (_pp if k % 2 == 0 else _dp)("a", 0)) for k in range(8)
    ]
    # the last phase starts 10 ms after the one before: the rewiring for it is not
    # confirmed yet, so it waits, and no report follows it
    steps.append(Step(steps[-1].at + 0.01, "phase", "a", _dp("a", 0)))
    with tempfile.TemporaryDirectory() as tmp:
        _, live = run_worker(steps, Path(tmp) / "w.db", settle=True)
    hits, held, misses, _ = live["a"]
    assert hits + held + misses == 9, live["a"]


def test_a_phase_still_waiting_when_its_job_ends_is_a_miss_in_both(tmp_path: Path) -> None:
    """A phase waiting on its circuits when the job ended was never scored, by the
    worker or the simulator: hits + held + misses fell short of the phases reported."""
    steps = [Step(0.0, "place", "a")] + [
        Step(1.0 + k * 0.5, "phase", "a", (_pp if k % 2 == 0 else _dp)("a", 0)) for k in range(8)
    ]
    last = steps[-1].at + 0.01  # its rewiring is not confirmed yet ...
    steps += [Step(last, "phase", "a", _dp("a", 0)), Step(last + 0.005, "complete", "a")]
    sim_log, sim_scores = run_simulated(steps)
    live_log, live_scores = run_worker(steps, tmp_path / "w.db")
    assert sim_log == live_log
    assert sim_scores["a"] == live_scores["a"]
    hits, held, misses, _ = live_scores["a"]
    assert hits + held + misses == 9 and misses >= 1, live_scores["a"]


def _counted(metrics: WorkerMetrics) -> tuple[float, float, float, float]:
    return (
        metrics.prediction_hits._value.get(),
        metrics.prediction_held._value.get(),
        metrics.prediction_misses._value.get(),
        metrics.decisions.labels("fabric")._value.get(),
    )


@pytest.mark.parametrize(("fail_commit", "fail_record"), [(None, None), (4, None), (None, 6)])
def test_the_metrics_count_what_the_log_and_the_predictions_hold(
    tmp_path: Path, fail_commit: int | None, fail_record: int | None
) -> None:
    """A drive at 300 jobs read `lightpath_decisions_written_total` 9,199 short of the
    log (the traffic pass's decisions, `prediction` and `phase`, were not counted) and
    the hits and held counters above the API's after a pass failed mid-commit (the
    phases it scored were counted, then scored again on its replay); a review: counted
    at the commit, phases that confirmations scored were lost from the metrics when the
    pass failed after storing them (they are not scored again)."""
    metrics = WorkerMetrics()
    steps = scripted(gap_s=0.5, b_at=4.05, a_done=9.02)
    log, scores = run_worker(
        steps, tmp_path / "w.db", metrics=metrics, fail_commit=fail_commit, fail_record=fail_record
    )
    hits, held, misses, decisions = _counted(metrics)
    assert (hits, held, misses) == tuple(sum(s[k] for s in scores.values()) for k in range(3))
    assert decisions == len(log)
    assert any(k[2] == "prediction" for k in log) and hits > 0

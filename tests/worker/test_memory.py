"""The worker's memory follows changes: what it reads and writes per pass, and what waits.

- scheduling from the placed-job cache sees exactly what a full read sees;
- the desired and confirmed port tables are written as diffs (only what changed);
- a switch pass that changes nothing writes nothing;
- admission of an arrival never waits for a fabric pass that is under way.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, event, select

from app.bus import InProcessBus
from app.bus.messages import AdmitJob
from app.engine.cluster import Cluster, build_cluster, preset
from app.engine.controller import ControllerConfig
from app.engine.cross_connects import CrossConnect
from app.engine.queue import QueuePolicy
from app.settings import Settings
from app.southbound import InProcessDriver
from app.store import PlacedCache, Store
from app.store import tables as t
from app.store.fabric_repository import ConfirmedOxc, FabricRepository, replace_desired
from app.store.traffic_repository import TrafficRepository
from app.worker import Worker
from app.worker.fabric_driver import FabricDriver, FabricPassResult
from app.worker.metrics import WorkerMetrics
from app.worker.scheduler import schedule
from app.worker.switch_controller import SwitchController

SMALL = preset("small")


def _submit(
    store: Store,
    job_id: str,
    servers: int,
    walltime_s: float | None = None,
    lease_s: float | None = None,
) -> None:
    body: dict[str, Any] = {"job_id": job_id, "parallelism": {"dp": servers, "pp": 1, "ep": 1}}
    if walltime_s is not None:
        body["walltime_s"] = walltime_s
    if lease_s is not None:
        body["lease_s"] = lease_s
    store.submit_job(job_id, body, job_id, servers_needed=servers, priority=0, deadline=None)


def _writes(engine: Engine, table: str) -> list[str]:
    """Statements that change `table`, recorded from now on."""
    seen: list[str] = []

    @event.listens_for(engine, "before_cursor_execute")
    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        head = statement.lstrip().upper()
        if head.startswith(("INSERT", "DELETE", "UPDATE")) and table.upper() in head:
            seen.append(statement)

    return seen


_ops = st.lists(
    st.tuples(
        st.sampled_from(["submit", "schedule", "complete", "grant"]),
        st.integers(1, 6),
        st.booleans(),
    ),
    min_size=1,
    max_size=25,
)


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=_ops)
def test_scheduling_from_the_cache_sees_what_a_full_read_sees(store: Store, ops: list) -> None:
    cache = PlacedCache()
    repo = FabricRepository(store)
    prefix = f"j{time.monotonic_ns()}"
    for n, (op, size, flag) in enumerate(ops):
        if op == "submit":
            lease = 600.0 if size % 2 else None
            _submit(store, f"{prefix}-{n}", size, 3600.0 if flag else None, lease)
        elif op == "schedule":
            schedule(store, SMALL, QueuePolicy.FIFO, backfill=True, reason="arrival", cache=cache)
        elif op == "complete":
            placed = sorted(store.load_snapshot().placed)
            if placed:
                store.complete_job(placed[size % len(placed)])
        else:  # the fabric pass writes a collective with aggregator grants
            placed = sorted(store.load_snapshot().placed)
            if placed:
                job = placed[size % len(placed)]
                collective = {"aggregator_grants": [{"tor": "tor-1-1", "gbps": float(size)}]}
                repo.record_fabric((), {job: collective}, [], {})
                cache.set_collective(job, collective)
        cached, full = store.load_snapshot(cache), store.load_snapshot()
        assert cached.used == full.used
        assert cached.placed == full.placed
        assert cached.busy_until == full.busy_until
        assert cached.aggregator_used_gbps == pytest.approx(full.aggregator_used_gbps)
        assert [j.job_id for j in cached.queued] == [j.job_id for j in full.queued]
        fresh = PlacedCache()
        store.load_snapshot(fresh)
        assert cache.any_leased() == fresh.any_leased()
    for job_id in sorted(store.load_snapshot().placed):  # the next example starts empty
        store.complete_job(job_id)


def test_the_desired_table_is_written_as_a_diff_against_the_last_write(store: Store) -> None:
    repo = FabricRepository(store)
    first = tuple(CrossConnect("oxc-1", a, a + 100, "a") for a in range(10))
    repo.record_fabric(first, {}, [], {}, previous=())
    writes = _writes(store.write_engine, "desired_ports")
    second = first[:9] + (CrossConnect("oxc-2", 5, 6, "b"),)
    with store.write_engine.begin() as conn:
        changed = replace_desired(conn, second, first)
    assert changed == 4  # one cross-connect gone (2 port rows), one new (2 rows)
    assert len(writes) == 2  # one DELETE (executemany), one INSERT
    assert set(repo.load_desired()) == set(second)
    with store.write_engine.begin() as conn:
        assert replace_desired(conn, second, second) == 0
    assert len(writes) == 2


def test_confirmed_ports_are_written_only_where_the_read_back_changed(store: Store) -> None:
    repo = FabricRepository(store)
    before = {"oxc-1": ConfirmedOxc("oxc-1", frozenset({(1, 2), (3, 4)}), frozenset())}
    repo.save_confirmed(before.values(), previous={})
    after = ConfirmedOxc("oxc-1", frozenset({(1, 2), (3, 5)}), frozenset({7}))
    assert repo.save_confirmed([after], previous=before) == 2 + 3  # 3, 4 gone; 3, 5, 7 new
    assert repo.load_confirmed() == {"oxc-1": after}
    assert repo.load_failed_ports() == {"oxc-1": frozenset({7})}


def _fabric_and_switches(store: Store) -> tuple[FabricDriver, SwitchController]:
    """A fabric driver and a switch controller on mock switches that confirm at once."""
    repo = FabricRepository(store)
    metrics = WorkerMetrics()
    fabric = FabricDriver(
        repo, TrafficRepository(store), SMALL, ControllerConfig(reconfig_ms=0.0), metrics
    )
    controller = SwitchController(
        repo,
        InProcessDriver.for_cluster(SMALL, reconfig_ms=0.0),
        SMALL,
        metrics,
        on_confirmed=fabric.confirmed,
        desired_source=lambda: fabric.committed,
    )
    return fabric, controller


def test_a_switch_pass_that_changes_nothing_writes_nothing(store: Store) -> None:
    fabric, controller = _fabric_and_switches(store)
    _submit(store, "wide", 12)  # more than a pod of `small`: it needs cross-connects
    schedule(store, SMALL, QueuePolicy.FIFO, backfill=True, reason="arrival")
    fabric.sync("arrival")
    assert fabric.committed
    controller.run_once()
    held = {
        (r.oxc_id, r.port, r.peer)
        for r in store.read_engine.connect().execute(select(t.confirmed_ports))
    }
    assert {(c.oxc_id, c.port_a, c.port_b) for c in fabric.committed} <= held
    writes = _writes(store.write_engine, "confirmed_ports")
    desired_reads = _reads(store.read_engine, "desired_ports")
    controller.run_once()
    assert writes == [] and desired_reads == []
    controller.reset()  # a new leader: reads the table once, then diffs again
    controller.run_once()
    assert writes == []


def _reads(engine: Engine, table: str) -> list[str]:
    seen: list[str] = []

    @event.listens_for(engine, "before_cursor_execute")
    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT") and table in statement:
            seen.append(statement)

    return seen


class BlockedFabric:
    """A fabric driver whose pass blocks until released (stands in for a slow plan)."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.on_views: Any = None
        self.state = None

    def sync(self, reason: str, *, force: bool = False) -> FabricPassResult:
        self.entered.set()
        self.release.wait(30)
        return FabricPassResult(False, (), ())

    def consume(self) -> bool:
        return False

    def reset(self) -> None:
        pass


@contextmanager
def running(worker: Worker) -> Iterator[None]:
    """`worker.run` on a thread of its own for the block."""
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,), daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(10)


def test_admission_does_not_wait_for_a_fabric_pass_under_way(store: Store) -> None:
    bus = InProcessBus()
    fabric = BlockedFabric()
    settings = Settings(database_url="sqlite://", cluster="small", worker_tick_s=0.05)
    worker = Worker(store, bus, SMALL, settings, driver=fabric, metrics=WorkerMetrics())  # type: ignore[arg-type]
    try:
        with running(worker):
            _submit(store, "first", 2)
            bus.publish(AdmitJob("first"))
            assert fabric.entered.wait(10)  # the first arrival's fabric pass is now stuck
            _submit(store, "second", 2)
            bus.publish(AdmitJob("second"))
            deadline = time.monotonic() + 10
            while store.get_job("second").state != "placed":  # type: ignore[union-attr]
                assert time.monotonic() < deadline, "the arrival waited for the fabric pass"
                time.sleep(0.02)
            assert not fabric.release.is_set()
            assert store.get_job("first").state == "placed"  # type: ignore[union-attr]
            fabric.release.set()  # before the worker stops: its fabric thread is blocked
    finally:
        fabric.release.set()


def test_a_kicked_switch_pass_reads_only_the_switches_whose_desired_state_changed(
    store: Store,
) -> None:
    fabric, controller = _fabric_and_switches(store)
    assert set(controller.run_once(full=False).confirmed) == {o.id for o in SMALL.oxcs}
    assert controller.run_once(full=False).confirmed == {}  # nothing changed: nothing read
    _submit(store, "wide", 12)
    schedule(store, SMALL, QueuePolicy.FIFO, backfill=True, reason="arrival")
    fabric.sync("arrival")
    assert fabric.committed
    changed = {cc.oxc_id for cc in fabric.committed}
    result = controller.run_once(full=False)
    assert set(result.confirmed) == changed and result.converged
    assert controller.run_once(full=False).confirmed == {}
    assert set(controller.run_once().confirmed) == {o.id for o in SMALL.oxcs}  # the resync


def test_a_fabric_pass_steps_aside_while_an_admission_runs_but_not_for_long(
    store: Store,
) -> None:
    """Admission and the fabric pass share the worker's interpreter: between its steps a
    fabric pass waits for an admission under way (an arrival is not admitted on half the
    interpreter), but never longer than ADMISSION_FIRST_S, so a stream of arrivals
    cannot starve the fabric."""
    from app.worker.loop import ADMISSION_FIRST_S

    bus = InProcessBus()
    fabric = BlockedFabric()
    fabric.release.set()
    fabric.backlog = False  # type: ignore[attr-defined]
    settings = Settings(database_url="sqlite://", cluster="small", worker_tick_s=0.05)
    worker = Worker(store, bus, SMALL, settings, driver=fabric, metrics=WorkerMetrics())  # type: ignore[arg-type]
    admitting, admitted = threading.Event(), threading.Event()
    real_admit = worker.admit

    def slow_admit(*args: Any, **kwargs: Any) -> None:
        if not admitting.is_set():  # the first admission is slow, the ticks' are not
            admitting.set()
            time.sleep(0.5)
        real_admit(*args, **kwargs)
        admitted.set()

    worker.admit = slow_admit  # type: ignore[method-assign]
    step = fabric.yield_to  # type: ignore[attr-defined]
    with running(worker):
        _submit(store, "j", 2)
        bus.publish(AdmitJob("j"))
        assert admitting.wait(10)
        start = time.monotonic()
        step()  # a fabric step while the admission runs: waits, but only so long
        waited = time.monotonic() - start
        assert ADMISSION_FIRST_S * 0.8 <= waited < 0.4, waited
        assert admitted.wait(10)
        time.sleep(0.05)
        start = time.monotonic()
        step()  # no admission under way: no wait
        assert time.monotonic() - start < ADMISSION_FIRST_S / 2


def test_scheduling_counts_the_aggregators_a_job_it_just_placed_will_be_granted(
    store: Store,
) -> None:
    """Two forced-INC jobs admitted one after the other, before any fabric pass has
    reported the first one's grant: the second goes under another ToR's aggregator
    (before, best fit put it under the first one's full aggregator: ring)."""
    cache = PlacedCache()
    for job_id in ("first", "second"):
        body = {
            "job_id": job_id,
            "parallelism": {"dp": 2, "pp": 1, "ep": 1},
            "collective": "inc",
        }
        store.submit_job(job_id, body, job_id, servers_needed=2, priority=0, deadline=None)
        schedule(store, SMALL, QueuePolicy.FIFO, backfill=True, reason="arrival", cache=cache)
    tors = []
    for job_id in ("first", "second"):
        record = store.get_job(job_id)
        assert record is not None and record.state == "placed"
        tors.append({SMALL.server(u["server"]).tor_id for u in record.placement["units"]})
    assert len(tors[0]) == len(tors[1]) == 1 and tors[0] != tors[1]
    # counted until the fabric pass reports what was really granted
    assert cache.view().aggregators == {t: 800.0 for t in tors[0] | tors[1]}
    cache.set_collective("first", {"aggregator_grants": []})
    assert cache.view().aggregators == {t: 800.0 for t in tors[1]}


def test_a_new_leader_logs_no_teardown_of_circuits_the_switches_already_hold(
    store: Store,
) -> None:
    """A restart replayed the placed jobs one by one: the first (inside a pod) was
    planned without the second, so the log said to disconnect the second's circuits,
    then to connect them again, both as `arrival` (a sweep, on every stack). A log
    consumer replaying that drops a running job's circuits on every restart. The new
    leader's first pass now logs only the net change from the stored plan (none
    here) and the jobs' headers again, as `reconcile`."""
    fabric, controller = _fabric_and_switches(store)
    _submit(store, "one", 2)  # inside a pod of `small`, placed first
    _submit(store, "wide", 12)  # more than a pod: it needs cross-connects
    schedule(store, SMALL, QueuePolicy.FIFO, backfill=True, reason="arrival")
    fabric.sync("arrival")
    controller.run_once()
    held = fabric.committed
    assert held
    last = store.last_decision_seq()
    fabric.reset()  # a new leader (or a restart): the memory is rebuilt from the store
    fabric.sync("reconcile")
    after = store.decisions_after(last, 1000)
    assert [d for d in after if d.kind == "oxc"] == []
    assert after and {d.reason for d in after} == {"reconcile"}
    assert {d.job_id for d in after} <= {"one", "wide"}
    assert fabric.committed is not None and set(fabric.committed) == set(held)


def test_a_queued_job_the_engine_raises_on_is_failed_and_the_queue_goes_on(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A body the engine could not judge (an int too large for a float in the traffic
    model) made every scheduling pass fail, and no job behind it was ever placed."""
    import app.worker.scheduler as scheduler

    real = scheduler.admit_queued

    def admit(cluster: Any, free: Any, queue: Any, *args: Any, **kwargs: Any) -> Any:
        if any(job.job_id == "poison" for job in queue):
            raise OverflowError("int too large to convert to float")
        return real(cluster, free, queue, *args, **kwargs)

    monkeypatch.setattr(scheduler, "admit_queued", admit)
    for job_id in ("first", "poison", "victim"):
        _submit(store, job_id, 2)
    result = schedule(store, SMALL, QueuePolicy.FIFO, backfill=True, reason="arrival")
    assert set(result.placed) == {"first", "victim"}
    poison = store.get_job("poison")
    assert poison is not None and poison.state == "failed"
    assert poison.end_reason == "engine_error: OverflowError"
    # a failure the engine has on every job is not blamed on one: the pass fails
    monkeypatch.setattr(scheduler, "admit_queued", lambda *a, **k: 1 / 0)
    _submit(store, "later", 1)
    with pytest.raises(ZeroDivisionError):
        schedule(store, SMALL, QueuePolicy.FIFO, backfill=True, reason="arrival")
    later = store.get_job("later")
    assert later is not None and later.state == "queued"


def test_a_fabric_pass_leaves_out_a_job_on_servers_the_cluster_lost(store: Store) -> None:
    """Restarted on a cluster file without pod-3, a split deployment's fabric process
    may run before the scheduler fails the job placed there (`retire_orphans`): its
    pass failed on the unknown servers, and kept failing, rather than plan the rest."""
    _submit(store, "everywhere", 32)  # every server of `small`, pod-3's too
    _submit(store, "later", 8)
    schedule(store, SMALL, QueuePolicy.FIFO, backfill=True, reason="arrival")
    shrunk = build_cluster(
        "small-without-pod-3",
        pods=3,
        tors_per_pod=2,
        servers_per_tor=4,
        uplink_ports_per_pod=16,
        oxcs=2,
        oxc_ports=64,
    )
    fabric = _driver(store, shrunk)
    fabric.sync("reconcile")  # no KeyError on pod-3's servers
    assert fabric.state is not None and fabric.state.jobs == ()
    assert store.server_holders()["everywhere"] == sorted(SMALL.server_ids)
    # the scheduler fails it; the job behind it is placed and planned
    worker = Worker(
        store, InProcessBus(), shrunk, Settings(), driver=fabric, metrics=WorkerMetrics()
    )
    assert worker.retire_orphans() == {"everywhere"}
    assert worker.retire_orphans() == set()  # once per leadership
    worker.admit("completion", set())
    fabric.sync("completion")
    state = fabric.state
    assert state is not None and [pj.job.job_id for pj in state.jobs] == ["later"]


def test_an_unbounded_mlu_is_stored_as_null(store: Store) -> None:
    """PostgreSQL refused the fabric facts with an infinite MLU (`Token "Infinity" is
    invalid`), failing the pass; SQLite stored it and GET /v1/topology answered 500."""
    _submit(store, "wide", 12)
    schedule(store, SMALL, QueuePolicy.FIFO, backfill=True, reason="arrival")
    fabric = _driver(store, SMALL)
    fabric.sync("arrival")
    assert fabric.memory is not None and fabric.memory.state.fabric is not None
    state = fabric.memory.state
    fabric.memory.state = replace(state, fabric=replace(state.fabric, mlu=math.inf))
    fabric.sync("reconcile", force=True)
    assert FabricRepository(store).fact("fabric")["mlu"] is None


def test_a_cluster_file_that_fits_no_placed_job_fails_none_of_them(store: Store) -> None:
    """A review: a worker started without LIGHTPATH_CLUSTER reads the `small` preset, and
    a leader on the wrong file would fail every running job `cluster_changed`. When
    every placed job (two or more) would go, none is failed and an error says why;
    a leader that takes over later (perhaps on the right file) looks again."""
    _submit(store, "a", 8)
    _submit(store, "b", 8)
    schedule(store, SMALL, QueuePolicy.FIFO, backfill=True, reason="arrival")
    tiny = build_cluster(
        "tiny",
        pods=1,
        tors_per_pod=1,
        servers_per_tor=1,
        uplink_ports_per_pod=2,
        oxcs=1,
        oxc_ports=2,
    )
    fabric = _driver(store, tiny)
    worker = Worker(store, InProcessBus(), tiny, Settings(), driver=fabric, metrics=WorkerMetrics())
    assert worker.retire_orphans() == set()
    assert {store.get_job(j).state for j in ("a", "b")} == {"placed"}  # type: ignore[union-attr]
    worker.take_over()
    right = Worker(store, InProcessBus(), SMALL, Settings(), driver=fabric, metrics=WorkerMetrics())
    assert right.retire_orphans() == set()  # on the right file: nothing to do


def test_a_stored_plan_on_switches_the_cluster_file_lacks_marks_the_wrong_file() -> None:
    """A verification got past the start-up refusal: with one small seed-15k job on
    servers whose names `small` also has, `lightpath worker --cluster small` started,
    failed the other jobs `cluster_changed` and tore down 24 cross-connects on oxc-0 and
    oxc-1. The stored plan's circuits on switches (or ports) the file lacks say so too;
    retired pods keep their switches and ports, and do not."""
    from app.worker.loop import wrong_cluster_file

    holders = {"a": ["pod-0/tor-0/srv-0"], "b": ["pod-20/tor-0/srv-0"]}
    on_oxc_9 = [CrossConnect("oxc-9", 0, 40, "b")]
    reason = wrong_cluster_file(SMALL, holders, on_oxc_9)
    assert reason is not None and "(oxc-9)" in reason and "(small)" in reason
    past_the_ports = [CrossConnect("oxc-0", 3, 200, "b")]
    assert wrong_cluster_file(SMALL, holders, past_the_ports) is not None
    assert wrong_cluster_file(SMALL, holders, [CrossConnect("oxc-0", 0, 1, "a")]) is None
    assert wrong_cluster_file(SMALL, {"a": ["pod-20/tor-0/srv-0"]}, ()) is None  # one: retired
    seed = preset("seed-15k")  # pods retired: their switches and ports stay in the file
    assert wrong_cluster_file(seed, holders, [CrossConnect("oxc-9", 0, 300, "b")]) is None


def test_a_worker_told_to_stop_while_waiting_for_messages_admits_nothing(store: Store) -> None:
    """A drive SIGTERMed the worker: it placed a job 0.2 s later, after its fabric pass
    had stopped, and the job went unplanned (`network` null) until the next leader."""
    from app.bus.messages import Delivery

    _submit(store, "late", 2)
    stop = threading.Event()

    class StoppingBus(InProcessBus):
        acked: list[Delivery] = []

        def consume(self, timeout_s: float) -> list[Delivery]:
            stop.set()  # SIGTERM arrives while the worker waits here
            return [Delivery("1-0", AdmitJob("late"))]

        def ack(self, deliveries: Any) -> None:
            self.acked.extend(deliveries)

    fabric = _driver(store, SMALL)
    bus = StoppingBus()
    worker = Worker(store, bus, SMALL, Settings(), driver=fabric, metrics=WorkerMetrics())
    worker.run(stop)
    job = store.get_job("late")
    assert job is not None and job.state == "queued"
    assert bus.acked == []  # left for the next leader


def _driver(store: Store, cluster: Cluster) -> FabricDriver:
    """A fabric driver on `store` for `cluster` (25 ms switches)."""
    return FabricDriver(
        FabricRepository(store),
        TrafficRepository(store),
        cluster,
        ControllerConfig(25.0),
        WorkerMetrics(),
    )

"""Southbound fencing: a deposed leader's switch commands are refused.

Every read and apply carries the leader lease's fencing token; a switch
remembers the newest token it has seen and refuses older ones (`StaleToken`,
409 `stale-token` over HTTP). The switch controller checks its lease before
each exchange and ends a pass fenced (nothing more sent, nothing written) when
it was deposed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx
import pytest

from app.engine.cluster import Cluster
from app.engine.cross_connects import CrossConnect
from app.southbound import InProcessDriver, OpticalSwitch, StaleToken
from app.southbound.driver import HttpDriver
from app.southbound.errors import SwitchTimeout
from app.southbound.reconcile import RetryPolicy, reconcile
from app.southbound.state import ConfirmedState
from app.store.fabric_repository import ConfirmedOxc
from app.worker.metrics import WorkerMetrics
from app.worker.switch_controller import SwitchController

from .conftest import ServedMockOxc

NO_WAIT = RetryPolicy(max_attempts=3, base_delay_s=0.0, max_delay_s=0.0)


def test_a_switch_refuses_a_token_older_than_the_newest_it_has_seen() -> None:
    switch = OpticalSwitch("oxc-0", 16, reconfig_ms=0.0)
    switch.apply([(0, 1)], [], "r1", token=1)
    switch.read(token=2)  # a new leader's first read fences the old one out
    assert switch.fencing_token == 2
    with pytest.raises(StaleToken):
        switch.apply([(2, 3)], [], "r2", token=1)
    with pytest.raises(StaleToken):
        switch.apply([(0, 1)], [], "r1", token=1)  # not even a replay by request_id
    with pytest.raises(StaleToken):
        switch.apply([(2, 3)], [], "r3")  # no token once one was seen
    with pytest.raises(StaleToken):
        switch.read(token=1)
    assert switch.read().cross_connects == {(0, 1)}  # an unfenced read only inspects
    assert switch.inspect().cross_connects == {(0, 1)}
    switch.apply([(2, 3)], [(0, 1)], "r4", token=2)
    switch.apply([(4, 5)], [], "r5", token=7)
    assert switch.inspect().cross_connects == {(2, 3), (4, 5)}
    assert switch.fencing_token == 7


def test_an_unfenced_switch_accepts_commands_without_a_token() -> None:
    switch = OpticalSwitch("oxc-0", 8, reconfig_ms=0.0)
    switch.apply([(0, 1)], [], "r1")
    assert switch.read().cross_connects == {(0, 1)}
    assert switch.fencing_token == 0


def test_the_mock_service_answers_409_stale_token_and_the_driver_raises_it(
    serve_mock_oxc: Callable[..., ServedMockOxc], small_cluster: Cluster
) -> None:
    mock = serve_mock_oxc(small_cluster, reconfig_ms=0.0)
    with HttpDriver(mock.url) as driver:
        driver.apply("oxc-0", [(0, 1)], [], "r1", token=5)
        assert driver.read("oxc-0", token=5).cross_connects == {(0, 1)}
        with pytest.raises(StaleToken):
            driver.apply("oxc-0", [], [(0, 1)], "r2", token=4)
        with pytest.raises(StaleToken):
            driver.read("oxc-0", token=4)
    answer = httpx.post(
        f"{mock.url}/oxcs/oxc-0/apply",
        json={"request_id": "r3", "disconnect": [[0, 1]], "fencing_token": 3},
    )
    assert answer.status_code == 409
    assert answer.headers["content-type"].startswith("application/problem+json")
    assert answer.json()["type"] == "urn:lightpath:southbound:stale-token"
    assert httpx.get(f"{mock.url}/oxcs/oxc-0").json()["fencing_token"] == 5
    assert 'lightpath_oxc_fencing_token{oxc="oxc-0"} 5.0' in httpx.get(f"{mock.url}/metrics").text
    assert mock.switches["oxc-0"].inspect().cross_connects == {(0, 1)}


def test_reconcile_stops_an_oxc_when_the_lease_lapses() -> None:
    switch = OpticalSwitch("oxc-0", 16, reconfig_ms=0.0)
    result = reconcile(
        InProcessDriver({"oxc-0": switch}),
        {"oxc-0": {(0, 1, "j")}},
        policy=NO_WAIT,
        token=3,
        holds=lambda: False,
    )
    assert result.fenced and not result.applied and result.requeue_after_s is None
    assert switch.inspect().cross_connects == frozenset()
    assert switch.fencing_token == 0  # nothing reached the switch


class _Repo:
    """The confirmed-ports table in memory: what `SwitchController` reads and writes."""

    def __init__(self) -> None:
        self.confirmed: dict[str, ConfirmedOxc] = {}
        self.writes = 0

    def load_confirmed(self) -> dict[str, ConfirmedOxc]:
        return dict(self.confirmed)

    def save_confirmed(
        self, changed: Sequence[ConfirmedOxc], previous: Mapping[str, ConfirmedOxc] | None = None
    ) -> None:
        self.writes += 1
        self.confirmed.update({c.oxc_id: c for c in changed})

    def save_reachability(self, unreachable: Any) -> None:
        self.writes += 1
        self.unreachable = frozenset(unreachable)


class _StallingDriver:
    """Stalls the first apply after the caller's lease check, as a SIGSTOP would."""

    def __init__(self, inner: InProcessDriver) -> None:
        self.inner = inner
        self.stalled = threading.Event()
        self.resume = threading.Event()
        self.sent: list[tuple[str, int | None]] = []

    def apply(
        self,
        oxc_id: str,
        connect: Sequence[tuple[int, int]],
        disconnect: Sequence[tuple[int, int]],
        request_id: str,
        *,
        token: int | None = None,
    ) -> None:
        if not self.stalled.is_set():
            self.stalled.set()
            assert self.resume.wait(10)
        self.sent.append((oxc_id, token))
        self.inner.apply(oxc_id, connect, disconnect, request_id, token=token)

    def read(self, oxc_id: str, *, token: int | None = None) -> ConfirmedState:
        return self.inner.read(oxc_id, token=token)

    def close(self) -> None:
        self.inner.close()


class _Lease:
    def __init__(self, token: int | None) -> None:
        self.value = token

    def __call__(self) -> int | None:
        return self.value


def _controller(
    driver: Any, cluster: Cluster, desired: list[CrossConnect], lease: _Lease
) -> tuple[SwitchController, _Repo]:
    repo = _Repo()
    controller = SwitchController(
        repo,  # type: ignore[arg-type]
        driver,
        cluster,
        WorkerMetrics(),
        desired_source=lambda: desired,
        token=lease,
    )
    controller.policy = NO_WAIT
    return controller, repo


def _held(driver: InProcessDriver) -> set[tuple[str, int, int]]:
    return {(o, a, b) for o, s in driver.switches.items() for a, b in s.inspect().cross_connects}


def test_a_stalled_leaders_switch_pass_applies_nothing_after_the_takeover(
    small_cluster: Cluster,
) -> None:
    """The old leader stalls with a command in flight (past its lease check); the new leader
    takes over and converges the switches; the old pass resumes: its command is refused by
    the switch and it sends nothing more."""
    switches = InProcessDriver.for_cluster(small_cluster, reconfig_ms=0.0)
    oxc = small_cluster.oxcs[0].id
    old_desired = [CrossConnect(oxc, 0, 1, "old"), CrossConnect(oxc, 2, 3, "old")]
    new_desired = [CrossConnect(oxc, 0, 2, "new"), CrossConnect(oxc, 4, 5, "new")]
    stalling = _StallingDriver(switches)
    old_lease, new_lease = _Lease(1), _Lease(2)
    old, old_repo = _controller(stalling, small_cluster, old_desired, old_lease)
    new, _ = _controller(switches, small_cluster, new_desired, new_lease)

    results: list[Any] = []
    thread = threading.Thread(target=lambda: results.append(old.run_once()))
    thread.start()
    assert stalling.stalled.wait(10), "the old leader never sent its command"
    # the old leader is stopped with its command on the way; its lease runs out; the
    # standby takes over (a larger token) and runs its first pass
    took = new.run_once()
    assert took.converged and not took.fenced
    assert _held(switches) == {(oxc, 0, 2), (oxc, 4, 5)}
    assert all(s.fencing_token == 2 for s in switches.switches.values())
    # the old process wakes up, still believing its token holds (the worst case: its
    # local clock has not noticed the stall yet)
    stalling.resume.set()
    thread.join(10)
    result = results[0]
    assert result.fenced and not result.applied
    assert {e.code for e in result.errors} == {"stale-token"}
    assert _held(switches) == {(oxc, 0, 2), (oxc, 4, 5)}, "a command of the old token applied"
    assert old_repo.writes == 0, "a fenced pass must not record what it saw"
    # its next pass (lease gone by local time) sends nothing at all
    old_lease.value = None
    sent = len(stalling.sent)
    again = old.run_once()
    assert again.fenced and len(stalling.sent) == sent
    assert _held(switches) == {(oxc, 0, 2), (oxc, 4, 5)}


def test_a_leader_whose_lease_lapses_mid_pass_sends_nothing_more() -> None:
    switch = OpticalSwitch("oxc-0", 16, reconfig_ms=0.0)
    held = [True]
    sent: list[str] = []

    class Recording(InProcessDriver):
        def apply(self, oxc_id: str, *args: Any, **kw: Any) -> None:
            sent.append("apply")
            super().apply(oxc_id, *args, **kw)
            held[0] = False  # the lease lapses while the first command runs

        def read(self, oxc_id: str, *, token: int | None = None) -> ConfirmedState:
            sent.append("read")
            return super().read(oxc_id, token=token)

    result = reconcile(
        Recording({"oxc-0": switch}),
        {"oxc-0": {(0, 1, "j")}},
        policy=NO_WAIT,
        token=4,
        holds=lambda: held[0],
    )
    assert sent == ["read", "apply"], "nothing after the lease lapsed, not even a read"
    assert result.fenced and result.errors[0].code == "fenced"


class _HungDriver:
    """One switch whose reads time out, each taking until the test lets it go."""

    def __init__(self, inner: InProcessDriver, hung: str) -> None:
        self.inner, self.hung = inner, hung
        self.release = threading.Event()
        self.reads = 0

    def apply(self, oxc_id: str, *args: Any, **kw: Any) -> None:
        self.inner.apply(oxc_id, *args, **kw)

    def read(self, oxc_id: str, *, token: int | None = None) -> ConfirmedState:
        if oxc_id == self.hung:
            self.reads += 1
            if self.reads > 1:  # the first times out at once, the retries hang
                self.release.wait(10)
            raise SwitchTimeout(f"{oxc_id} did not answer")
        return self.inner.read(oxc_id, token=token)

    def close(self) -> None:
        self.inner.close()


def test_a_hung_switch_is_shown_unreachable_before_its_retries_run_out(
    small_cluster: Cluster,
) -> None:
    """A switch that stops answering held its pass for every retry (about 36 s at the
    driver's timeouts) before its row was marked stale; now its first failed read does."""
    hung = small_cluster.oxcs[0].id
    driver = _HungDriver(InProcessDriver.for_cluster(small_cluster, reconfig_ms=0.0), hung)
    controller, repo = _controller(driver, small_cluster, [], _Lease(1))
    thread = threading.Thread(target=controller.run_once)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while getattr(repo, "unreachable", None) != frozenset({hung}):
            assert time.monotonic() < deadline, "not shown unreachable during the pass"
            time.sleep(0.01)
        assert thread.is_alive()  # still retrying: shown before the pass ended
    finally:
        driver.release.set()
        thread.join(10)
    assert repo.unreachable == frozenset({hung})  # the pass ends agreeing


def test_a_deposed_leaders_switch_threads_mark_no_switch_stale(
    small_cluster: Cluster, tmp_path: Any
) -> None:
    """A fault sweep resumed a SIGSTOPped leader: its switch pass's reads were refused
    (`stale-token`) or timed out, and its OXC threads, which the fence did not bind,
    wrote two live switches as unreachable; `/v1/topology` showed them stale until the
    next leader change. The reachability write is fenced on those threads too, and a
    switch that refuses our token is not unreachable."""
    from concurrent.futures import ThreadPoolExecutor

    from sqlalchemy import update

    from app.settings import Settings
    from app.store import tables as t
    from app.store.fabric_repository import FabricRepository
    from app.store.fencing import Fence
    from app.store.migrate import upgrade_to_head
    from app.wiring import build_store

    settings = Settings(database_url=f"sqlite:///{tmp_path}/fence.db", cluster="small")
    upgrade_to_head(settings)
    store = build_store(settings)
    try:
        with store.write_engine.begin() as conn:
            conn.execute(update(t.fencing).where(t.fencing.c.name == "worker").values(token=7))
        fence = Fence(store.write_engine, lambda: 3)  # deposed: the row holds 7
        repo = FabricRepository(store)
        controller = SwitchController(
            repo, InProcessDriver.for_cluster(small_cluster), small_cluster, WorkerMetrics()
        )
        controller.write_guard = fence.bound
        before = repo.fact("switches")
        with ThreadPoolExecutor(1) as pool:  # as reconcile runs each OXC
            pool.submit(controller._unreadable, small_cluster.oxcs[0].id).result()
        assert repo.fact("switches") == before
        fence.close()
    finally:
        store.dispose()
    # a switch that answers stale-token answered: it is not reported unreadable
    oxc = small_cluster.oxcs[0].id
    seen: list[str] = []

    class Refusing:
        def read(self, oxc_id: str, *, token: int | None = None) -> ConfirmedState:
            raise StaleToken(f"{oxc_id} has seen a newer token")

        def apply(self, *args: Any, **kw: Any) -> None:
            raise AssertionError("nothing is applied")

    result = reconcile(Refusing(), {oxc: ()}, policy=NO_WAIT, token=3, unreadable=seen.append)
    assert seen == [] and result.fenced


class _DeadDriver:
    """Switches that can be killed (every read and apply times out) and restarted empty."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.inner = InProcessDriver.for_cluster(cluster, reconfig_ms=0.0)
        self.dead: set[str] = set()
        self.hung = threading.Event()  # set: a dead switch's retries hang until cleared
        self.release = threading.Event()

    def apply(self, oxc_id: str, *args: Any, **kw: Any) -> None:
        if oxc_id in self.dead:
            raise SwitchTimeout(f"{oxc_id} did not answer")
        self.inner.apply(oxc_id, *args, **kw)

    def read(self, oxc_id: str, *, token: int | None = None) -> ConfirmedState:
        if oxc_id in self.dead:
            if self.hung.is_set() and getattr(self, "timed_out", False):
                self.release.wait(10)
            self.timed_out = True
            raise SwitchTimeout(f"{oxc_id} did not answer")
        return self.inner.read(oxc_id, token=token)

    def restart(self, oxc_id: str) -> None:
        self.dead.discard(oxc_id)
        fresh = InProcessDriver.for_cluster(self.cluster, reconfig_ms=0.0)
        self.inner.switches[oxc_id] = fresh.switches[oxc_id]

    def close(self) -> None:
        self.inner.close()


def _one_circuit_on_two_switches(
    cluster: Cluster,
) -> tuple[str, str, _DeadDriver, SwitchController, list[frozenset[tuple[str, int, int]]]]:
    """Job `a` with a circuit on each of two switches, installed and confirmed; what the
    controller is told is confirmed, pass by pass."""
    first, second = (o.id for o in cluster.oxcs[:2])
    desired = [CrossConnect(first, 0, 1, "a"), CrossConnect(second, 0, 1, "a")]
    driver = _DeadDriver(cluster)
    controller, _ = _controller(driver, cluster, desired, _Lease(1))
    told: list[frozenset[tuple[str, int, int]]] = []
    controller.on_confirmed = told.append
    controller.run_once()
    assert told[-1] == {(first, 0, 1), (second, 0, 1)}
    return first, second, driver, controller, told


def test_a_switch_that_cannot_be_read_confirms_nothing(small_cluster: Cluster) -> None:
    """An audit killed the mock switches for 8 s while a job reported phases: its `hits`
    grew through the outage, as the controller was told the dead switch's last read.
    What is confirmed leaves out a switch no pass could read, until it is read again
    (restarted empty, its circuits go back and are confirmed then)."""
    first, second, driver, controller, told = _one_circuit_on_two_switches(small_cluster)
    driver.dead.add(first)
    controller.run_once()
    assert told[-1] == {(second, 0, 1)}
    driver.restart(first)
    controller.run_once()
    assert told[-1] == {(first, 0, 1), (second, 0, 1)}
    assert _held(driver.inner) >= {(first, 0, 1), (second, 0, 1)}


def test_a_hung_switch_confirms_nothing_while_its_retries_run(small_cluster: Cluster) -> None:
    """A verification SIGSTOPped the switches for 40 s: for the first 33 s (the pass's
    retries) phases were still scored on the hung switch's last read. Its circuits
    leave what is confirmed at its first failed read, before the pass ends."""
    first, second, driver, controller, told = _one_circuit_on_two_switches(small_cluster)
    driver.dead.add(first)
    driver.hung.set()
    thread = threading.Thread(target=controller.run_once)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while told[-1] != {(second, 0, 1)}:
            assert time.monotonic() < deadline, "the hung switch still confirms its circuits"
            time.sleep(0.01)
        assert thread.is_alive()  # still retrying: told before the pass ended
    finally:
        driver.release.set()
        thread.join(10)
    assert told[-1] == {(second, 0, 1)}

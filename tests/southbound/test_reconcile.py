"""Reconciliation: converges under faults and failed ports, never double-books, is idempotent."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.engine.cluster import Cluster
from app.southbound.driver import InProcessDriver, SouthboundDriver
from app.southbound.errors import PortBusy, SwitchTimeout
from app.southbound.reconcile import (
    BLOCKED_PORT_FAILED,
    INVALID_DESIRED,
    DesiredCrossConnect,
    ReconcileResult,
    RetryPolicy,
    diff_cross_connects,
    reconcile,
)
from app.southbound.state import ConfirmedState
from app.southbound.switch import OpticalSwitch

NO_WAIT = RetryPolicy(max_attempts=8, base_delay_s=0.0, max_delay_s=0.0)


def no_sleep(_seconds: float) -> None:
    return None


def state(
    ports: int, pairs: set[tuple[int, int]], failed: frozenset[int] = frozenset()
) -> ConfirmedState:
    return ConfirmedState("oxc-0", ports, frozenset(pairs), frozenset(failed))


def switch_driver(ports: int = 32, fault_rate: float = 0.0, seed: int = 0) -> InProcessDriver:
    switch = OpticalSwitch("oxc-0", ports, reconfig_ms=0.0, fault_rate=fault_rate, seed=seed)
    return InProcessDriver({"oxc-0": switch})


def reconcile_until_settled(
    driver: SouthboundDriver, desired: dict[str, set[DesiredCrossConnect]], passes: int = 20
) -> ReconcileResult:
    """What the worker does: run passes until one asks for no requeue."""
    rng = random.Random(1)
    for _ in range(passes):
        result = reconcile(driver, desired, policy=NO_WAIT, rng=rng, sleep=no_sleep)
        if result.requeue_after_s is None:
            return result
    raise AssertionError(f"no settled pass in {passes}: {result}")


# -- the pure diff ----------------------------------------------------------


def test_diff_disconnects_the_undesired_and_connects_the_missing() -> None:
    confirmed = state(16, {(0, 1), (2, 3), (4, 5)})
    diff = diff_cross_connects({(1, 0, "j1"), (3, 6, "j2"), (8, 9, "j2")}, confirmed)
    assert diff.disconnect == ((2, 3), (4, 5))
    assert diff.connect == ((3, 6), (8, 9))
    assert diff.blocked == ()


def test_diff_moves_circuits_off_failed_ports_and_blocks_desired_pairs_on_them() -> None:
    confirmed = state(16, {(0, 1), (2, 3)}, failed=frozenset({1, 7}))
    diff = diff_cross_connects({(0, 1, "j1"), (2, 3, "j1"), (7, 8, "j2")}, confirmed)
    assert diff.disconnect == ((0, 1),)
    assert diff.connect == ()
    assert diff.blocked == ((0, 1, "j1"), (7, 8, "j2"))


@pytest.mark.parametrize(
    "desired",
    [
        {(0, 1, "j1"), (1, 2, "j2")},  # port 1 in two pairs
        {(0, 1, "j1"), (1, 0, "j2")},  # one pair, two owners
        {(3, 3, "j1")},
        {(0, 16, "j1")},
    ],
)
def test_diff_refuses_a_desired_state_that_is_not_a_valid_matching(
    desired: set[DesiredCrossConnect],
) -> None:
    with pytest.raises(ValueError):
        diff_cross_connects(desired, state(16, set()))


# -- passes against the switch model ----------------------------------------


def test_a_pass_converges_and_a_second_pass_sends_nothing() -> None:
    driver = switch_driver()
    desired = {"oxc-0": {(0, 1, "j1"), (2, 3, "j1"), (10, 20, "j2")}}
    first = reconcile(driver, desired, policy=NO_WAIT, sleep=no_sleep)
    assert first.converged and first.requeue_after_s is None
    assert [c.connect for c in first.applied] == [((0, 1), (2, 3), (10, 20))]
    assert first.confirmed["oxc-0"].cross_connects == {(0, 1), (2, 3), (10, 20)}
    second = reconcile(driver, desired, policy=NO_WAIT, sleep=no_sleep)
    assert second.converged and second.applied == ()


def test_completed_jobs_free_their_cross_connects_and_new_ones_reuse_the_ports() -> None:
    driver = switch_driver()
    reconcile(driver, {"oxc-0": {(0, 1, "j1"), (2, 3, "j1")}}, policy=NO_WAIT, sleep=no_sleep)
    result = reconcile(driver, {"oxc-0": {(1, 2, "j2")}}, policy=NO_WAIT, sleep=no_sleep)
    assert result.converged
    assert result.applied[0].disconnect == ((0, 1), (2, 3))
    assert result.applied[0].connect == ((1, 2),)
    assert driver.read("oxc-0").cross_connects == {(1, 2)}


def test_converges_with_ten_percent_faults_and_one_failed_port(small_cluster: Cluster) -> None:
    driver = InProcessDriver.for_cluster(small_cluster, reconfig_ms=0.5, fault_rate=0.1, seed=11)
    driver.switches["oxc-1"].fail_port(40)
    desired: dict[str, set[DesiredCrossConnect]] = {
        "oxc-0": {(p, p + 16, f"job-{p % 3}") for p in range(16)},
        "oxc-1": {(p, p + 32, f"job-{p % 3}") for p in range(16)},  # (8, 40) is on the bad port
    }
    result = reconcile_until_settled(driver, desired)
    assert [(b.oxc_id, b.a, b.b, b.reason) for b in result.blocked] == [
        ("oxc-1", 8, 40, BLOCKED_PORT_FAILED)
    ]
    assert result.needs_replan and not result.converged and result.errors == ()
    for oxc_id, pairs in desired.items():
        held = driver.switches[oxc_id].inspect().cross_connects
        assert held == {(a, b) for a, b, _ in pairs} - {(8, 40)}
    # The engine re-plans the blocked circuit onto a healthy port; the next pass converges.
    desired["oxc-1"] = (desired["oxc-1"] - {(8, 40, "job-2")}) | {(8, 60, "job-2")}
    replanned = reconcile_until_settled(driver, desired)
    assert replanned.converged
    assert driver.switches["oxc-1"].inspect().port_peer(8) == 60


class FlakyDriver:
    """Loses the first apply before it reaches the switch; records every apply."""

    def __init__(self, inner: SouthboundDriver) -> None:
        self.inner = inner
        self.applies: list[tuple[str, tuple[tuple[int, int], ...], str]] = []

    def apply(
        self,
        oxc_id: str,
        connect: Sequence[tuple[int, int]],
        disconnect: Sequence[tuple[int, int]],
        request_id: str,
        *,
        token: int | None = None,
    ) -> None:
        self.applies.append((oxc_id, tuple(connect), request_id))
        if len(self.applies) == 1:
            raise SwitchTimeout("lost on the way", oxc_id=oxc_id)
        self.inner.apply(oxc_id, connect, disconnect, request_id, token=token)

    def read(self, oxc_id: str, *, token: int | None = None) -> ConfirmedState:
        return self.inner.read(oxc_id, token=token)

    def close(self) -> None:
        self.inner.close()


def test_a_retried_unchanged_command_reuses_its_request_id() -> None:
    driver = FlakyDriver(switch_driver())
    result = reconcile(driver, {"oxc-0": {(0, 1, "j1")}}, policy=NO_WAIT, sleep=no_sleep)
    assert result.converged and result.failed_exchanges == 1
    (_, c1, id1), (_, c2, id2) = driver.applies
    assert c1 == c2 and id1 == id2


def test_backoff_is_exponential_with_full_jitter_and_capped() -> None:
    policy = RetryPolicy(base_delay_s=0.1, max_delay_s=0.5)
    rng = random.Random(0)
    delays = [[policy.backoff_s(n, rng) for _ in range(200)] for n in (1, 2, 3, 6)]
    assert all(0.0 <= d <= 0.1 for d in delays[0])
    assert all(0.0 <= d <= 0.2 for d in delays[1])
    assert max(delays[2]) > 0.2 and all(d <= 0.4 for d in delays[2])
    assert all(d <= 0.5 for d in delays[3])


def test_gives_up_after_max_attempts_and_asks_to_be_requeued() -> None:
    driver = switch_driver(fault_rate=1.0)
    slept: list[float] = []
    policy = RetryPolicy(max_attempts=4, base_delay_s=0.01, max_delay_s=1.0, requeue_after_s=2.5)
    result = reconcile(driver, {"oxc-0": {(0, 1, "j")}}, policy=policy, sleep=slept.append)
    assert not result.converged
    assert result.requeue_after_s == 2.5
    assert [e.is_retryable for e in result.errors] == [True]
    assert len(slept) == 3 and result.failed_exchanges == 4


def test_giving_up_on_a_switch_already_shown_down_is_not_a_warning_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A fault sweep's switch outage logged "oxc reconcile gave up" about 4 times a
    second. The first pass that gives up warns; passes on a switch the caller already
    shows unreachable log it at debug."""
    driver = switch_driver(fault_rate=1.0)
    policy = RetryPolicy(max_attempts=2, base_delay_s=0.0, max_delay_s=0.0)
    desired = {"oxc-0": {(0, 1, "j")}}
    with caplog.at_level(logging.DEBUG, logger="lightpath"):
        reconcile(driver, desired, policy=policy, sleep=no_sleep)
        reconcile(driver, desired, policy=policy, sleep=no_sleep, known_down={"oxc-0"})
    levels = [r.levelno for r in caplog.records if r.getMessage() == "oxc reconcile gave up"]
    assert levels == [logging.WARNING, logging.DEBUG]


def test_terminal_errors_are_reported_not_retried() -> None:
    driver = switch_driver()
    slept: list[float] = []
    result = reconcile(
        driver,
        {"oxc-9": {(0, 1, "j")}, "oxc-0": {(0, 1, "j"), (1, 2, "k")}},
        policy=NO_WAIT,
        sleep=slept.append,
    )
    codes = {e.oxc_id: e.code for e in result.errors}
    assert codes == {"oxc-9": "unknown-switch", "oxc-0": INVALID_DESIRED}
    assert result.requeue_after_s is None and slept == []
    assert driver.read("oxc-0").cross_connects == frozenset()


def test_oxcs_absent_from_desired_are_left_alone() -> None:
    driver = switch_driver()
    driver.apply("oxc-0", [(0, 1)], [], "manual")
    assert reconcile(driver, {}, policy=NO_WAIT, sleep=no_sleep).converged
    assert driver.read("oxc-0").cross_connects == {(0, 1)}
    reconcile(driver, {"oxc-0": set()}, policy=NO_WAIT, sleep=no_sleep)
    assert driver.read("oxc-0").cross_connects == frozenset()


# -- property: never a port in two cross-connects -----------------------------

PORTS = 20


class CheckingDriver:
    """Checks every command against the switch's real state before sending it."""

    def __init__(self, switch: OpticalSwitch) -> None:
        self.switch = switch
        self.inner = InProcessDriver({switch.oxc_id: switch})

    def apply(
        self,
        oxc_id: str,
        connect: Sequence[tuple[int, int]],
        disconnect: Sequence[tuple[int, int]],
        request_id: str,
        *,
        token: int | None = None,
    ) -> None:
        peers: dict[int, int] = {}
        for a, b in self.switch.inspect().cross_connects:
            peers[a], peers[b] = b, a
        for a, b in disconnect:
            assert peers.get(a) == b, f"disconnect of a missing pair {(a, b)}"
            del peers[a], peers[b]
        for a, b in connect:
            assert a not in peers and b not in peers, f"{(a, b)} would double-book"
            peers[a], peers[b] = b, a
        try:
            self.inner.apply(oxc_id, connect, disconnect, request_id, token=token)
        except PortBusy as exc:  # pragma: no cover - the property under test
            raise AssertionError(f"the switch saw a double-booking: {exc}") from exc

    def read(self, oxc_id: str, *, token: int | None = None) -> ConfirmedState:
        return self.inner.read(oxc_id, token=token)

    def close(self) -> None:
        self.inner.close()


def matchings(max_pairs: int = PORTS // 2) -> st.SearchStrategy[list[tuple[int, int]]]:
    return st.permutations(list(range(PORTS))).flatmap(
        lambda order: st.integers(0, max_pairs).map(
            lambda k: [(order[2 * i], order[2 * i + 1]) for i in range(k)]
        )
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    initial=matchings(),
    desired_pairs=matchings(),
    jobs=st.lists(st.sampled_from(["j1", "j2", "j3"]), min_size=PORTS // 2, max_size=PORTS // 2),
    failed=st.sets(st.integers(0, PORTS - 1), max_size=2),
    seed=st.integers(0, 10_000),
)
def test_reconcile_never_double_books_and_converges(
    initial: list[tuple[int, int]],
    desired_pairs: list[tuple[int, int]],
    jobs: list[str],
    failed: set[int],
    seed: int,
) -> None:
    switch = OpticalSwitch("oxc-0", PORTS, reconfig_ms=0.0, seed=seed)
    switch.apply(initial, [], "initial")
    for port in failed:
        switch.fail_port(port)
    switch.fault_rate = 0.1
    desired = {"oxc-0": {(a, b, jobs[i]) for i, (a, b) in enumerate(desired_pairs)}}
    result = reconcile_until_settled(CheckingDriver(switch), desired)

    held = switch.inspect().cross_connects
    healthy = {tuple(sorted(pair)) for pair in desired_pairs if not set(pair) & failed}
    assert held == healthy
    assert {(b.a, b.b) for b in result.blocked} == {
        tuple(sorted(pair)) for pair in desired_pairs if set(pair) & failed
    }
    assert result.converged == (not result.blocked)


class StaleOnceDriver(CheckingDriver):
    """Answers the first read with an empty switch, as a read racing another writer might."""

    def __init__(self, switch: OpticalSwitch) -> None:
        super().__init__(switch)
        self.reads = 0

    def read(self, oxc_id: str, *, token: int | None = None) -> ConfirmedState:
        self.reads += 1
        if self.reads == 1:
            return ConfirmedState(oxc_id, self.switch.ports, frozenset(), frozenset())
        return self.inner.read(oxc_id, token=token)

    def apply(
        self,
        oxc_id: str,
        connect: Sequence[tuple[int, int]],
        disconnect: Sequence[tuple[int, int]],
        request_id: str,
        *,
        token: int | None = None,
    ) -> None:
        self.inner.apply(oxc_id, connect, disconnect, request_id, token=token)


def test_a_refusal_after_a_stale_read_is_retried_on_a_fresh_read() -> None:
    switch = OpticalSwitch("oxc-0", 8, reconfig_ms=0.0)
    switch.apply([(0, 1)], [], "someone-else")
    driver = StaleOnceDriver(switch)
    result = reconcile(driver, {"oxc-0": {(1, 2, "j")}}, policy=NO_WAIT, sleep=no_sleep)
    assert result.converged and result.failed_exchanges == 1  # the PortBusy from the stale plan
    assert switch.inspect().cross_connects == {(1, 2)}


def test_oxcs_are_reconfigured_in_parallel(seed_cluster: Cluster) -> None:
    driver = InProcessDriver.for_cluster(seed_cluster, reconfig_ms=25.0)
    desired = {oxc.id: {(0, 12, "j"), (1, 24, "j")} for oxc in seed_cluster.oxcs}
    started = time.monotonic()
    result = reconcile(driver, desired, policy=NO_WAIT, max_parallel_oxcs=16)
    elapsed = time.monotonic() - started
    assert result.converged and len(result.applied) == 16
    assert elapsed < 16 * 0.025 / 2  # one OXC after another would take 16 latencies

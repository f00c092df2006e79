"""The switch model's rules: free ports only, all-or-nothing bulk, failed ports, latency, faults."""

from __future__ import annotations

import random
import threading
import time

import pytest

from app.engine.cluster import Cluster
from app.southbound.errors import (
    CommandRefused,
    NotConnected,
    PortBusy,
    PortFailed,
    PortOutOfRange,
    RequestIdReused,
    SwitchFault,
    SwitchTimeout,
)
from app.southbound.switch import OpticalSwitch, switches_for_cluster

from .conftest import FakeClock


def make_switch(clock: FakeClock, ports: int = 16, reconfig_ms: float = 25.0) -> OpticalSwitch:
    return OpticalSwitch("oxc-0", ports, reconfig_ms=reconfig_ms, clock=clock, sleep=clock.sleep)


def test_connect_joins_two_free_ports_full_duplex(clock: FakeClock) -> None:
    switch = make_switch(clock)
    outcome = switch.apply([(9, 2)], [], "r1")
    state = switch.read()
    assert state.cross_connects == {(2, 9)}
    assert state.port_peer(2) == 9 and state.port_peer(9) == 2
    assert outcome.changed_pairs == 1 and not outcome.is_replay


def test_connecting_a_busy_port_is_refused_and_changes_nothing(clock: FakeClock) -> None:
    switch = make_switch(clock)
    switch.apply([(0, 1)], [], "r1")
    with pytest.raises(PortBusy) as refused:
        switch.apply([(1, 2)], [], "r2")
    assert refused.value.ports == (1,)
    assert not refused.value.is_transient
    assert switch.read().cross_connects == {(0, 1)}


def test_bulk_command_is_all_or_nothing(clock: FakeClock) -> None:
    switch = make_switch(clock)
    switch.apply([(0, 1), (2, 3)], [], "r1")
    # Three valid changes and one busy port: nothing at all may happen.
    with pytest.raises(PortBusy):
        switch.apply([(4, 5), (6, 2)], [(0, 1)], "r2")
    assert switch.read().cross_connects == {(0, 1), (2, 3)}
    # Disconnects are applied before connects, so a freed port can be reused at once.
    switch.apply([(1, 2), (0, 3)], [(0, 1), (2, 3)], "r3")
    assert switch.read().cross_connects == {(1, 2), (0, 3)}


def test_a_port_named_twice_in_one_command_is_busy(clock: FakeClock) -> None:
    switch = make_switch(clock)
    with pytest.raises(PortBusy):
        switch.apply([(0, 1), (1, 2)], [], "r1")
    assert switch.read().cross_connects == frozenset()


@pytest.mark.parametrize(
    ("connect", "disconnect", "error"),
    [
        ([(0, 16)], [], PortOutOfRange),
        ([(-1, 3)], [], PortOutOfRange),
        ([(4, 4)], [], CommandRefused),
        ([], [(0, 1)], NotConnected),
    ],
)
def test_invalid_commands_are_refused(
    clock: FakeClock,
    connect: list[tuple[int, int]],
    disconnect: list[tuple[int, int]],
    error: type[Exception],
) -> None:
    switch = make_switch(clock)
    with pytest.raises(error):
        switch.apply(connect, disconnect, "r1")
    assert switch.read().cross_connects == frozenset()


def test_failed_port_refuses_connects_keeps_its_cross_connect_until_restored(
    clock: FakeClock,
) -> None:
    switch = make_switch(clock)
    switch.apply([(0, 1)], [], "r1")
    switch.fail_port(1)
    switch.fail_port(5)
    state = switch.read()
    assert state.failed_ports == {1, 5}
    assert state.cross_connects == {(0, 1)}  # the mirrors stay; the light is gone
    with pytest.raises(PortFailed) as refused:
        switch.apply([(5, 6)], [], "r2")
    assert refused.value.ports == (5,)
    switch.apply([], [(0, 1)], "r3")  # moving a circuit off a failed port is allowed
    switch.restore_port(5)
    switch.apply([(5, 6)], [], "r4")
    assert switch.read().cross_connects == {(5, 6)}
    assert switch.read().failed_ports == {1}
    with pytest.raises(PortOutOfRange):
        switch.fail_port(99)


def test_changes_become_visible_after_the_reconfiguration_latency(clock: FakeClock) -> None:
    switch = make_switch(clock, reconfig_ms=25.0)
    first = switch.apply([(0, 1)], [], "r1", wait=False)
    assert first.reconfig_s == pytest.approx(0.025)
    assert switch.read().cross_connects == frozenset()
    assert switch.is_reconfiguring()
    # A second command is validated against the state being installed...
    with pytest.raises(PortBusy):
        switch.apply([(1, 2)], [], "r2", wait=False)
    # ...and queues behind the first: one reconfiguration at a time.
    second = switch.apply([(2, 3)], [], "r3", wait=False)
    assert second.reconfig_s == pytest.approx(0.050)
    clock.sleep(0.0249)
    assert switch.read().cross_connects == frozenset()
    clock.sleep(0.0002)
    assert switch.read().cross_connects == {(0, 1)}
    clock.sleep(0.025)
    assert switch.read().cross_connects == {(0, 1), (2, 3)}
    assert not switch.is_reconfiguring()


def test_apply_returns_once_the_change_is_visible_on_a_real_clock() -> None:
    switch = OpticalSwitch("oxc-0", 8, reconfig_ms=30.0)
    started = time.monotonic()
    switch.apply([(0, 1)], [], "r1")
    assert time.monotonic() - started >= 0.029
    assert switch.read().cross_connects == {(0, 1)}
    started = time.monotonic()
    switch.apply([], [], "r2")  # nothing to move, nothing to wait for
    assert time.monotonic() - started < 0.02


def test_request_id_makes_apply_idempotent(clock: FakeClock) -> None:
    reconfigurations: list[float] = []
    switch = OpticalSwitch(
        "oxc-0",
        8,
        clock=clock,
        sleep=clock.sleep,
        on_reconfiguration=lambda _oxc, seconds: reconfigurations.append(seconds),
    )
    switch.apply([(0, 1)], [], "r1")
    replay = switch.apply([(1, 0)], [], "r1")  # the same pair spelled the other way round
    assert replay.is_replay
    assert len(reconfigurations) == 1
    with pytest.raises(RequestIdReused):
        switch.apply([(2, 3)], [], "r1")
    switch.apply([], [(0, 1)], "r2")
    switch.apply([(0, 1)], [], "r3")  # the same change again needs a new id, and works
    assert switch.read().cross_connects == {(0, 1)}
    assert len(reconfigurations) == 3


def test_injected_faults_are_seeded_and_split_between_fault_and_timeout() -> None:
    def outcomes(seed: int) -> list[str]:
        switch = OpticalSwitch("oxc-0", 64, reconfig_ms=0.0, fault_rate=0.5, seed=seed)
        seen = []
        for i in range(60):
            try:
                switch.apply([], [], f"r{i}")
                seen.append("ok")
            except SwitchFault:
                seen.append("fault")
            except SwitchTimeout:
                seen.append("timeout")
        return seen

    assert outcomes(7) == outcomes(7)
    assert outcomes(7) != outcomes(8)
    assert {"ok", "fault", "timeout"} <= set(outcomes(7))


def test_a_timeout_may_hide_an_applied_command_and_the_retry_by_id_is_harmless() -> None:
    switch = OpticalSwitch("oxc-0", 8, reconfig_ms=0.0, fault_rate=1.0, seed=3)
    applied_despite_timeout = False
    for _attempt in range(20):
        try:
            switch.apply([(0, 1)], [], "r1")
        except SwitchTimeout:
            if switch.inspect().cross_connects:
                applied_despite_timeout = True
                break
        except SwitchFault:
            assert switch.inspect().cross_connects == frozenset()
    assert applied_despite_timeout
    switch.fault_rate = 0.0
    assert switch.apply([(0, 1)], [], "r1").is_replay  # not refused as busy: same id, same command
    assert switch.inspect().cross_connects == {(0, 1)}


def test_concurrent_commands_never_double_book_a_port() -> None:
    switch = OpticalSwitch("oxc-0", 24, reconfig_ms=0.5)
    accepted_connects = [0]
    accepted_disconnects = [0]
    lock = threading.Lock()

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        for i in range(150):
            state = switch.inspect()
            if state.cross_connects and rng.random() < 0.4:
                pair = rng.choice(sorted(state.cross_connects))
                connect, disconnect = [], [pair]
            else:
                a, b = rng.sample(range(24), 2)
                connect, disconnect = [(a, b)], []
            try:
                switch.apply(connect, disconnect, f"w{seed}-{i}")
            except (PortBusy, NotConnected):
                continue  # another thread got there first: refused, not double-booked
            with lock:
                accepted_connects[0] += len(connect)
                accepted_disconnects[0] += len(disconnect)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    state = switch.inspect()
    assert len(state.used_ports) == 2 * len(state.cross_connects)
    assert len(state.cross_connects) == accepted_connects[0] - accepted_disconnects[0]


def test_one_switch_per_oxc_of_the_cluster(small_cluster: Cluster) -> None:
    switches = switches_for_cluster(small_cluster, fault_rate=0.1, seed=1)
    assert set(switches) == {o.id for o in small_cluster.oxcs}
    assert all(s.ports == 64 and s.reconfig_ms == 25.0 for s in switches.values())
    assert switches_for_cluster(small_cluster, reconfig_ms=3.0)["oxc-0"].reconfig_ms == 3.0

"""The fabric process's collector policy: collections between passes, on CPython's schedule."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest

from app.worker.fabric_driver import FabricPassResult
from app.worker.fabric_loop import FabricLoop
from app.worker.gc_policy import (
    FULL_AFTER_GEN1,
    YOUNG,
    YOUNG_IN_PASS,
    collect_if_due,
    defer_collections,
)
from app.worker.metrics import WorkerMetrics


@pytest.fixture
def restored_collector() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.set_threshold(*thresholds)


def test_full_collections_wait_for_the_idle_call(restored_collector: None) -> None:
    defer_collections()
    young, middle, full = gc.get_threshold()
    assert young == YOUNG_IN_PASS and middle == 10 and full > 10**6
    gc.collect()  # counters start at zero
    for _ in range(FULL_AFTER_GEN1 - 1):
        gc.collect(1)
    assert gc.get_count()[2] == FULL_AFTER_GEN1 - 1
    assert not collect_if_due()
    gc.collect(1)
    # due when idle, not yet overdue while busy
    assert not collect_if_due(idle=False)
    assert collect_if_due()
    assert gc.get_count()[2] == 0


def test_young_collections_wait_for_the_call_between_passes(restored_collector: None) -> None:
    defer_collections()
    gc.collect()
    kept = [[] for _ in range(3 * YOUNG)]  # what a pass builds: no automatic collection
    assert gc.get_count()[0] >= 3 * YOUNG and gc.get_count()[1] == 0
    assert not collect_if_due()  # generation 0, not a full one
    assert gc.get_count()[:2] == (0, 1)
    for _ in range(9):
        gc.collect(0)
    assert not collect_if_due()  # the tenth: generation 1, counted towards a full one
    assert gc.get_count() == (0, 0, 1)
    assert not collect_if_due()  # nothing pending: nothing made
    assert gc.get_count() == (0, 0, 1)
    del kept


class _Driver:
    """What the fabric loop needs of a driver: passes that plan nothing, a backlog."""

    def __init__(self, backlogs: list[bool]) -> None:
        self.backlogs = backlogs
        self.passes = 0

    def sync(self, reason: str, *, force: bool = False) -> FabricPassResult:
        self.passes += 1
        return FabricPassResult(False, (), ())

    def consume(self) -> bool:
        return False

    @property
    def backlog(self) -> bool:
        return self.backlogs[min(self.passes, len(self.backlogs)) - 1]


def _after_passes(driver: _Driver, n: int, *, leading: bool, tick_s: float) -> list[bool]:
    """What a fabric loop tells `after_pass` the first `n` times."""
    loop = FabricLoop(driver, WorkerMetrics(), tick_s=tick_s, announce=lambda ids: None)  # type: ignore[arg-type]
    seen: list[bool] = []
    stop = threading.Event()

    def after(idle: bool) -> None:
        seen.append(idle)
        if len(seen) == n:
            stop.set()

    loop.after_pass = after
    loop.request("arrival")
    runner = threading.Thread(target=loop.run, args=(stop, lambda: leading))
    runner.start()
    runner.join(timeout=10)
    return seen


def test_the_fabric_loop_says_after_each_pass_whether_it_is_idle() -> None:
    # a backlog (traffic left after a pass's budget) is not idle time: the loop goes on
    driver = _Driver([True, True, False])
    assert _after_passes(driver, 3, leading=True, tick_s=0.05) == [False, False, True]


def test_a_standby_fabric_loop_still_offers_idle_time() -> None:
    # not leading, it never passes: full collections must not wait for leadership
    driver = _Driver([False])
    assert _after_passes(driver, 2, leading=False, tick_s=0.01) == [True, True]
    assert driver.passes == 0

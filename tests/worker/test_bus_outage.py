"""The worker through an event-bus outage: messages are wake-ups, the database is the truth.

A Redis outage once ended the worker's scheduling thread for good (its consume
raised outside the loop's retry), while the process, its lease and /readyz
stayed up: jobs queued for ever and no standby took over. These tests hold the
loop to what the module says: without messages every tick still acts on the
durable state, and taking messages resumes when the bus is back.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from app.bus import InProcessBus
from app.bus.errors import BusError, BusUnavailable
from app.bus.messages import AdmitJob, Delivery
from app.settings import Settings
from app.store import Store
from app.wiring import Runtime
from app.worker import Worker
from app.worker.metrics import WorkerMetrics
from tests.worker.test_memory import SMALL, BlockedFabric, _submit, running


class FlakyBus(InProcessBus):
    """The in-process bus, unreachable while `down` is set (as Redis is when it stops),
    or refusing with `error` (as Redis does a wrong password)."""

    def __init__(self, error: BusError | None = None) -> None:
        super().__init__()
        self.down = threading.Event()
        self.consumed_up = threading.Event()
        self.error = error or BusUnavailable("consume: redis unavailable: connection refused")

    def consume(self, timeout_s: float) -> list[Delivery]:
        if self.down.is_set():
            raise self.error
        got = super().consume(timeout_s)
        if got:
            self.consumed_up.set()
        return got


def _placed_within(store: Store, job_id: str, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = store.get_job(job_id)
        if job is not None and job.state == "placed":
            return True
        time.sleep(0.02)
    return False


def _worker(store: Store, bus: InProcessBus) -> Worker:
    fabric = BlockedFabric()
    fabric.release.set()  # its passes return at once
    settings = Settings(database_url="sqlite://", cluster="small", worker_tick_s=0.05)
    return Worker(store, bus, SMALL, settings, driver=fabric, metrics=WorkerMetrics())  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "error",
    [
        BusUnavailable("consume: redis unavailable: connection refused"),
        # a helper's run with a wrong Redis password: the loop died and restarted for
        # ever, and the job stayed queued on an empty cluster
        BusError("consume: redis refused the credentials: invalid password"),
    ],
)
def test_the_worker_schedules_from_the_database_while_the_bus_is_down_and_resumes(
    store: Store, caplog: pytest.LogCaptureFixture, error: BusError
) -> None:
    bus = FlakyBus(error)
    bus.down.set()
    worker = _worker(store, bus)
    with caplog.at_level("WARNING", logger="lightpath.worker"), running(worker):
        _submit(store, "during", 2)  # accepted by the API; its wake-up message is lost
        assert _placed_within(store, "during"), "no tick acted while the bus was down"
        bus.down.clear()
        _submit(store, "after", 2)
        bus.publish(AdmitJob("after"))
        assert bus.consumed_up.wait(10), "the worker stopped taking messages"
        assert _placed_within(store, "after")
    said = [r.getMessage() for r in caplog.records]
    assert said.count("event bus unavailable; acting on the database every tick") == 1
    assert "event bus reachable again; taking messages" in said


def test_a_background_loop_that_dies_is_started_again() -> None:
    calls: list[float] = []
    back = threading.Event()

    def flaky_loop(stop: threading.Event, *_: Any) -> None:
        calls.append(time.monotonic())
        if len(calls) == 1:
            raise RuntimeError("an error no loop caught")
        back.set()
        stop.wait()

    runtime = Runtime(services=None, relay=None)  # type: ignore[arg-type]
    runtime._spawn("worker", flaky_loop, runtime._stop)
    try:
        assert back.wait(5), "the loop stayed dead"
        assert len(calls) == 2
    finally:
        runtime._stop.set()
        for thread in runtime._threads:
            thread.join(5)

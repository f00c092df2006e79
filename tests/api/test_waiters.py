"""Waiters subscribe before they read: a notice between the read and the wait is kept."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import pytest

from app.api.routes import jobs as jobs_route
from app.api.waiters import JobWaiters
from app.bus.messages import JobsChanged
from app.store import JobRecord


def test_a_notice_before_the_wait_wakes_the_waiter_at_once() -> None:
    async def scenario() -> tuple[bool, float]:
        waiters = JobWaiters()
        with waiters.watch("j") as watch:
            waiters.on_change(JobsChanged(("j",)))  # lands after the read, before the wait
            await asyncio.sleep(0)
            start = time.monotonic()
            woke = await watch.wait(5.0)
            return woke, time.monotonic() - start

    woke, waited = asyncio.run(scenario())
    assert woke and waited < 1.0


def test_a_notice_for_another_job_does_not_wake_it() -> None:
    async def scenario() -> bool:
        waiters = JobWaiters()
        with waiters.watch("j") as watch:
            waiters.on_change(JobsChanged(("k",)))
            return await watch.wait(0.05)

    assert asyncio.run(scenario()) is False


def test_wait_for_placed_holds_a_placed_job_for_its_plan_at_most_plan_wait_s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Placed without `collective`: not yet, until PLAN_WAIT_S after it was first seen
    placed (a fabric process that is down must not hold the launcher)."""
    now = [100.0]
    monkeypatch.setattr(jobs_route.time, "monotonic", lambda: now[0])
    placed = JobRecord(
        job_id="j", state="placed", body={}, body_hash="", submitted_order=1, examined=True,
        queue_reason=None, placement=None, collective=None, submitted_at=None,
        placed_at=None, completed_at=None, owner=None, lease_s=None,
    )  # fmt: skip
    planned = replace(placed, collective={"algorithm": "ring"})
    reached = jobs_route._reached("placed")
    assert not reached(replace(placed, state="queued"))
    assert not reached(placed)
    now[0] += jobs_route.PLAN_WAIT_S - 0.01
    assert not reached(placed)
    assert reached(planned)
    now[0] += 0.02
    assert reached(placed)
    assert jobs_route._reached("placed")(replace(placed, state="completed"))
    assert jobs_route._reached("completed")(replace(placed, state="failed"))
    assert not jobs_route._reached("completed")(planned)

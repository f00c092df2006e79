"""Waiters subscribe before they read: a notice between the read and the wait is kept."""

from __future__ import annotations

import asyncio
import time

from app.api.waiters import JobWaiters
from app.bus.messages import JobsChanged


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

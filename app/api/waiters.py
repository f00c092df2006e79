"""Long-poll support: API requests waiting for a job to change state.

The worker announces changed job ids on the bus; each announcement wakes the
asyncio waiters of those jobs, from whatever thread it arrives on. Waiters
also re-read the database every `poll_s`, so a missed announcement (another
process, a restarted bus) costs latency, never a wrong answer.
"""

from __future__ import annotations

import asyncio
import threading
from collections import defaultdict

from app.bus.messages import JobsChanged


class JobWaiters:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: dict[str, set[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = defaultdict(
            set
        )

    def on_change(self, change: JobsChanged) -> None:
        with self._lock:
            targets = [w for job_id in change.job_ids for w in self._events.get(job_id, ())]
        for loop, event in targets:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # the loop closed meanwhile
                pass

    async def wait(self, job_id: str, timeout_s: float) -> None:
        """Return when `job_id` is announced as changed or after `timeout_s`."""
        loop = asyncio.get_running_loop()
        entry = (loop, asyncio.Event())
        with self._lock:
            self._events[job_id].add(entry)
        try:
            await asyncio.wait_for(entry[1].wait(), timeout=max(timeout_s, 0.0))
        except TimeoutError:
            pass
        finally:
            with self._lock:
                waiters = self._events.get(job_id)
                if waiters is not None:
                    waiters.discard(entry)
                    if not waiters:
                        del self._events[job_id]

"""Long-poll support: API requests waiting for a job to change state.

The worker announces changed job ids on the bus; each announcement wakes the
asyncio waiters of those jobs, from whatever thread it arrives on. A waiter
subscribes before it reads the job, so an announcement that lands between the
read and the wait still wakes it. Waiters also re-read the database every
`poll_s`, so a missed announcement (another process, a restarted bus) costs
latency, never a wrong answer.
"""

from __future__ import annotations

import asyncio
import threading
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

from app.bus.messages import JobsChanged


class Watch:
    """One subscription to a job's announcements; `wait` returns on the next one."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.event = asyncio.Event()

    async def wait(self, timeout_s: float) -> bool:
        """True when an announcement came (since the last wait), False at the timeout."""
        try:
            await asyncio.wait_for(self.event.wait(), timeout=max(timeout_s, 0.0))
        except TimeoutError:
            return False
        self.event.clear()
        return True


class JobWaiters:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watches: dict[str, set[Watch]] = defaultdict(set)
        # set when the server shuts down: long-polls answer the state they have at once
        # (a 300 s long-poll held SIGTERM for as long, refusing new connections)
        self.closing = False

    def close(self) -> None:
        """Wake every waiter for good: the server is shutting down."""
        self.closing = True
        with self._lock:
            targets = [w for watches in self._watches.values() for w in watches]
        self._wake(targets)

    def on_change(self, change: JobsChanged) -> None:
        with self._lock:
            targets = [w for job_id in change.job_ids for w in self._watches.get(job_id, ())]
        self._wake(targets)

    @staticmethod
    def _wake(targets: list[Watch]) -> None:
        for watch in targets:
            try:
                watch.loop.call_soon_threadsafe(watch.event.set)
            except RuntimeError:  # the loop closed meanwhile
                pass

    @contextmanager
    def watch(self, job_id: str) -> Iterator[Watch]:
        """Subscribe to `job_id`'s announcements for the block (read the job inside it)."""
        entry = Watch(asyncio.get_running_loop())
        with self._lock:
            self._watches[job_id].add(entry)
        try:
            yield entry
        finally:
            with self._lock:
                watches = self._watches.get(job_id)
                if watches is not None:
                    watches.discard(entry)
                    if not watches:
                        del self._watches[job_id]

    async def wait(self, job_id: str, timeout_s: float) -> None:
        """Return when `job_id` is announced as changed or after `timeout_s`."""
        with self.watch(job_id) as entry:
            await entry.wait(timeout_s)

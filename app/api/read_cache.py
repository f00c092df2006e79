"""A short-lived cache of rendered job views for the hot `GET /v1/jobs/{id}` path.

Launchers poll their jobs; serving those polls from memory keeps the database
for writes. An entry is dropped when the worker announces a change of that job
(bus notice), when this process changes it, and in any case after `ttl_s`, the
bound on staleness for changes made by another API replica whose notice was
lost. A read that raced an invalidation is not cached (generation check).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

from app.bus.messages import JobsChanged


class JobViewCache:
    def __init__(self, ttl_s: float, max_entries: int = 50_000) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._entries: OrderedDict[str, tuple[float, bytes]] = OrderedDict()
        self._generation = 0
        self._changed_at: dict[str, int] = {}
        self._lock = threading.Lock()

    def generation(self) -> int:
        return self._generation

    def get(self, job_id: str) -> bytes | None:
        if self.ttl_s <= 0:
            return None
        entry = self._entries.get(job_id)
        if entry is None or entry[0] < time.monotonic():
            return None
        return entry[1]

    def put(self, job_id: str, view: bytes, read_generation: int) -> None:
        """Keep `view` unless the job changed after the read that produced it began."""
        if self.ttl_s <= 0:
            return
        with self._lock:
            if self._changed_at.get(job_id, -1) > read_generation:
                return
            self._entries[job_id] = (time.monotonic() + self.ttl_s, view)
            self._entries.move_to_end(job_id)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def invalidate(self, job_ids: tuple[str, ...] | list[str]) -> None:
        with self._lock:
            self._generation += 1
            for job_id in job_ids:
                self._entries.pop(job_id, None)
                self._changed_at[job_id] = self._generation
            if len(self._changed_at) > 4 * self.max_entries:
                self._changed_at.clear()  # old generations no longer matter
                self._generation += 1

    def on_change(self, change: JobsChanged) -> None:
        self.invalidate(change.job_ids)

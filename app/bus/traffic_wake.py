"""The worker's wake-up after traffic ingest: `ReportTraffic`, sent at a bounded rate.

Traffic reports need no outbox event: they are durable rows the worker reads
after its cursor on every fabric pass, and a pass runs at least every tick.
The wake-up only shortens that wait, so it is sent after the commit, best
effort, and at most once per `interval_s`: a wake-up sent while the previous
one is recent is held and sent when the interval ends, carrying the newest
seq. Ingest at any rate costs the worker at most `1 / interval_s` passes a
second, each reading every report committed meanwhile.

Imports nothing from the store or the API.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from .messages import Message, ReportTraffic

log = logging.getLogger("lightpath.bus")

# a failing bus (Redis down) is logged at most this often; the worker's tick still runs
_LOG_EVERY_S = 10.0


class TrafficWake:
    """Sends `ReportTraffic(last_seq)` from a thread of its own, at most once per interval."""

    def __init__(self, publish: Callable[[Message], None], interval_s: float) -> None:
        self.publish = publish
        self.interval_s = interval_s
        self.sent = 0  # wake-ups sent (tests, metrics)
        self._newest = 0
        self._due = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._logged_at = float("-inf")
        self._thread: threading.Thread | None = None  # started by the first wake-up

    def __call__(self, last_seq: int) -> None:
        """Reports up to `last_seq` committed: wake the worker now, or when the interval ends."""
        with self._lock:
            self._newest = max(self._newest, last_seq)
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._run, name="traffic-wake", daemon=True)
                self._thread.start()
        self._due.set()

    def close(self) -> None:
        """Send what is held, then stop the thread."""
        with self._lock:
            self._stop.set()
            thread = self._thread
        self._due.set()
        if thread is not None:
            thread.join(timeout=5)

    def _run(self) -> None:
        announced = -1
        while True:
            self._due.wait()
            self._due.clear()
            with self._lock:
                newest = self._newest
            if newest != announced:
                self._send(newest)
                announced = newest
            if self._stop.is_set():
                return
            # reports committed during the pause are announced by one wake-up after it
            self._stop.wait(self.interval_s)

    def _send(self, last_seq: int) -> None:
        try:
            self.publish(ReportTraffic(last_seq=last_seq))
            self.sent += 1
        except Exception as exc:
            now = time.monotonic()
            if now - self._logged_at >= _LOG_EVERY_S:
                self._logged_at = now
                log.warning(  # a bus outage: the reason, not a traceback per wake-up
                    "traffic wake-up not sent; the worker's tick reads the reports",
                    extra={"error": f"{type(exc).__name__}: {exc}"[:300]},
                )

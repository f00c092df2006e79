"""The worker loop: take messages, run the handlers, announce what changed.

A periodic tick runs the same handlers with no message, so state recorded by
the API is acted on even if its message was lost (the durable row is the
truth; messages are only wake-ups).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Protocol

from app.bus.messages import AdmitJob, CompleteJob, Delivery, JobsChanged, Message
from app.engine.cluster import Cluster
from app.settings import Settings
from app.store import Store

from .scheduler import schedule

log = logging.getLogger("lightpath.worker")


class CommandBus(Protocol):
    def consume(self, timeout_s: float) -> list[Delivery]: ...
    def ack(self, deliveries: Sequence[Delivery]) -> None: ...
    def announce(self, change: JobsChanged) -> None: ...


class Worker:
    """Runs the engine on every wake-up; one instance drives the cluster at a time."""

    def __init__(self, store: Store, bus: CommandBus, cluster: Cluster, settings: Settings) -> None:
        self.store = store
        self.bus = bus
        self.cluster = cluster
        self.settings = settings
        self.passes = 0

    def handle(self, messages: list[Message]) -> None:
        """One pass over the current state, whatever woke us."""
        reason = "arrival"
        if any(isinstance(m, CompleteJob) for m in messages):
            reason = "completion"
        elif not any(isinstance(m, AdmitJob) for m in messages):
            reason = "reconcile"
        result = schedule(
            self.store,
            self.cluster,
            self.settings.queue_policy,
            backfill=self.settings.backfill,
            reason=reason,
        )
        self.passes += 1
        changed = set(result.placed) | set(result.examined)
        changed.update(m.job_id for m in messages if isinstance(m, AdmitJob | CompleteJob))
        if changed:
            self.bus.announce(JobsChanged(tuple(sorted(changed))))

    def run(self, stop: threading.Event) -> None:
        """Loop until `stop` is set; errors are logged and retried after a pause."""
        log.info("worker started", extra={"cluster": self.cluster.name})
        backoff_s = 0.1
        while not stop.is_set():
            deliveries = self.bus.consume(self.settings.worker_tick_s)
            try:
                self.handle([d.message for d in deliveries])
                self.bus.ack(deliveries)  # only after the effects are committed
                backoff_s = 0.1
            except Exception:
                log.exception("worker pass failed; retrying")
                time.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, 5.0)
        log.info("worker stopped")

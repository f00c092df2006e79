"""The southbound controller: converge the switches to the desired cross-connects.

A level-triggered loop in its own thread (so a slow or unreachable switch never
stalls scheduling): each pass reads the desired state from the database (the
decision log's result) and what the switches hold, applies the difference with
retries, and records what they confirmed. It runs after every fabric change,
when a pass asks to be requeued, and at least every `resync_s` to notice drift
such as a failed port. Only the leader runs it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from app.engine.cluster import Cluster
from app.southbound import SouthboundDriver
from app.southbound.reconcile import ReconcileResult, RetryPolicy, reconcile
from app.store.fabric_repository import ConfirmedOxc, FabricRepository

from .metrics import WorkerMetrics

log = logging.getLogger("lightpath.southbound")


class SwitchController:
    def __init__(
        self,
        repo: FabricRepository,
        driver: SouthboundDriver,
        cluster: Cluster,
        metrics: WorkerMetrics,
        *,
        resync_s: float = 5.0,
        on_failed_ports: Callable[[], None] | None = None,
        on_confirmed: Callable[[frozenset[tuple[str, int, int]]], None] | None = None,
    ) -> None:
        self.repo = repo
        self.driver = driver
        self.cluster = cluster
        self.metrics = metrics
        self.resync_s = resync_s
        self.on_failed_ports = on_failed_ports
        self.on_confirmed = on_confirmed
        self._held: dict[str, frozenset[tuple[str, int, int]]] = {}
        self.policy = RetryPolicy()
        self._kick = threading.Event()
        self._lock = threading.Lock()
        self.passes = 0
        self.last: ReconcileResult | None = None

    def kick(self) -> None:
        self._kick.set()

    def run_once(self) -> ReconcileResult:
        """One pass; serialised so two callers never reconcile at once."""
        with self._lock:
            before = self.repo.load_failed_ports()
            desired = self.repo.desired_by_oxc(o.id for o in self.cluster.oxcs)
            result = reconcile(self.driver, desired, policy=self.policy)
            self.repo.save_confirmed(
                [
                    ConfirmedOxc(o, c.cross_connects, c.failed_ports)
                    for o, c in result.confirmed.items()
                ],
                unreachable=[o.id for o in self.cluster.oxcs if o.id not in result.confirmed],
            )
            self.passes += 1
            self.last = result
        if self.on_confirmed is not None:
            # what every OXC holds now (the last read of each), timed by the caller's
            # clock: hits are scored on it
            for o, c in result.confirmed.items():
                self._held[o] = frozenset((o, a, b) for a, b in c.cross_connects)
            self.on_confirmed(frozenset().union(*self._held.values()))
        self.metrics.reconfigurations.inc(len(result.applied))
        for err in result.errors:
            self.metrics.reconcile_errors.labels(err.code).inc()
        self.metrics.converged.set(1 if result.converged else 0)
        after = self.repo.load_failed_ports()
        if (after != before or result.needs_replan) and self.on_failed_ports is not None:
            self.on_failed_ports()  # the planner moves circuits off failed ports
        return result

    def run(self, stop: threading.Event, is_leader: Callable[[], bool] = lambda: True) -> None:
        wait_s = 0.0
        while not stop.is_set():
            self._kick.wait(wait_s)
            self._kick.clear()
            if stop.is_set():
                break
            if not is_leader():
                wait_s = self.resync_s
                continue
            try:
                result = self.run_once()
                wait_s = result.requeue_after_s if result.requeue_after_s else self.resync_s
            except Exception:
                log.exception("reconciliation pass failed; retrying")
                wait_s = min(self.resync_s, 1.0)

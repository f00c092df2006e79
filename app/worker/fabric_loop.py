"""The fabric pass and its loop, wherever it runs.

`FabricLoop` owns the fabric side of the worker: the `FabricDriver` (and with
it the worker memory), the reason of the pass asked for, and the replan and
reset flags. Passes are coalesced: however many arrivals asked meanwhile, one
pass runs, for the strongest reason. The same loop runs on a thread of the
worker process (`lightpath serve`, and tests) or in a fabric process of its own
(`lightpath worker`, see `fabric_process`), where the plan uses another core
instead of sharing the interpreter with admission.

Every pass reads the durable state (placed jobs, failed ports, reports after
the cursor), so a pass asked for and never run is made up by the next one:
the tick, a restarted fabric process, a new leader.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from app.logs import log_pass_failure

from .fabric_driver import FabricDriver
from .metrics import WorkerMetrics

log = logging.getLogger("lightpath.worker")

# a pass asked for several reasons runs for the strongest
RANK = {"reconcile": 0, "arrival": 1, "completion": 2}


class FabricLoop:
    """Coalesced fabric passes: placements, failed ports, confirmations, traffic."""

    def __init__(
        self,
        driver: FabricDriver,
        metrics: WorkerMetrics,
        *,
        tick_s: float,
        announce: Callable[[tuple[str, ...]], None],
        on_fabric_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.driver = driver
        self.metrics = metrics
        self.tick_s = tick_s
        self.announce = announce  # job views that changed (change notices)
        self.on_fabric_change = on_fabric_change  # new desired state: kick the switches
        # run before each pass of `run` (the worker's thread lets an admission go first)
        self.before_pass: Callable[[threading.Event], None] = lambda stop: None
        # run after each pass of `run` (and each tick a standby skips), told whether
        # nothing waits for the next one (the fabric process makes its full garbage
        # collections there: `gc_policy`)
        self.after_pass: Callable[[bool], object] = lambda idle: None
        # run at the top of every round of `run`, a pass or not (the fabric process's
        # stall watchdog hears from it: a round at least every tick)
        self.on_round: Callable[[], object] = lambda: None
        self.replan = threading.Event()
        self._due = threading.Event()
        self._lock = threading.Lock()
        self._reason: str | None = None
        self._reset = False

    def request(self, reason: str) -> None:
        """Ask for a pass; reasons coalesce to the strongest."""
        with self._lock:
            if self._reason is None or RANK[reason] > RANK[self._reason]:
                self._reason = reason
        self._due.set()

    def request_replan(self) -> None:
        """Plan from scratch on the next pass (failed ports, a switch asking for it)."""
        self.replan.set()

    def reset(self) -> None:
        """Forget the worker memory: the next pass starts from the durable state.

        The memory is dropped by the pass itself, so a pass under way never sees
        it vanish.
        """
        self._reset = True
        self.replan.set()
        self._due.set()

    def wake(self) -> None:
        self._due.set()

    def sync(self, reason: str, changed: set[str]) -> None:
        """Placements, completions, failed ports, confirmations and turns into the controller."""
        if self._reset:
            self._reset = False
            self.driver.reset()
        start = time.perf_counter()
        forced = self.replan.is_set()
        self.replan.clear()
        fabric = self.driver.sync(reason, force=forced)
        if fabric.planned:
            self.metrics.fabric_seconds.observe(time.perf_counter() - start)
            changed.update(fabric.changed_jobs)
            if fabric.decision_seqs:
                self.on_fabric_change()

    def consume_traffic(self, reason: str, changed: set[str]) -> None:
        """Traffic reports after the cursor into the controller (phases, predictions)."""
        if self.driver.consume():
            self.on_fabric_change()

    def pass_once(self) -> None:
        """One coalesced pass for the reasons asked since the last."""
        with self._lock:
            reason = self._reason or "reconcile"
            self._reason = None
        changed: set[str] = set()
        self.sync(reason, changed)
        self.consume_traffic(reason, changed)
        if changed:
            self.announce(tuple(sorted(changed)))

    def run(self, stop: threading.Event, is_leader: Callable[[], bool]) -> None:
        """Pass when asked (at least every tick) while leading, until `stop` is set."""
        backoff_s = 0.1
        while not stop.is_set():
            self._due.wait(self.tick_s)
            self.on_round()
            if stop.is_set() or not is_leader():
                self._due.clear()
                self.after_pass(True)  # a standby has nothing but idle time
                continue
            self.before_pass(stop)
            self._due.clear()
            try:
                self.pass_once()
                backoff_s = 0.1
                backlog = self.driver.backlog
                self.after_pass(not backlog and not self._due.is_set())
                if backlog:  # reports left after the pass's budget: go on at once
                    self._due.set()
            except Exception as exc:
                log_pass_failure(log, "fabric pass", exc, "retrying from the durable state")
                self._reset = True
                self.replan.set()
                stop.wait(backoff_s)
                backoff_s = min(backoff_s * 2, 5.0)
                self._due.set()

"""The worker loop: take messages, run the handlers, announce what changed.

A periodic tick runs the same handlers with no message, so state recorded by
the API is acted on even if its message was lost (the durable row is the
truth; messages are only wake-ups). Messages are acknowledged only after the
effects of the pass are committed.

Scheduling runs ahead of fabric work (`run`): the message thread admits jobs
and acknowledges; the fabric pass (placements into the controller, desired
cross-connects, traffic reports: `FabricLoop`) runs coalesced over whatever
arrived meanwhile, so "placed" never waits for another job's circuits. Both
passes are level-triggered from the database, so an acknowledged message
whose fabric pass has not run yet is still acted on (the tick, a new leader, a
restarted fabric process).

Where the fabric pass runs: with `fabric_process` set (`lightpath worker`) in
a process of its own, with the switch controller, so the plan uses another
core; otherwise on a thread of this process (`lightpath serve`, whose API
shows the in-process mock switches the controller drives). On a thread the two
passes share one interpreter: between its steps a fabric pass waits for an
admission pass under way (at most `ADMISSION_FIRST_S`), so an arrival is not
admitted on half of it.
"""

from __future__ import annotations

import datetime as dt
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from app.bus.errors import BusError
from app.bus.messages import AdmitJob, CompleteJob, Delivery, JobsChanged, Message, ReportTraffic
from app.bus.outage import OutageLog
from app.engine.cluster import Cluster
from app.engine.cross_connects import CrossConnect
from app.engine.job import JobState
from app.engine.job_lease import expired_leases
from app.logs import first_few, log_pass_failure
from app.settings import Settings
from app.store import PlacedCache, Store
from app.store.fencing import Fenced

from .fabric_driver import FabricDriver
from .fabric_loop import FabricLoop
from .metrics import WorkerMetrics
from .scheduler import schedule

if TYPE_CHECKING:
    from .fabric_process import FabricProcess

log = logging.getLogger("lightpath.worker")

FABRIC_SETTLE_S = 0.01
# the longest a fabric pass step waits for an admission under way (then goes on anyway)
ADMISSION_FIRST_S = 0.05
SWITCH_INTERVAL_S = 0.0001
# end_reason of a placed job whose servers the cluster file no longer has
CLUSTER_CHANGED = "cluster_changed"


class CommandBus(Protocol):
    def consume(self, timeout_s: float) -> list[Delivery]: ...
    def ack(self, deliveries: Sequence[Delivery]) -> None: ...
    def announce(self, change: JobsChanged) -> None: ...


def orphaned_jobs(cluster: Cluster, holders: Mapping[str, list[str]]) -> dict[str, list[str]]:
    """Job -> its servers the cluster does not have, for every job holding any."""
    known = set(cluster.server_ids)
    return {
        job_id: [s for s in servers if s not in known]
        for job_id, servers in holders.items()
        if not known.issuperset(servers)
    }


def wrong_cluster_file(
    cluster: Cluster, holders: Mapping[str, list[str]], desired: Iterable[CrossConnect] = ()
) -> str | None:
    """Why the cluster file is likely the wrong one, or None: the stored plan has
    cross-connects on switches or ports the file lacks, or two or more jobs are placed
    and it holds none of them. A worker that drove the switches on it would leave those
    jobs out of the fabric and tear down every circuit they hold (`lightpath worker`
    and `serve` refuse to start on it). Retired pods keep their switches and ports (only
    their wiring goes): their jobs are failed `cluster_changed` instead."""
    ports = {o.id: o.ports for o in cluster.oxcs}
    stray = {cc.oxc_id for cc in desired if max(cc.port_a, cc.port_b) >= ports.get(cc.oxc_id, 0)}
    if stray:
        return (
            f"the cluster file ({cluster.name}) lacks switches or ports the stored plan "
            f"holds circuits on ({first_few(sorted(stray))}): "
            "is LIGHTPATH_CLUSTER (or --cluster) the right one?"
        )
    orphans = orphaned_jobs(cluster, holders)
    if len(orphans) < 2 or len(orphans) != len(holders):
        return None
    return (
        f"the cluster file ({cluster.name}) holds none of the {len(orphans)} placed jobs' "
        "servers: is LIGHTPATH_CLUSTER (or --cluster) the right one?"
    )


class Worker:
    """Runs the engine on every wake-up; only the lease holder drives the cluster.

    A handler table maps each message type to the handlers it calls; a tick (no
    message) runs them all. Handlers read current state, never the message.
    """

    def __init__(
        self,
        store: Store,
        bus: CommandBus,
        cluster: Cluster,
        settings: Settings,
        *,
        driver: FabricDriver,
        metrics: WorkerMetrics,
        on_fabric_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.store = store
        self.bus = bus
        self.cluster = cluster
        self.settings = settings
        self.driver = driver
        self.metrics = metrics
        self.passes = 0
        # run first on the fabric thread (the process binds it to the lease's fence)
        self.thread_init: Callable[[], None] = lambda: None
        self.placed = PlacedCache()  # scheduling's memory of placed jobs
        # when this worker began leading: launchers' silence before it is not held
        # against their leases (their heartbeats may have been refused meanwhile)
        self.leading_since = time.time()
        self._leases_granted = False  # `expire_leases` gives them lease_s from then, once
        self._orphans_checked = False  # `retire_orphans`, once per leadership
        self.fabric = FabricLoop(
            driver,
            metrics,
            tick_s=settings.worker_tick_s,
            announce=lambda ids: bus.announce(JobsChanged(ids)),
            on_fabric_change=on_fabric_change,
        )
        # set by the wiring: `run` drives the fabric pass in a process of its own instead
        # of `self.fabric` on a thread (`lightpath worker`)
        self.fabric_process: FabricProcess | None = None
        driver.on_views = self.collectives_written
        # set while no admission pass runs: the fabric pass waits for it between steps,
        # so an arrival is not admitted on half an interpreter (they share the GIL)
        self._not_admitting = threading.Event()
        self._not_admitting.set()
        driver.yield_to = self._admission_first
        self.fabric.before_pass = self._let_admission_go_first
        self.handlers: dict[type, tuple[Callable[[str, set[str]], None], ...]] = {
            AdmitJob: (self.admit, self.sync_fabric),
            CompleteJob: (self.admit, self.sync_fabric),
            ReportTraffic: (self.sync_fabric, self.consume_traffic),
        }

    @property
    def replan(self) -> threading.Event:
        return self.fabric.replan

    def retire_orphans(self) -> set[str]:
        """Fail placed jobs holding servers the cluster no longer has, once per leadership.

        A restart on a cluster file without some pods (decommissioned) left their jobs
        placed: every fabric pass then failed on servers it could not find, and no
        later job got circuits or a collective. They end `failed` with reason
        `cluster_changed: ...`, freeing what they held that still exists. When every
        placed job (two or more) would go, the cluster file is more likely the wrong
        one (a worker started without LIGHTPATH_CLUSTER reads the `small` preset):
        nothing is failed, an error says so, and the fabric passes leave them out.
        """
        if self._orphans_checked:
            return set()
        holders = self.store.server_holders()
        orphans = orphaned_jobs(self.cluster, holders)
        if wrong_cluster_file(self.cluster, holders) is not None:
            log.error(
                "no placed job fits the cluster file: is it the right one? "
                "Those jobs are not failed; the fabric leaves them out",
                extra={"cluster": self.cluster.name, "jobs": len(orphans)},
            )
            self._orphans_checked = True
            return set()
        failed: set[str] = set()
        for job_id, servers in sorted(orphans.items()):
            reason = (
                f"{CLUSTER_CHANGED}: {len(servers)} of its servers are not in the cluster "
                f"({first_few(servers)})"
            )
            record = self.store.end_job(
                job_id, JobState.FAILED, from_states=(JobState.PLACED,), reason=reason
            )
            if record is not None and record.end_reason == reason:
                log.error("placed job failed: " + reason, extra={"job_id": job_id})
                failed.add(job_id)
        # only once all are failed: one that raised (the database busy) is tried again
        self._orphans_checked = True
        return failed

    def expire_leases(self) -> set[str]:
        """Fail placed jobs whose heartbeat lease ran out (freeing their servers).

        First, once per leadership, every lease gets its full `lease_s` from when this
        worker began leading, written as a heartbeat so the job view's
        `lease_expires_at` says so too (it kept the old, already past, time)."""
        orphans = self.retire_orphans()
        if orphans:
            self.bus.announce(JobsChanged(tuple(sorted(orphans))))
        if not self._leases_granted:
            since = dt.datetime.fromtimestamp(self.leading_since, dt.UTC)
            granted = self.store.grant_leases(since)
            self._leases_granted = True
            if granted:
                self.bus.announce(JobsChanged(tuple(sorted(granted))))
        expired: set[str] = set(orphans)
        if self.placed.warm and not self.placed.any_leased():
            return expired  # no placed job holds a lease: nothing to read
        for lease in expired_leases(self.store.leased_jobs(), time.time(), self.leading_since):
            if self.store.expire_lease(lease):
                log.warning("job lease expired", extra={"job_id": lease.job_id})
                expired.add(lease.job_id)
        return expired

    def handle(self, messages: list[Message]) -> None:
        """One pass over the current state, whatever woke us (fabric work in-process)."""
        reason = "reconcile"
        expired = self.expire_leases()
        if expired or any(isinstance(m, CompleteJob) for m in messages):
            reason = "completion"
        elif any(isinstance(m, AdmitJob) for m in messages):
            reason = "arrival"
        todo: list[Callable[[str, set[str]], None]] = []
        kinds = {type(m) for m in messages} or set(self.handlers)
        for kind in (AdmitJob, CompleteJob, ReportTraffic):  # a fixed order: admit first
            if kind in kinds:
                todo += [h for h in self.handlers[kind] if h not in todo]
        changed: set[str] = set()
        changed.update(m.job_id for m in messages if isinstance(m, AdmitJob | CompleteJob))
        for handler in todo:
            handler(reason, changed)
        self.passes += 1
        if changed:
            self.bus.announce(JobsChanged(tuple(sorted(changed))))

    def admit(self, reason: str, changed: set[str], *, leases_checked: bool = False) -> None:
        """Serve the queue; launchers waiting for placement hear of it before the fabric."""
        # lapsed leases free servers before admission
        expired = set() if leases_checked else self.expire_leases()
        start = time.perf_counter()
        result = schedule(
            self.store,
            self.cluster,
            self.settings.queue_policy,
            backfill=self.settings.backfill,
            max_extra_pods=self.settings.max_extra_pods,
            reason=reason,
            cache=self.placed,
        )
        self.metrics.placement_seconds.observe(time.perf_counter() - start)
        self.metrics.jobs_placed.inc(len(result.placed))
        self.metrics.decisions.labels("placement").inc(len(result.decision_seqs))
        placed = set(result.placed) | set(result.examined) | changed | expired
        if placed:
            self.bus.announce(JobsChanged(tuple(sorted(placed))))
        changed.clear()

    def sync_fabric(self, reason: str, changed: set[str]) -> None:
        """Placements, completions, failed ports, confirmations and turns into the controller."""
        self.fabric.sync(reason, changed)

    def consume_traffic(self, reason: str, changed: set[str]) -> None:
        """Traffic reports after the cursor into the controller (phases, predictions)."""
        self.fabric.consume_traffic(reason, changed)

    def request_replan(self) -> None:
        if self.fabric_process is not None:
            self.fabric_process.request_replan()
        else:
            self.fabric.request_replan()

    def take_over(self, *, elected: bool = False) -> None:
        """Forget the worker memory: a new leader starts from the durable state.

        The fabric memory is dropped by the fabric pass itself (its next pass),
        so a pass under way on the other thread never sees it vanish. A fabric
        process resets itself when it is sent a new lease term (`elected`): told
        again, it could load twice and log every job's headers twice.
        """
        self.placed.clear()
        self.leading_since = time.time()
        self._leases_granted = False
        # another leader, perhaps on another cluster file, may have placed jobs meanwhile
        self._orphans_checked = False
        if self.fabric_process is not None:
            if not elected:
                self.fabric_process.reset()
        else:
            self.fabric.reset()

    def collectives_written(self, views: Mapping[str, dict[str, Any]]) -> None:
        """The job views a fabric pass wrote: aggregator totals for scheduling follow them."""
        for job_id, collective in views.items():
            self.placed.set_collective(job_id, collective)

    # --- the two sides of `run` ----------------------------------------------

    def admit_pass(self, messages: list[Message]) -> None:
        """Admission for what woke us; the fabric pass is only requested."""
        expired = self.expire_leases()
        reason = "reconcile"
        if expired or any(isinstance(m, CompleteJob) for m in messages):
            reason = "completion"
        elif any(isinstance(m, AdmitJob) for m in messages):
            reason = "arrival"
        if not messages or expired or any(isinstance(m, AdmitJob | CompleteJob) for m in messages):
            changed = {m.job_id for m in messages if isinstance(m, AdmitJob | CompleteJob)}
            self.admit(reason, changed | expired, leases_checked=True)
        self.passes += 1
        self.request_fabric(reason)

    def _admission_first(self) -> None:
        self._not_admitting.wait(ADMISSION_FIRST_S)

    def _let_admission_go_first(self, stop: threading.Event) -> None:
        # let the answer to the arrival that asked for this pass go out first (it
        # shares the interpreter), and coalesce what arrives meanwhile
        stop.wait(FABRIC_SETTLE_S)
        self._admission_first()

    def request_fabric(self, reason: str) -> None:
        """Ask for a fabric pass; reasons coalesce to the strongest."""
        if self.fabric_process is not None:
            self.fabric_process.request(reason)
        else:
            self.fabric.request(reason)

    def fabric_pass(self) -> None:
        """One coalesced fabric pass in this thread: placements, failed ports, traffic."""
        self.fabric.pass_once()

    def _run_fabric(self, stop: threading.Event, is_leader: Callable[[], bool]) -> None:
        if self.fabric_process is not None:
            self.fabric_process.run(stop)
            return
        self.thread_init()
        self.fabric.run(stop, is_leader)

    def run(self, stop: threading.Event, is_leader: Callable[[], bool] = lambda: True) -> None:
        """Loop until `stop` is set; errors are logged and retried after a pause."""
        log.info("worker started", extra={"cluster": self.cluster.name})
        if self.fabric_process is None:
            # the fabric pass is CPU-bound Python: at the default 5 ms switch interval a
            # scheduling pass (or, embedded, an API request) waits up to 5 ms for the
            # interpreter after every database round trip; 0.1 ms bounds that wait
            sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))
        fabric = threading.Thread(
            target=self._run_fabric, args=(stop, is_leader), name="fabric-pass", daemon=True
        )
        fabric.start()
        backoff_s = 0.1
        # messages are only wake-ups: without them every tick still acts on the durable
        # state, and what was published meanwhile is taken when the bus is back
        outage = OutageLog(
            log,
            "event bus unavailable; acting on the database every tick",
            "event bus reachable again; taking messages",
        )
        while not stop.is_set():
            if not is_leader():
                stop.wait(self.settings.worker_tick_s)  # a standby takes no messages
                continue
            try:
                deliveries = self.bus.consume(self.settings.worker_tick_s)
                outage.ok()
            except BusError as exc:
                # unreachable, or refusing us (wrong credentials, a Redis out of memory):
                # the loop died and restarted for ever on the latter, and nothing was
                # admitted while the API went on accepting jobs
                outage.failed(exc)
                stop.wait(self.settings.worker_tick_s)
                deliveries = []
            if stop.is_set():
                # stopping (SIGTERM) while waiting for messages: no admission now, since
                # the fabric pass is stopping too (a job placed 0.2 s after SIGTERM went
                # unplanned, network null, until the next leader); the messages stay
                # unacknowledged, and the next leader acts on the durable state
                break
            try:
                self._not_admitting.clear()
                try:
                    self.admit_pass([d.message for d in deliveries])
                finally:
                    self._not_admitting.set()
                if deliveries:
                    self.bus.ack(deliveries)
                backoff_s = 0.1
            except Fenced as exc:
                # a newer leader exists, or our lease lapsed mid-pass: nothing was written
                log.warning("worker pass refused by the fence", extra={"detail": str(exc)})
                self.take_over()
                time.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, 5.0)
            except Exception as exc:
                log_pass_failure(log, "worker pass", exc, "retrying from the durable state")
                self.take_over()
                time.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, 5.0)
        self.fabric.wake()
        fabric.join(timeout=30)
        log.info("worker stopped")

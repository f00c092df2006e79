"""Bootstrap: the single place that decides which parts are real and wires them.

`build_runtime` returns the pieces of one process (API services, worker,
outbox relay, switch controller) for the configured settings; the CLI and the
tests start them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

from app.api.deps import Services
from app.api.metrics import ApiMetrics
from app.api.read_cache import JobViewCache
from app.bus import InProcessBus
from app.bus.messages import JobsChanged
from app.bus.relay import OutboxRelay
from app.bus.traffic_wake import TrafficWake
from app.cluster_files import ConfigError, load_cluster
from app.engine.circuits import load_solver
from app.engine.cluster import Cluster
from app.engine.controller import ControllerConfig
from app.settings import Settings
from app.southbound import HttpDriver, InProcessDriver, SouthboundDriver
from app.store import Store, create_db_engine
from app.store.fabric_repository import FabricRepository
from app.store.fencing import UNFENCED, Fence
from app.store.retention import Retention, RetentionPolicy
from app.store.traffic_repository import TrafficRepository
from app.worker import Worker
from app.worker.fabric_driver import FabricDriver
from app.worker.metrics import WorkerMetrics
from app.worker.switch_controller import SwitchController

log = logging.getLogger("lightpath.wiring")

# a background loop that died is started again after this pause, doubling up to the max
LOOP_RESTART_MIN_S = 0.5
LOOP_RESTART_MAX_S = 10.0

# the cluster loaders stay importable from here
__all__ = ["ConfigError", "Runtime", "build_fabric_side", "build_runtime", "load_cluster"]


def build_store(settings: Settings) -> Store:
    """SQLite: a write engine (BEGIN IMMEDIATE) and a read engine; PostgreSQL: one pool, its
    reads marked unfenced (the lease's fence guards writes only)."""
    write = create_db_engine(settings, for_writes=True)
    if settings.is_sqlite:
        read = create_db_engine(settings, for_writes=False)
    else:
        read = write.execution_options(**{UNFENCED: True})
    return Store(write, read)


def _southbound_token(settings: Settings) -> str | None:
    token = settings.southbound_token
    return token.get_secret_value() if token is not None else None


def build_driver(settings: Settings, cluster: Cluster) -> SouthboundDriver:
    """The HTTP driver when LIGHTPATH_SOUTHBOUND_URL is set, else in-process mock switches."""
    if settings.southbound_url:
        return HttpDriver(settings.southbound_url, token=_southbound_token(settings))
    return InProcessDriver.for_cluster(
        cluster, fault_rate=settings.mock_fault_rate, seed=settings.mock_fault_seed
    )


@dataclass
class Runtime:
    """One process's parts; `start` runs the background loops, `stop` ends them."""

    services: Services
    relay: OutboxRelay | None
    worker: Worker | None = None
    controller: SwitchController | None = None
    is_leader: Callable[[], bool] = lambda: True
    # run first on the worker and switch-controller threads (binds them to the fence)
    thread_init: Callable[[], None] = lambda: None
    closers: list[Callable[[], None]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def _spawn(self, name: str, target: Callable[..., None], *args: Any) -> None:
        def run() -> None:
            self.thread_init()
            # the loops retry their own failures; should one escape anyway, the loop is
            # started again (a dead scheduling thread in a live process would keep its
            # lease and stop all scheduling, with no standby taking over)
            pause_s = LOOP_RESTART_MIN_S
            while True:
                try:
                    target(*args)
                    return
                except Exception:
                    log.exception("background loop died; restarting it", extra={"loop": name})
                if self._stop.wait(pause_s):
                    return
                pause_s = min(pause_s * 2, LOOP_RESTART_MAX_S)

        thread = threading.Thread(target=run, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def start(self, *, load_solver_now: bool = True) -> None:
        """Start the background loops; a worker also loads the exact solver (see below)."""
        if self.relay is not None:
            self.relay.start()
        if self.worker is not None:
            if load_solver_now:
                self.load_solver()
            self.worker.thread_init = self.thread_init  # its fabric thread is fenced too
            self._spawn("worker", self.worker.run, self._stop, self.is_leader)
        if self.controller is not None:
            self._spawn("switch-controller", self.controller.run, self._stop, self.is_leader)

    def load_solver(self) -> None:
        """Import numpy/scipy (~0.4-0.6 s of CPU) on a thread of their own.

        Not in front of /readyz, yet before the first arrival's fabric pass needs them
        (a pass that comes sooner waits for the import, not for a second one). `serve`
        calls this once HTTP is up, so start-up does not share the interpreter with it.
        A worker whose fabric pass runs in a process of its own leaves it to that process.
        """
        if self.worker is not None and self.worker.fabric_process is None:
            threading.Thread(target=load_solver, name="solver-import", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        if self.controller is not None:
            self.controller.kick()
        if self.relay is not None:
            self.relay.stop()
        for thread in self._threads:
            thread.join(timeout=10)
        for close in self.closers:
            close()
        self.services.store.dispose()


def _api_services(settings: Settings, cluster: Cluster, store: Store, bus: Any) -> Services:
    """The services an API process needs, with its change-notice listeners attached."""
    services = Services(
        settings=settings,
        cluster=cluster,
        store=store,
        bus=bus,
        metrics=ApiMetrics(store, cluster, registry=CollectorRegistry()),
        traffic=TrafficRepository(store),
        fabric=FabricRepository(store),
        read_cache=JobViewCache(ttl_s=settings.read_cache_ttl_s),
    )
    bus.listen(services.read_cache.on_change)
    bus.listen(services.waiters.on_change)
    return services


def _wake_worker_after_ingest(runtime: Runtime, settings: Settings, bus: Any) -> None:
    """Traffic commits wake the worker through `bus` (paced); closed after ingest drains."""
    wake = TrafficWake(bus.publish, settings.traffic_wake_ms / 1000)
    runtime.services.wake_worker = wake
    runtime.closers.append(runtime.services.traffic.close)  # its last commit may wake
    runtime.closers.append(wake.close)


def build_runtime(settings: Settings, cluster: Cluster, *, with_worker: bool = True) -> Runtime:
    """`lightpath serve`: one process with API services, relay, worker and switches.

    Its parts talk over the in-process bus, or over Redis Streams when
    LIGHTPATH_REDIS_URL is set (the database is whichever is configured).
    """
    store = build_store(settings)
    bus = build_bus(settings)
    services = _api_services(settings, cluster, store, bus)
    relay = OutboxRelay(store, bus.publish, ping=bus.ping)
    services.kick_relay = relay.kick
    services.direct_sender = relay.direct_sender
    runtime = Runtime(services, relay)
    _wake_worker_after_ingest(runtime, settings, bus)
    if settings.redis_url:
        runtime.closers.append(bus.close)
    if with_worker:
        driver = build_driver(settings, cluster)
        services.southbound = driver
        runtime.closers.append(driver.close)
        metrics = WorkerMetrics(services.metrics.registry)
        metrics.is_leader.set(1)  # the one worker of this process leads for its whole life
        attach_worker(runtime, settings, cluster, store, bus, driver, metrics)
    return runtime


def build_fabric_side(
    settings: Settings,
    cluster: Cluster,
    store: Store,
    southbound: SouthboundDriver,
    metrics: WorkerMetrics,
) -> tuple[FabricDriver, SwitchController]:
    """The fabric driver (with retention) and the switch controller that feeds it.

    Built in the worker process (fabric pass on a thread) or in the fabric process.
    """
    repo = FabricRepository(store)
    config = ControllerConfig(
        reconfig_ms=cluster.reconfig_ms,
        predictor=settings.predictor,
        guard_ms=settings.rewire_guard_ms,
        turn_ms=settings.turn_ms,
    )
    fabric = FabricDriver(repo, TrafficRepository(store), cluster, config, metrics)
    fabric.retention = Retention(
        store,
        RetentionPolicy(
            decisions_s=settings.retain_decisions_s,
            reports_s=settings.retain_reports_s,
            idempotency_s=settings.idempotency_window_s,
            outbox_s=settings.retain_outbox_s,
            jobs_s=settings.retain_jobs_s,
        ),
    )
    fabric.retention_interval_s = settings.retention_interval_s
    controller = SwitchController(
        repo,
        southbound,
        cluster,
        metrics,
        on_confirmed=fabric.confirmed,
        desired_source=lambda: fabric.committed,
    )
    return fabric, controller


def attach_worker(
    runtime: Runtime,
    settings: Settings,
    cluster: Cluster,
    store: Store,
    bus: Any,
    driver: SouthboundDriver,
    metrics: WorkerMetrics,
) -> None:
    """Add the worker and the switch controller to `runtime` (the fabric pass on a thread)."""
    fabric, controller = build_fabric_side(settings, cluster, store, driver, metrics)
    worker = Worker(
        store,
        bus,
        cluster,
        settings,
        driver=fabric,
        metrics=metrics,
        on_fabric_change=controller.kick,
    )
    controller.on_failed_ports = worker.request_replan
    runtime.worker = worker
    runtime.controller = controller


def build_bus(settings: Settings) -> Any:
    """Redis Streams when LIGHTPATH_REDIS_URL is set, else the in-process bus."""
    if settings.redis_url:
        from app.bus.redis_streams import RedisStreamsBus

        return RedisStreamsBus(settings.redis_url, prefix=settings.redis_prefix)
    return InProcessBus()


def build_api_runtime(settings: Settings, cluster: Cluster) -> Runtime:
    """The `lightpath api` process: routes, outbox relay, change notices; no worker.

    Without Redis the separate worker still acts on every tick (it reads the
    database, not the messages), and waiters poll the database.
    """
    store = build_store(settings)
    bus = build_bus(settings)
    services = _api_services(settings, cluster, store, bus)
    # without Redis nobody listens: the worker's tick picks the recorded rows up
    relay = OutboxRelay(store, bus.publish, ping=bus.ping) if settings.redis_url else None
    runtime = Runtime(services, relay)
    if relay is not None:
        services.kick_relay = relay.kick
        services.direct_sender = relay.direct_sender
        _wake_worker_after_ingest(runtime, settings, bus)
    else:
        runtime.closers.append(services.traffic.close)
    runtime.closers.append(bus.close)
    # no southbound here: the worker drives the switches and its own /readyz probes
    # them; launchers submit and complete jobs through an API whose switches are down
    return runtime


def build_worker_runtime(settings: Settings, cluster: Cluster) -> Runtime:
    """The `lightpath worker` process: leader-elected worker and switch controller.

    With `settings.fabric_process` (the default) the fabric pass and the switch
    controller run in a child process (`app.worker.fabric_process`), fenced with
    the lease's token, which this process forwards; admission stays here.
    """
    from app.worker.fabric_process import FabricProcess
    from app.worker.lease import LeaderLoop, LocalLease, RedisLease

    store = build_store(settings)
    bus = build_bus(settings)
    registry = CollectorRegistry()
    services = Services(
        settings=settings,
        cluster=cluster,
        store=store,
        bus=bus,
        metrics=ApiMetrics(store, cluster, registry=registry),
        traffic=TrafficRepository(store),
        fabric=FabricRepository(store),
    )
    # the fabric process drives its own: this one answers /readyz
    driver = build_driver(settings, cluster)
    services.southbound = driver
    runtime = Runtime(services, None)
    metrics = WorkerMetrics(registry)
    attach_worker(runtime, settings, cluster, store, bus, driver, metrics)
    lease = (
        RedisLease(settings.redis_url, f"{settings.redis_prefix}:worker-leader")
        if settings.redis_url
        else LocalLease()
    )
    # every transaction of the worker and switch threads carries the lease's token
    fence = Fence(
        store.write_engine, lambda: lease.token, advance=getattr(lease, "advance_past", None)
    )
    runtime.thread_init = fence.bind_current_thread
    if runtime.controller is not None:
        runtime.controller.write_guard = fence.bound  # its OXC threads write reachability
    worker = runtime.worker
    assert worker is not None
    leader = LeaderLoop(lease, used_token=fence.stored_token)
    if settings.fabric_process:
        runtime.controller = None  # it runs in the fabric process
        worker.fabric_process = FabricProcess(
            settings,
            cluster,
            metrics,
            lease_state=lambda: lease.holding() if leader.is_leader() else None,
            advance=getattr(lease, "advance_past", None),
            on_views=worker.collectives_written,
            announce=lambda ids: bus.announce(JobsChanged(ids)),
        )
    else:
        assert runtime.controller is not None
        # every southbound command carries the lease's token; the switches refuse older ones
        runtime.controller.token = lambda: lease.token

    def elected(token: int | None) -> None:
        metrics.is_leader.set(1)
        worker.take_over(elected=True)
        if runtime.controller is not None:
            runtime.controller.reset()
            runtime.controller.kick()

    def deposed() -> None:
        metrics.is_leader.set(0)
        metrics.mlu.set(0)  # only the leader's view of the fabric is meaningful
        metrics.converged.set(0)

    leader.on_elected, leader.on_deposed = elected, deposed
    runtime.is_leader = leader.is_leader
    leader.start()
    runtime.closers.extend([leader.stop, getattr(lease, "close", lambda: None), driver.close])
    runtime.closers.append(bus.close)
    return runtime

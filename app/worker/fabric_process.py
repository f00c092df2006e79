"""The fabric pass in a process of its own (`lightpath worker`).

The fabric pass is tens of ms of CPU-bound Python at 300 running jobs. On a
thread of the worker it held the interpreter while the next arrival was being
admitted; in a child process it runs on another core. The child holds the
fabric side whole: the `FabricLoop` with its `FabricDriver` (the worker memory,
loaded once per leadership term, then updated from what each pass changes)
and the switch controller, which feeds switch confirmations into it and takes
the desired state it commits. The worker process keeps admission, the lease,
/metrics and the bus.

Parent -> child (one pipe, sent by a thread of the parent so admission never
blocks on it): pass requests (coalesced in the child by reason), replan,
reset (forget the memory), the lease (`("lease", (token, valid_until))` or
`None`), stop.

Child -> parent: the job views a pass wrote (scheduling's aggregator totals),
the jobs whose views changed (announced on the bus by the parent), metric
updates (applied to the worker's registry, so /metrics shows them and
counters survive a restart of the child), a request to advance the lease's
token past the database's.

Fencing: every write transaction of the child's threads is fenced
(`app.store.fencing`) with the token the parent last sent, and only until
`valid_until` (the lease's own local expiry, on the shared monotonic clock),
so a child whose parent stalled or died stops writing when the parent would
have, and a new leader's raised fencing row refuses a stale child's writes.

Supervision: the parent restarts a child that exits (with a back-off), and kills
and restarts one whose pass thread has not come round for `STALL_S` (stopped,
or stuck in a call that never returns: jobs placed meanwhile got no circuits
and ended jobs kept theirs for as long as it lasted). The pass thread stamps a
shared heartbeat on every round, a pass or an idle tick. The child, whose
passes are level-triggered from the database, begins from the durable state,
so nothing acknowledged is lost. The child exits when the
parent's end of the pipe closes (the parent died) or on `stop`; SIGTERM to the
worker stops it through `Runtime.stop`.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection
from typing import Any

from prometheus_client import CollectorRegistry

from app.engine.cluster import Cluster
from app.settings import Settings

from .metrics import WorkerMetrics

log = logging.getLogger("lightpath.worker")

POLL_S = 0.05  # the parent checks the lease and the child this often when idle
RESTART_BACKOFF_S = (0.5, 10.0)  # first and longest wait before a restart
STOP_S = 10.0  # a child not gone this long after `stop` is terminated
# a child ended by SIGTERM is a stop, not a crash, if `stop` follows within this: a
# signal to the whole process group (`timeout`, systemd) reaches the child first
STOP_SIGNAL_GRACE_S = 1.0
BATCH_LINGER_S = 0.002  # the child's messages wait this long for company
# a pass thread silent this long is stalled: far past the slowest pass (tens of ms at
# 300 jobs, seconds for a new term's first) and the failure back-off (5 s)
STALL_S = 30.0
# silent this long, the worker stops reporting ready (before the watchdog's kill: past a
# failed pass's back-off, and what a new term's first pass takes on a loaded machine)
NOT_READY_SILENT_S = 10.0

LeaseState = tuple[int, float] | None  # (fencing token, valid until on time.monotonic())


class LeaseView:
    """The child's view of the parent's lease: the token, until its local expiry."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state: LeaseState = None

    def update(self, state: LeaseState) -> bool:
        """Take the parent's state; True when a leadership term begins (a reset is due)."""
        with self._lock:
            before, self._state = self._state, state
        return state is not None and (before is None or before[0] != state[0])

    @property
    def token(self) -> int | None:
        with self._lock:
            state = self._state
        if state is None or time.monotonic() >= state[1]:
            return None
        return state[0]

    def held(self) -> bool:
        return self.token is not None


class _Forward:
    """A metric of the child: each update is sent to the parent, which owns the registry."""

    def __init__(self, send: Callable[[Any], None], name: str, labels: tuple[str, ...] = ()):
        self._send, self._name, self._labels = send, name, labels

    def labels(self, *values: str) -> _Forward:
        return _Forward(self._send, self._name, tuple(values))

    def inc(self, amount: float = 1.0) -> None:
        if amount:
            self._send(("metric", self._name, self._labels, "inc", amount))

    def observe(self, amount: float) -> None:
        self._send(("metric", self._name, self._labels, "observe", amount))

    def set(self, value: float) -> None:
        self._send(("metric", self._name, self._labels, "set", value))


class ForwardedMetrics(WorkerMetrics):
    """`WorkerMetrics` whose every metric forwards its updates (the child's metrics)."""

    def __init__(self, send: Callable[[Any], None]) -> None:  # no registry of its own
        for name in vars(WorkerMetrics(CollectorRegistry())):
            if name != "registry":
                setattr(self, name, _Forward(send, name))


def apply_metric(metrics: WorkerMetrics, message: tuple[Any, ...]) -> None:
    """Apply a child's `("metric", name, labels, op, value)` to the worker's registry."""
    _, name, labels, op, value = message
    metric = getattr(metrics, name, None)
    if metric is None or name == "registry" or op not in ("inc", "observe", "set"):
        return
    if labels:
        metric = metric.labels(*labels)
    getattr(metric, op)(value)


# --- the child -------------------------------------------------------------------


class _Batcher:
    """The child's messages to the parent, sent in batches: what one pass reports (metrics,
    views, changed jobs) wakes the parent once, not once per message."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._lock = threading.Lock()
        self._items: list[Any] = []
        self._due = threading.Event()
        self._closed = False
        self.thread = threading.Thread(target=self._run, name="fabric-outbox", daemon=True)

    def put(self, message: Any) -> None:
        with self._lock:
            self._items.append(message)
        self._due.set()

    def close(self) -> None:
        self._closed = True
        self._due.set()
        self.thread.join(timeout=STOP_S)

    def _run(self) -> None:
        while not self._closed:
            self._due.wait()
            time.sleep(BATCH_LINGER_S)  # what the same pass sends next joins this batch
            self._due.clear()
            with self._lock:
                items, self._items = self._items, []
            if items:
                try:
                    self._conn.send(("batch", items))
                except (OSError, ValueError):
                    return  # the parent is gone: the control loop ends on EOF


def run_child(conn: Connection, settings: Settings, cluster: Cluster, alive: Any = None) -> None:
    """The fabric process: the fabric loop and the switch controller, fenced.

    `alive`: a shared double the pass thread sets to `time.monotonic()` on every
    round (the parent's stall watchdog reads it)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's ^C: the parent stops us
    from app.engine.circuits import load_solver
    from app.logs import configure_logging
    from app.store.fencing import Fence
    from app.wiring import build_driver, build_fabric_side, build_store

    from .fabric_loop import FabricLoop
    from .gc_policy import collect_if_due, defer_collections

    configure_logging(settings.log_level)
    if settings.fabric_nice:
        os.nice(settings.fabric_nice)
    outbox = _Batcher(conn)
    send = outbox.put

    lease = LeaseView()
    store = build_store(settings)
    southbound = build_driver(settings, cluster)
    metrics = ForwardedMetrics(send)
    driver, controller = build_fabric_side(settings, cluster, store, southbound, metrics)
    fence = Fence(
        store.write_engine, lambda: lease.token, advance=lambda floor: send(("advance", floor))
    )
    controller.token = lambda: lease.token
    loop = FabricLoop(
        driver,
        metrics,
        tick_s=settings.worker_tick_s,
        announce=lambda ids: send(("changed", ids)),
        on_fabric_change=controller.kick,
    )
    driver.on_views = lambda views: send(("views", dict(views)))
    # garbage collections between passes, not inside one (see `gc_policy`)
    defer_collections()
    loop.after_pass = lambda idle: collect_if_due(idle=idle)
    if alive is not None:
        loop.on_round = lambda: setattr(alive, "value", time.monotonic())
    controller.on_failed_ports = loop.request_replan
    controller.write_guard = fence.bound  # its OXC threads write reachability
    stop = threading.Event()

    def fenced(target: Callable[[threading.Event, Callable[[], bool]], None]) -> Callable[[], None]:
        def run() -> None:
            fence.bind_current_thread()
            target(stop, lease.held)

        return run

    threads = [
        threading.Thread(target=fenced(loop.run), name="fabric-pass", daemon=True),
        threading.Thread(target=fenced(controller.run), name="switch-controller", daemon=True),
    ]
    # numpy/scipy (~0.5 s of CPU) before the first pass needs them, not in its way
    threading.Thread(target=load_solver, name="solver-import", daemon=True).start()
    for thread in [*threads, outbox.thread]:
        thread.start()
    send(("ready", os.getpid()))
    try:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                log.warning("fabric process: the worker is gone; stopping")
                break
            kind = message[0]
            if kind == "stop":
                break
            if kind == "fabric":
                loop.request(message[1])
            elif kind == "replan":
                loop.request_replan()
            elif kind == "reset":
                loop.reset()
            elif kind == "lease" and lease.update(message[1]):
                # a new leadership term: start from the durable state, read every switch
                loop.reset()
                controller.reset()
                controller.kick()
    finally:
        stop.set()
        loop.wake()
        controller.kick()
        for thread in threads:
            thread.join(timeout=STOP_S)
        outbox.close()
        fence.close()
        southbound.close()
        store.dispose()
        conn.close()


# --- the parent ------------------------------------------------------------------


class FabricProcess:
    """Runs the fabric side in a child process and supervises it (the worker's side)."""

    def __init__(
        self,
        settings: Settings,
        cluster: Cluster,
        metrics: WorkerMetrics,
        *,
        lease_state: Callable[[], LeaseState],
        advance: Callable[[int], object] | None = None,
        on_views: Callable[[Mapping[str, dict[str, Any]]], None] = lambda views: None,
        announce: Callable[[tuple[str, ...]], None] = lambda ids: None,
        stall_s: float = STALL_S,
    ) -> None:
        self.settings = settings
        self.stall_s = stall_s
        self.cluster = cluster
        self.metrics = metrics
        self.lease_state = lease_state
        self.advance = advance
        self.on_views = on_views
        self.announce = announce
        self.restarts = 0
        self.pid: int | None = None
        self.ready = threading.Event()  # the current child has started its loops
        self._ctx = multiprocessing.get_context("spawn")  # no fork of a threaded process
        self._proc: Any = None
        self._conn: Connection | None = None
        self._alive: Any = None  # the current child's heartbeat (see `run_child`)
        self._outbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._conn_lock = threading.Lock()

    # called from any thread of the worker: never blocks on the child
    def request(self, reason: str) -> None:
        self._outbox.put(("fabric", reason))

    def request_replan(self) -> None:
        self._outbox.put(("replan",))

    def reset(self) -> None:
        self._outbox.put(("reset",))

    def run(self, stop: threading.Event) -> None:
        """Start the child, relay its messages, restart it when it exits; until `stop`."""
        sender = threading.Thread(
            target=self._send_loop, args=(stop,), name="fabric-process-send", daemon=True
        )
        self._start()
        sender.start()
        backoff_s = RESTART_BACKOFF_S[0]
        try:
            while not stop.is_set():
                conn, proc = self._conn, self._proc
                assert conn is not None and proc is not None
                try:
                    if conn.poll(POLL_S):
                        self._receive(conn.recv())
                        if self.ready.is_set():
                            backoff_s = RESTART_BACKOFF_S[0]
                    elif not proc.is_alive():
                        raise EOFError
                    elif (silent_s := self._silent_s()) > self.stall_s:
                        log.error(
                            "fabric process stalled; killing it",
                            extra={"pid": proc.pid, "silent_s": round(silent_s, 1)},
                        )
                        proc.kill()  # a stopped process dies of SIGKILL too
                        raise EOFError
                    continue
                except (EOFError, OSError):
                    pass
                # the child is gone: not ready until its successor says so (a caller seeing
                # `restarts` go up with `ready` still set took the dead child for the new one)
                self.ready.clear()
                if stop.is_set():
                    break
                proc.join(timeout=1)
                if proc.exitcode == -signal.SIGTERM and stop.wait(STOP_SIGNAL_GRACE_S):
                    break
                log.error(
                    "fabric process exited; restarting it",
                    extra={"pid": proc.pid, "exitcode": proc.exitcode, "after_s": backoff_s},
                )
                self._close()
                stop.wait(backoff_s)
                backoff_s = min(backoff_s * 2, RESTART_BACKOFF_S[1])
                if not stop.is_set():
                    self.restarts += 1
                    self._start()
                    self.request("reconcile")
        finally:
            self._outbox.put(None)
            sender.join(timeout=STOP_S)
            self._stop_child()

    def health(self) -> str | None:
        """Why the fabric planner cannot act now (None: it can), for `/readyz`: the
        child starting, or restarting after an exit, or silent for `NOT_READY_SILENT_S`
        (at most half of `stall_s`, when the watchdog kills it)."""
        if not self.ready.is_set():
            return "restarting after an exit" if self.restarts else "starting"
        silent_s = self._silent_s()
        if silent_s > min(NOT_READY_SILENT_S, self.stall_s / 2):
            return (
                f"stalled: no pass round for {silent_s:.0f} s (restarted at {self.stall_s:.0f} s)"
            )
        return None

    def _silent_s(self) -> float:
        """Seconds since the started child's pass thread last came round (0 before its
        first round: starting takes what imports take)."""
        if not self.ready.is_set() or self._alive is None:
            return 0.0
        return time.monotonic() - float(self._alive.value)

    def _start(self) -> None:
        ours, theirs = self._ctx.Pipe()
        self._alive = self._ctx.Value("d", time.monotonic(), lock=False)
        proc = self._ctx.Process(
            target=run_child,
            args=(theirs, self.settings, self.cluster, self._alive),
            name="lightpath-fabric",
            daemon=True,  # ended with the worker even if `stop` is never called
        )
        self.ready.clear()
        proc.start()
        theirs.close()
        with self._conn_lock:
            self._conn, self._proc = ours, proc
        self.pid = proc.pid
        self._outbox.put(("lease?",))  # the sender sends the lease to the new child first
        log.info("fabric process started", extra={"pid": proc.pid})

    def _close(self) -> None:
        with self._conn_lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _send(self, message: Any) -> bool:
        with self._conn_lock:
            conn = self._conn
        if conn is None:
            return False
        try:
            conn.send(message)
            return True
        except (OSError, ValueError):
            return False  # the child is gone: the supervisor restarts it

    def _send_loop(self, stop: threading.Event) -> None:
        """Pass requests, resets and the lease to the child (this thread may block, admission
        never does)."""
        sent: Any = object()  # the lease state the child has
        while True:
            try:
                message = self._outbox.get(timeout=POLL_S)
            except queue.Empty:
                message = ()
            if message is None:
                return
            if message == ("lease?",):
                sent, message = object(), ()
            state = self.lease_state()
            if state != sent and self._send(("lease", state)):
                sent = state
            if message:
                self._send(message)

    def _receive(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "batch":
            for item in message[1]:
                self._receive(item)
        elif kind == "metric":
            apply_metric(self.metrics, message)
        elif kind == "views":
            self.on_views(message[1])
        elif kind == "changed":
            self.announce(message[1])
        elif kind == "advance" and self.advance is not None:
            self.advance(message[1])
        elif kind == "ready":
            # silence counts from now, not from the spawn: a child whose imports took
            # longer than `stall_s` (a loaded machine) was killed as stalled on arrival
            if self._alive is not None:
                self._alive.value = time.monotonic()
            self.ready.set()

    def _stop_child(self) -> None:
        proc = self._proc
        self._send(("stop",))
        if proc is not None:
            proc.join(timeout=STOP_S)
            if proc.is_alive():
                log.warning("fabric process did not stop; terminating it", extra={"pid": proc.pid})
                proc.terminate()
                proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        self._close()

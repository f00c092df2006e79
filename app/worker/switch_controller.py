"""The southbound controller: converge the switches to the desired cross-connects.

A level-triggered loop in its own thread (so a slow or unreachable switch never
stalls scheduling): each pass takes the desired state the worker last committed
(in this process; else it reads the database) and what the switches hold,
applies the difference with retries, and records what they confirmed: only the
ports whose read-back changed are written, and failed ports come from that
memory of the confirmed table (read once by a new leader). It runs after every fabric change,
when a pass asks to be requeued, and at least every `resync_s` to notice drift
such as a failed port. Only the leader runs it.

Fenced (`token`, the lease's fencing token source): every command of a pass
carries the token the pass started with, and before each exchange the pass
checks the lease still holds that token. A leader deposed mid-pass (stalled
past its lease, or a switch that already saw its successor's token) sends
nothing more: the pass ends fenced, writes nothing, and the controller forgets
its memory of the switches. A new leader's first pass reads every switch with
its token, which fences the old leader out of each switch.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace

from app.engine.cluster import Cluster
from app.engine.cross_connects import CrossConnect
from app.logs import log_pass_failure
from app.southbound import SouthboundDriver
from app.southbound.reconcile import ReconcileResult, RetryPolicy, reconcile
from app.store.fabric_repository import ConfirmedOxc, FabricRepository
from app.store.fencing import Fenced

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
        desired_source: Callable[[], Sequence[CrossConnect] | None] | None = None,
        token: Callable[[], int | None] | None = None,
    ) -> None:
        self.repo = repo
        self.driver = driver
        self.cluster = cluster
        self.metrics = metrics
        self.resync_s = resync_s
        self.on_failed_ports = on_failed_ports
        self.on_confirmed = on_confirmed
        # the desired state as last committed by the worker (same process); None: read it
        self.desired_source = desired_source
        # the lease's fencing token now (None: not held); None here: unfenced (embedded)
        self.token = token
        self._full_next = True  # a new leader's first pass reads (and fences) every switch
        # what the confirmed-ports table holds (None: unknown, loaded on the next pass)
        self._saved: dict[str, ConfirmedOxc] | None = None
        # per OXC, the desired cross-connects it was last read holding exactly; a kicked
        # pass reads and converges only the OXCs whose desired state differs from this
        self._settled: dict[str, frozenset[tuple[int, int, str]]] = {}
        self._held: dict[str, frozenset[tuple[str, int, int]]] = {}
        self.policy = RetryPolicy()
        self._kick = threading.Event()
        self._lock = threading.Lock()
        self.passes = 0
        self._unreachable: frozenset[str] | None = None  # as last written (None: unknown)
        self._reachability_lock = threading.Lock()  # the pass's OXC threads write it too
        # fences a write from a thread the caller did not bind (`Fence.bound`)
        self.write_guard: Callable[[], AbstractContextManager[None]] = nullcontext
        self.last: ReconcileResult | None = None

    def kick(self) -> None:
        self._kick.set()

    def run_once(self, *, full: bool = True) -> ReconcileResult:
        """One pass; serialised so two callers never reconcile at once.

        `full=False` (a pass kicked by a new desired state) reads and converges
        only the OXCs whose desired cross-connects changed since they were last
        seen converged; the periodic resync (`full`) reads every OXC, so drift
        such as a failed port is still noticed within `resync_s`.
        """
        with self._lock:
            token = self.token() if self.token is not None else None
            source = self.token

            def holds() -> bool:
                return source is None or (token is not None and source() == token)

            try:
                saved = self._saved if self._saved is not None else self.repo.load_confirmed()
                before = _failed(saved)
                desired = self._desired()
                if not full:
                    desired = {
                        o: d for o, d in desired.items() if self._settled.get(o) != frozenset(d)
                    }
                result = reconcile(
                    self.driver,
                    desired,
                    policy=self.policy,
                    token=token,
                    holds=holds,
                    unreadable=self._unreadable,
                    known_down=self._unreachable or (),
                )
                if result.fenced:
                    return self._deposed(result)
                for o, d in desired.items():
                    c = result.confirmed.get(o)
                    if c is not None and _pairs(c.cross_connects) == _pairs(
                        (a, b) for a, b, _ in d
                    ):
                        self._settled[o] = frozenset(d)
                    else:
                        self._settled.pop(o, None)
                changed = [
                    ConfirmedOxc(o, c.cross_connects, c.failed_ports)
                    for o, c in result.confirmed.items()
                    if saved.get(o, ConfirmedOxc(o, frozenset(), frozenset()))
                    != ConfirmedOxc(o, c.cross_connects, c.failed_ports)
                ]
                if full:
                    # a switch the cluster no longer has (restarted on another cluster
                    # file) is not ours to read or drive: its last read is forgotten
                    # (it stayed in the table, and `/v1/topology` answered 500)
                    ours = {o.id for o in self.cluster.oxcs}
                    changed += [
                        ConfirmedOxc(o, frozenset(), frozenset())
                        for o, c in saved.items()
                        if o not in ours and (c.cross_connects or c.failed_ports)
                    ]
                if changed:  # only the switches whose read-back changed, only their ports
                    self.repo.save_confirmed(changed, previous=saved)
                self._saved = {**saved, **{c.oxc_id: c for c in changed}}
                # switches this pass could not read: their rows are a last read, shown stale
                # (a kicked pass tries only some: the others keep what was known of them)
                tried = {o.id for o in self.cluster.oxcs} if full else set(desired)
                unreachable = frozenset(
                    {o for o in self._unreachable or () if o not in tried}
                    | {o for o in tried if o not in result.confirmed}
                )
                with self._reachability_lock:
                    if unreachable != self._unreachable:  # written only when it changes
                        self.repo.save_reachability(unreachable)
                        self._unreachable = unreachable
            except Exception:
                self._saved = None  # unknown after a failed write: read the table next time
                self._settled.clear()
                raise
            after = _failed(self._saved)
            self.passes += 1
            self.last = result
        if self.on_confirmed is not None:
            # what every OXC holds now (the last read of each), timed by the caller's
            # clock: hits are scored on it. A switch that cannot be read confirms
            # nothing: its last read would count phases as hits while it is dead, and
            # through its restart empty
            with self._reachability_lock:
                for o, c in result.confirmed.items():
                    self._held[o] = frozenset((o, a, b) for a, b in c.cross_connects)
                for o in self._unreachable or ():
                    self._held.pop(o, None)
                held = frozenset().union(*self._held.values())
            self.on_confirmed(held)
        self.metrics.reconfigurations.inc(len(result.applied))
        for err in result.errors:
            self.metrics.reconcile_errors.labels(err.code).inc()
        self.metrics.converged.set(1 if result.converged else 0)
        if (after != before or result.needs_replan) and self.on_failed_ports is not None:
            self.on_failed_ports()  # the planner moves circuits off failed ports
        return result

    def _unreadable(self, oxc_id: str) -> None:
        """A switch whose first read of the pass failed is shown stale at once (a hung one
        kept its row fresh for the ~36 s its retries took); the pass's end settles it.

        Called from the pass's OXC threads: the write is fenced there too (`write_guard`),
        so a deposed leader's pass, whose reads fail for it, marks nothing stale."""
        with self._reachability_lock:
            unreachable = (self._unreachable or frozenset()) | {oxc_id}
            if unreachable != self._unreachable:
                try:
                    with self.write_guard():
                        self.repo.save_reachability(unreachable)
                except Fenced:
                    return  # no longer the leader: the pass ends fenced, nothing written
                self._unreachable = unreachable
            # nor does it confirm anything from now: a hung switch's retries hold the pass
            # for ~33 s, through which its last read scored every phase as served
            dropped = self._held.pop(oxc_id, None) is not None
            held = frozenset().union(*self._held.values())
        if dropped and self.on_confirmed is not None:
            self.on_confirmed(held)

    def reset(self) -> None:
        """Forget what the confirmed table holds (a new leader reads it once)."""
        with self._lock:
            self._forget()

    def _forget(self) -> None:
        self._saved = None
        self._unreachable = None
        self._settled.clear()
        self._held.clear()
        self._full_next = True

    def _deposed(self, result: ReconcileResult) -> ReconcileResult:
        """A pass that found us deposed: nothing is written, memory is dropped."""
        log.warning(
            "switch pass fenced: the lease is gone or a switch saw a newer leader",
            extra={"applied": len(result.applied)},
        )
        self._forget()
        self.last = result
        for err in result.errors:
            self.metrics.reconcile_errors.labels(err.code).inc()
        return replace(result, requeue_after_s=None)

    def _desired(self) -> dict[str, set[tuple[int, int, str]]]:
        """Every OXC's desired cross-connects: the worker's last commit, else the table."""
        committed = self.desired_source() if self.desired_source is not None else None
        if committed is None:
            return self.repo.desired_by_oxc(o.id for o in self.cluster.oxcs)
        desired: dict[str, set[tuple[int, int, str]]] = {o.id: set() for o in self.cluster.oxcs}
        for cc in committed:
            desired.setdefault(cc.oxc_id, set()).add((cc.port_a, cc.port_b, cc.job_id))
        return desired

    def run(self, stop: threading.Event, is_leader: Callable[[], bool] = lambda: True) -> None:
        wait_s = 0.0
        last_full = 0.0
        while not stop.is_set():
            kicked = self._kick.wait(wait_s)
            self._kick.clear()
            if stop.is_set():
                break
            if not is_leader():
                wait_s = self.resync_s
                continue
            try:
                # a kick after a new desired state touches the changed OXCs only
                full = (
                    not kicked or self._full_next or time.monotonic() - last_full >= self.resync_s
                )
                self._full_next = False
                result = self.run_once(full=full)
                if full:
                    last_full = time.monotonic()
                wait_s = result.requeue_after_s if result.requeue_after_s else self.resync_s
            except Exception as exc:
                log_pass_failure(log, "reconciliation pass", exc)
                wait_s = min(self.resync_s, 1.0)


def _pairs(pairs: Iterable[tuple[int, int]]) -> set[tuple[int, int]]:
    return {(min(a, b), max(a, b)) for a, b in pairs}


def _failed(confirmed: dict[str, ConfirmedOxc]) -> dict[str, frozenset[int]]:
    return {o: c.failed_ports for o, c in confirmed.items() if c.failed_ports}

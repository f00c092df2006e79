"""Level-triggered reconciliation of OXC cross-connects, in the controller-runtime shape.

The caller names what to reconcile (desired cross-connects per OXC, from the
decision log), not what happened. One pass, per OXC:

1. read the confirmed state from the switch;
2. diff it against the desired state (`diff_cross_connects`, a pure function):
   disconnect every cross-connect that is not desired or that touches a failed
   port, connect every desired pair that is missing; desired pairs that touch a
   failed port are not connected but returned as `blocked`, so the caller can
   re-plan them onto healthy ports;
3. send the whole change as one bulk command, disconnects before connects, so
   a port is freed before it is reused and is never in two cross-connects;
4. read again: the OXC has converged when the diff is empty.

Transient errors (unreachable, timeout, injected fault) and refusals caused by
a stale read are retried with exponential back-off and full jitter
(delay = uniform(0, min(max_delay_s, base_delay_s * 2**n))). A retry of an
unchanged command reuses its request_id, so a command whose acknowledgement was
lost is not applied twice. Errors that no retry can fix (an unknown OXC, an
unreadable answer, a desired state that books one port twice) stop that OXC
and are reported as terminal.

Fenced: with a `token` (the leader lease's fencing token) every read and
apply carries it, and the switch refuses it once a newer leader has spoken
(`StaleToken`); with `holds`, each OXC checks before every exchange that the
caller still holds that token (its lease has not lapsed by local time) and
stops otherwise. Either way the OXC's outcome is a non-retryable error and
`ReconcileResult.fenced` is true: a deposed leader sends nothing more in the
pass it wakes up in.

Safe to run twice: a second pass over the same desired state reads, finds
nothing to change and sends nothing. Not safe to run concurrently against the
same switches: two reconcilers with different desired states would undo each
other's work (the switch still refuses any double-booking, so the fabric stays
valid, but it flaps). Only the holder of the worker's leader lease runs
`reconcile`, and it runs one pass at a time; within a pass each OXC is handled
by exactly one thread.

Must not import FastAPI, SQLAlchemy or Redis; it sees switches only through
`SouthboundDriver`.
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from .driver import SouthboundDriver
from .errors import CommandRefused, RequestIdReused, SouthboundError, StaleToken
from .state import ConfirmedState, PortPair, normalize_pair

log = logging.getLogger("lightpath.southbound")

DesiredCrossConnect = tuple[int, int, str]  # (port a, port b, job_id)

BLOCKED_PORT_FAILED = "port-failed"
INVALID_DESIRED = "invalid-desired"
FENCED = "fenced"  # the caller's lease lapsed: nothing more is sent
_FENCED_CODES = (FENCED, "stale-token")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How hard one pass tries before handing back `requeue_after_s`."""

    max_attempts: int = 6  # failed exchanges per OXC per pass
    base_delay_s: float = 0.02
    max_delay_s: float = 1.0
    requeue_after_s: float = 1.0  # when a pass ends with a retryable error

    def backoff_s(self, failures: int, rng: random.Random) -> float:
        """Full-jitter exponential back-off after `failures` (>= 1) failed exchanges."""
        ceiling = min(self.max_delay_s, self.base_delay_s * 2 ** (failures - 1))
        return rng.uniform(0.0, ceiling)


@dataclass(frozen=True, slots=True)
class CrossConnectDiff:
    """The bulk command that takes one OXC from confirmed to desired."""

    disconnect: tuple[PortPair, ...]
    connect: tuple[PortPair, ...]
    blocked: tuple[DesiredCrossConnect, ...]  # desired, but a port has failed

    @property
    def is_empty(self) -> bool:
        return not self.disconnect and not self.connect


@dataclass(frozen=True, slots=True)
class OxcChange:
    """One bulk command the switch acknowledged."""

    oxc_id: str
    connect: tuple[PortPair, ...]
    disconnect: tuple[PortPair, ...]
    request_id: str


@dataclass(frozen=True, slots=True)
class BlockedCrossConnect:
    """A desired cross-connect that cannot be made as asked; the caller must re-plan it."""

    oxc_id: str
    a: int
    b: int
    job_id: str
    reason: str  # BLOCKED_PORT_FAILED


@dataclass(frozen=True, slots=True)
class ReconcileError:
    """Why an OXC did not converge in this pass."""

    oxc_id: str
    code: str  # a SouthboundError code, or INVALID_DESIRED
    detail: str
    is_retryable: bool  # a later pass may succeed without a new desired state


@dataclass(frozen=True, slots=True)
class ReconcileResult:
    """The outcome of one pass over every OXC named in the desired state."""

    converged: bool  # every OXC holds exactly its desired cross-connects
    applied: tuple[OxcChange, ...]
    blocked: tuple[BlockedCrossConnect, ...]
    errors: tuple[ReconcileError, ...]
    requeue_after_s: float | None  # run again after this long; None: wait for new desired state
    confirmed: Mapping[str, ConfirmedState] = field(default_factory=dict)  # last read per OXC
    failed_exchanges: int = 0  # transient failures retried within the pass

    @property
    def fenced(self) -> bool:
        """The caller was deposed during the pass (lease lapsed, or a switch saw a newer token)."""
        return any(e.code in _FENCED_CODES for e in self.errors)

    @property
    def needs_replan(self) -> bool:
        """Some desired cross-connects touch failed ports: the engine must move them."""
        return bool(self.blocked)


def diff_cross_connects(
    desired: Iterable[DesiredCrossConnect], confirmed: ConfirmedState
) -> CrossConnectDiff:
    """The changes that make `confirmed` hold `desired` (minus pairs on failed ports).

    Raises ValueError when `desired` is not a valid set of cross-connects for
    this switch (a port out of range, joined to itself, or in two pairs): that
    is a bug upstream, not something to apply.
    """
    wanted: dict[PortPair, str] = {}
    owner: dict[int, PortPair] = {}
    for a, b, job_id in desired:
        pair = normalize_pair(a, b)
        if a == b or not (0 <= pair[0] and pair[1] < confirmed.ports):
            raise ValueError(
                f"{confirmed.oxc_id}: desired pair {pair} is not a valid cross-connect"
            )
        if pair in wanted:
            if wanted[pair] != job_id:
                raise ValueError(f"{confirmed.oxc_id}: pair {pair} desired by two jobs")
            continue
        for port in pair:
            if port in owner:
                raise ValueError(
                    f"{confirmed.oxc_id}: port {port} desired in {owner[port]} and {pair}"
                )
            owner[port] = pair
        wanted[pair] = job_id
    failed = confirmed.failed_ports
    blocked = tuple(
        (a, b, job_id) for (a, b), job_id in sorted(wanted.items()) if a in failed or b in failed
    )
    healthy = {pair for pair in wanted if pair[0] not in failed and pair[1] not in failed}
    # `healthy` is a matching, and what stays connected plus what gets connected
    # is exactly `healthy`, so no port ends up in two cross-connects.
    disconnect = tuple(sorted(confirmed.cross_connects - healthy))
    connect = tuple(sorted(healthy - confirmed.cross_connects))
    return CrossConnectDiff(disconnect, connect, blocked)


def reconcile(
    driver: SouthboundDriver,
    desired: Mapping[str, Collection[DesiredCrossConnect]],
    *,
    policy: RetryPolicy | None = None,
    rng: random.Random | None = None,
    sleep: Callable[[float], None] = time.sleep,
    request_id_prefix: str = "reconcile",
    max_parallel_oxcs: int = 8,
    decision_seq: int | None = None,
    token: int | None = None,
    holds: Callable[[], bool] | None = None,
    unreadable: Callable[[str], None] | None = None,
    known_down: Collection[str] = (),
) -> ReconcileResult:
    """One level-triggered pass: converge every OXC in `desired` to its cross-connects.

    An OXC absent from `desired` is left alone; pass an empty collection to
    clear one. Never raises a SouthboundError: failures are in the result.
    `decision_seq` (the last decision the desired state includes) only labels
    log lines. OXCs are handled in parallel (up to `max_parallel_oxcs`
    threads), so the driver must be thread-safe (both drivers here are).
    `token` goes with every command; `holds()` is asked before each exchange
    (see the module's "Fenced"). `unreadable(oxc_id)` is called, from the OXC's
    thread, the first time its read fails in this pass: a hung switch holds its
    thread for all the retries, and the caller need not wait for them to say so.
    `known_down`: OXCs the caller already shows unreachable; giving up on one of them
    again is logged at debug (a switch outage logged a warning every pass, ~4 a second).
    """
    policy = policy or RetryPolicy()
    rng = rng or random.Random()
    pass_id = uuid.uuid4().hex[:12]
    jobs = [
        (oxc_id, tuple(pairs), random.Random(rng.random()))
        for oxc_id, pairs in sorted(desired.items())
    ]

    def run(job: tuple[str, tuple[DesiredCrossConnect, ...], random.Random]) -> _OxcOutcome:
        oxc_id, pairs, oxc_rng = job
        return _reconcile_oxc(
            driver,
            oxc_id,
            pairs,
            policy,
            oxc_rng,
            sleep,
            f"{request_id_prefix}-{pass_id}",
            {"oxc_id": oxc_id, "decision_seq": decision_seq, "pass_id": pass_id},
            _Fencing(token, holds),
            unreadable,
            oxc_id in known_down,
        )

    if len(jobs) <= 1 or max_parallel_oxcs <= 1:
        outcomes = [run(job) for job in jobs]
    else:
        with ThreadPoolExecutor(max_workers=min(max_parallel_oxcs, len(jobs))) as pool:
            outcomes = list(pool.map(run, jobs))

    errors = tuple(o.error for o in outcomes if o.error is not None)
    blocked = tuple(b for o in outcomes for b in o.blocked)
    retryable = any(e.is_retryable for e in errors)
    return ReconcileResult(
        converged=all(o.converged for o in outcomes) and not blocked,
        applied=tuple(c for o in outcomes for c in o.applied),
        blocked=blocked,
        errors=errors,
        requeue_after_s=policy.requeue_after_s if retryable else None,
        confirmed={o.oxc_id: o.confirmed for o in outcomes if o.confirmed is not None},
        failed_exchanges=sum(o.failed_exchanges for o in outcomes),
    )


@dataclass(frozen=True, slots=True)
class _Fencing:
    token: int | None
    holds: Callable[[], bool] | None

    def lapsed(self) -> bool:
        return self.holds is not None and not self.holds()


@dataclass(slots=True)
class _OxcOutcome:
    oxc_id: str
    converged: bool = False
    applied: list[OxcChange] = field(default_factory=list)
    blocked: tuple[BlockedCrossConnect, ...] = ()
    error: ReconcileError | None = None
    confirmed: ConfirmedState | None = None
    failed_exchanges: int = 0


def _is_retryable(exc: SouthboundError) -> bool:
    """Transient errors, and refusals that a fresh read may explain (state moved under us)."""
    if exc.is_transient:
        return True
    return isinstance(exc, CommandRefused) and not isinstance(exc, RequestIdReused)


def _reconcile_oxc(
    driver: SouthboundDriver,
    oxc_id: str,
    desired: tuple[DesiredCrossConnect, ...],
    policy: RetryPolicy,
    rng: random.Random,
    sleep: Callable[[float], None],
    request_id_base: str,
    log_fields: dict[str, object],
    fencing: _Fencing,
    unreadable: Callable[[str], None] | None = None,
    known_down: bool = False,
) -> _OxcOutcome:
    outcome = _OxcOutcome(oxc_id)
    last_command: tuple[tuple[PortPair, ...], tuple[PortPair, ...]] | None = None
    request_id = ""
    commands_sent = 0
    # Each round reads and possibly applies; successful applies are bounded too,
    # so a switch whose state keeps moving under us cannot hold the pass forever.
    for _round in range(2 * policy.max_attempts + 2):
        if fencing.lapsed():
            outcome.error = ReconcileError(
                oxc_id, FENCED, "the leader lease lapsed: nothing more sent", False
            )
            log.warning("oxc reconcile stopped: lease lapsed", extra=log_fields)
            return outcome
        try:
            confirmed = driver.read(oxc_id, token=fencing.token)
            outcome.confirmed = confirmed
            try:
                diff = diff_cross_connects(desired, confirmed)
            except ValueError as exc:
                outcome.error = ReconcileError(oxc_id, INVALID_DESIRED, str(exc), False)
                return outcome
            outcome.blocked = tuple(
                BlockedCrossConnect(oxc_id, a, b, job_id, BLOCKED_PORT_FAILED)
                for a, b, job_id in diff.blocked
            )
            if diff.is_empty:
                outcome.converged = not diff.blocked
                return outcome
            command = (diff.disconnect, diff.connect)
            if command != last_command:
                # A new id only for a new command: retrying an unchanged one by
                # the same id is what makes a lost acknowledgement harmless.
                commands_sent += 1
                request_id = f"{request_id_base}-{oxc_id}-{commands_sent}"
                last_command = command
            if fencing.lapsed():  # checked again right before the change goes out
                continue
            driver.apply(
                oxc_id,
                list(diff.connect),
                list(diff.disconnect),
                request_id,
                token=fencing.token,
            )
            outcome.applied.append(OxcChange(oxc_id, diff.connect, diff.disconnect, request_id))
            log.info(
                "cross-connects changed",
                extra={
                    **log_fields,
                    "request_id": request_id,
                    "connect": [list(p) for p in diff.connect],
                    "disconnect": [list(p) for p in diff.disconnect],
                    "blocked": len(diff.blocked),
                },
            )
        except SouthboundError as exc:
            if (
                outcome.confirmed is None
                and outcome.failed_exchanges == 0
                and unreadable
                and not isinstance(exc, StaleToken)  # it answered: we are the stale one
            ):
                unreadable(oxc_id)  # its first read failed: no need to wait out the retries
            error = ReconcileError(oxc_id, exc.code, exc.detail, _is_retryable(exc))
            if not error.is_retryable:
                outcome.error = error
                log.error("oxc reconcile failed", extra={**log_fields, "code": exc.code})
                return outcome
            outcome.failed_exchanges += 1
            if outcome.failed_exchanges >= policy.max_attempts:
                outcome.error = error
                log.log(
                    logging.DEBUG if known_down else logging.WARNING,
                    "oxc reconcile gave up",
                    extra={**log_fields, "code": exc.code},
                )
                return outcome
            delay_s = policy.backoff_s(outcome.failed_exchanges, rng)
            log.debug("oxc retry", extra={**log_fields, "code": exc.code, "delay_s": delay_s})
            sleep(delay_s)
    outcome.error = ReconcileError(
        oxc_id, "not-converged", "the switch state kept changing during the pass", True
    )
    log.warning("oxc reconcile did not settle", extra=log_fields)
    return outcome

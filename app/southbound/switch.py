"""An in-memory optical circuit switch (OCS) of the Polatis / Calient kind.

The model keeps the rules a real MEMS or beam-steering switch enforces:

- `ports` ports numbered 0..ports-1. A cross-connect joins two ports and is full
  duplex, so it is an unordered pair; a port is in at most one cross-connect.
- A bulk command carries disconnects and connects. It is validated as a whole
  against the switch's state (including changes still settling), the
  disconnects are applied before the connects, and it is applied all or
  nothing: one bad pair refuses the whole command and changes nothing.
- A command takes effect after the reconfiguration latency `reconfig_ms`: until
  then `read()` shows the old cross-connects (a circuit being changed carries no
  traffic). Commands are executed one after another, like a switch controller
  moving one set of mirrors at a time, and `apply()` returns once its change
  is visible (the switch acknowledges a completed command).
- A port can be marked failed (loss of light on its fibre). A cross-connect on
  a failed port stays set but carries nothing; connecting a failed port is
  refused.
- `fault_rate` is the probability that a command (apply or read) fails: half
  of the faults are refused before anything happens (`SwitchFault`), half lose
  the acknowledgement after the command ran (`SwitchTimeout`: the caller cannot
  tell whether it was applied and must retry by request_id). Faults come from
  a RNG seeded by (seed, oxc id), so a test run is reproducible.
- A `request_id` makes `apply` idempotent: the same id with the same command
  returns the first outcome without reconfiguring again; the same id with a
  different command is refused. The last `remembered_requests` ids are kept.
- Fencing: a command (apply or read) may carry the sender's fencing token
  (the worker lease's, which only grows). The switch remembers the newest token
  it has seen and refuses an older one (`StaleToken`, nothing applied), and an
  apply without a token once any token was seen (a read without one is an
  inspection and is answered): a leader deposed while a
  command was in flight cannot change the switch after its successor spoke to
  it. The check comes before the request_id replay and before injected faults.
  The newest token lives in memory (a restart forgets it, as it forgets the
  cross-connects); a real switch adapter keeps it durable.
- `on_reconfiguration(oxc_id, seconds)` is called (outside the lock) for every
  accepted command that changes something, so a host can count
  reconfigurations in its metrics.

Default latency 25 ms, from published figures for the switches this models:
Polatis Series 6000/7000 (piezo beam steering) datasheets give tens of
milliseconds per connection (~25 ms typical); the Calient S320 (3D MEMS) user
guide gives connection switching in tens of ms and a bulk reconfiguration of
all ports in up to 200 ms when the controller sends the deletes before the new
set (up to 500 ms when the switch resolves conflicts itself); Google's
Palomar OCS (Jupiter / TPU v4 papers) switches in milliseconds. SPEC.md's
range for MEMS switches is ~10-100 ms.

Thread-safe: one lock guards the state and the RNG; the wait for the latency
happens outside the lock, so reads proceed while mirrors move. Imports the
standard library, this package and the engine's `Cluster` value only (no
FastAPI, httpx or prometheus here: the HTTP service wraps this model).
"""

from __future__ import annotations

import random
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..engine.cluster import Cluster
from .errors import (
    CommandRefused,
    NotConnected,
    PortBusy,
    PortFailed,
    PortOutOfRange,
    RequestIdReused,
    StaleToken,
    SwitchFault,
    SwitchTimeout,
)
from .state import ConfirmedState, PortPair, normalize_pairs

DEFAULT_RECONFIG_MS = 25.0


@dataclass(frozen=True, slots=True)
class ApplyOutcome:
    """What the switch did with one accepted bulk command."""

    request_id: str
    is_replay: bool
    reconfig_s: float  # from acceptance to visibility; 0.0 for an empty command or a replay
    changed_pairs: int  # disconnects plus connects


@dataclass(frozen=True, slots=True)
class _Batch:
    visible_at: float
    disconnect: tuple[PortPair, ...]
    connect: tuple[PortPair, ...]


@dataclass(frozen=True, slots=True)
class _Remembered:
    command: tuple[tuple[PortPair, ...], tuple[PortPair, ...]]
    visible_at: float
    outcome: ApplyOutcome


class OpticalSwitch:
    """One OXC: cross-connects, failed ports, reconfiguration latency and injected faults."""

    def __init__(
        self,
        oxc_id: str,
        ports: int,
        *,
        reconfig_ms: float = DEFAULT_RECONFIG_MS,
        fault_rate: float = 0.0,
        seed: int = 0,
        remembered_requests: int = 4096,
        on_reconfiguration: Callable[[str, float], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if ports <= 0:
            raise ValueError("a switch needs at least one port")
        if reconfig_ms < 0:
            raise ValueError("reconfig_ms must be >= 0")
        if not 0.0 <= fault_rate <= 1.0:
            raise ValueError("fault_rate must be within [0, 1]")
        self.oxc_id = oxc_id
        self.ports = ports
        self.reconfig_ms = reconfig_ms
        self.fault_rate = fault_rate
        self._on_reconfiguration = on_reconfiguration
        self._clock = clock
        self._sleep = sleep
        self._remembered_requests = remembered_requests
        self._rng = random.Random(f"{seed}:{oxc_id}")
        self._lock = threading.Lock()
        # port -> peer, both directions. `_visible` is what reads show; `_target`
        # is `_visible` plus every accepted batch still settling, and is what new
        # commands are validated against, so two commands can never book a port twice.
        self._visible: dict[int, int] = {}
        self._target: dict[int, int] = {}
        self._pending: deque[_Batch] = deque()
        self._last_visible_at = float("-inf")
        self._failed: set[int] = set()
        self._requests: OrderedDict[str, _Remembered] = OrderedDict()
        self._token = 0  # the newest fencing token seen (0: none yet)

    # -- commands -----------------------------------------------------------

    def apply(
        self,
        connect: Sequence[tuple[int, int]],
        disconnect: Sequence[tuple[int, int]],
        request_id: str,
        *,
        wait: bool = True,
        token: int | None = None,
    ) -> ApplyOutcome:
        """Disconnect then connect, all or nothing; return once visible (unless `wait=False`).

        Raises `StaleToken` when `token` is older than the newest seen, a
        `CommandRefused` subclass when the command is invalid for the switch's
        state, `SwitchFault` or `SwitchTimeout` on an injected fault.
        """
        command = (
            tuple(sorted(normalize_pairs(disconnect))),
            tuple(sorted(normalize_pairs(connect))),
        )
        with self._lock:
            self._check_token(token)
            self._settle()
            fault = self._draw_fault()
            if fault == "fault":
                raise SwitchFault(
                    f"{self.oxc_id}: injected fault, nothing applied", oxc_id=self.oxc_id
                )
            try:
                visible_at, outcome = self._accept(command, request_id)
            except CommandRefused:
                if fault == "timeout":
                    # The refusal is lost with the acknowledgement.
                    raise SwitchTimeout(
                        f"{self.oxc_id}: injected timeout", oxc_id=self.oxc_id
                    ) from None
                raise
        if outcome.changed_pairs and not outcome.is_replay and self._on_reconfiguration:
            self._on_reconfiguration(self.oxc_id, outcome.reconfig_s)
        if wait:
            self._wait_until(visible_at)
        if fault == "timeout":
            raise SwitchTimeout(
                f"{self.oxc_id}: injected timeout after the command ran", oxc_id=self.oxc_id
            )
        return outcome

    def read(self, *, token: int | None = None) -> ConfirmedState:
        """The visible cross-connects and failed ports; subject to injected faults.

        A newer `token` is remembered (a new leader's first read fences the old
        one out); an older one raises `StaleToken`.
        """
        with self._lock:
            if token is not None:
                self._check_token(token)
            self._settle()
            fault = self._draw_fault()
            if fault == "fault":
                raise SwitchFault(f"{self.oxc_id}: injected fault on read", oxc_id=self.oxc_id)
            if fault == "timeout":
                raise SwitchTimeout(f"{self.oxc_id}: injected timeout on read", oxc_id=self.oxc_id)
            return self._snapshot()

    def inspect(self) -> ConfirmedState:
        """The visible state without fault injection (operators, metrics and tests)."""
        with self._lock:
            self._settle()
            return self._snapshot()

    @property
    def fencing_token(self) -> int:
        """The newest fencing token this switch has seen (0: none)."""
        with self._lock:
            return self._token

    def is_reconfiguring(self) -> bool:
        """Whether an accepted change is still settling (not yet visible)."""
        with self._lock:
            self._settle()
            return bool(self._pending)

    # -- physical events ----------------------------------------------------

    def fail_port(self, port: int) -> None:
        """Mark `port` failed (loss of light); its cross-connect, if any, stays set."""
        self._check_range((port,))
        with self._lock:
            self._failed.add(port)

    def restore_port(self, port: int) -> None:
        """Clear the failed mark of `port` (light is back)."""
        self._check_range((port,))
        with self._lock:
            self._failed.discard(port)

    # -- internals (call with the lock held unless stated) --------------------

    def _check_token(self, token: int | None) -> None:
        if token is None:
            if self._token:
                raise StaleToken(
                    f"{self.oxc_id}: a command without a fencing token after token {self._token}",
                    oxc_id=self.oxc_id,
                )
            return
        if token < self._token:
            raise StaleToken(
                f"{self.oxc_id}: fencing token {token} is older than {self._token}",
                oxc_id=self.oxc_id,
            )
        self._token = token

    def _draw_fault(self) -> str | None:
        if self.fault_rate == 0.0 or self._rng.random() >= self.fault_rate:
            return None
        return "fault" if self._rng.random() < 0.5 else "timeout"

    def _accept(
        self, command: tuple[tuple[PortPair, ...], tuple[PortPair, ...]], request_id: str
    ) -> tuple[float, ApplyOutcome]:
        remembered = self._requests.get(request_id)
        if remembered is not None:
            if remembered.command != command:
                raise RequestIdReused(
                    f"{self.oxc_id}: request_id {request_id!r} was used for another command",
                    oxc_id=self.oxc_id,
                )
            self._requests.move_to_end(request_id)
            replay = ApplyOutcome(request_id, True, 0.0, remembered.outcome.changed_pairs)
            return remembered.visible_at, replay
        disconnect, connect = command
        self._validate(disconnect, connect)
        now = self._clock()
        changed = len(disconnect) + len(connect)
        if changed == 0:
            visible_at, reconfig_s = now, 0.0
        else:
            # One reconfiguration at a time: a command queued behind another
            # starts when the previous one has settled.
            visible_at = max(now, self._last_visible_at) + self.reconfig_ms / 1000.0
            reconfig_s = visible_at - now
            self._last_visible_at = visible_at
            _apply_pairs(self._target, disconnect, connect)
            self._pending.append(_Batch(visible_at, disconnect, connect))
            self._settle()
        outcome = ApplyOutcome(request_id, False, reconfig_s, changed)
        self._requests[request_id] = _Remembered(command, visible_at, outcome)
        while len(self._requests) > self._remembered_requests:
            self._requests.popitem(last=False)
        return visible_at, outcome

    def _validate(self, disconnect: tuple[PortPair, ...], connect: tuple[PortPair, ...]) -> None:
        self._check_range([p for pair in disconnect + connect for p in pair])
        for a, b in disconnect + connect:
            if a == b:
                raise CommandRefused(
                    f"{self.oxc_id}: port {a} cannot be cross-connected to itself",
                    oxc_id=self.oxc_id,
                    ports=(a,),
                )
        if len(set(disconnect)) != len(disconnect):
            raise CommandRefused(f"{self.oxc_id}: a disconnect is listed twice", oxc_id=self.oxc_id)
        for a, b in disconnect:
            if self._target.get(a) != b:
                raise NotConnected(
                    f"{self.oxc_id}: ports {a} and {b} are not cross-connected",
                    oxc_id=self.oxc_id,
                    ports=(a, b),
                )
        failed = sorted({p for pair in connect for p in pair if p in self._failed})
        if failed:
            raise PortFailed(
                f"{self.oxc_id}: port(s) {failed} have failed (loss of light)",
                oxc_id=self.oxc_id,
                ports=tuple(failed),
            )
        freed = {p for pair in disconnect for p in pair}
        seen: set[int] = set()
        busy: set[int] = set()
        for port in (p for pair in connect for p in pair):
            if port in seen or (port in self._target and port not in freed):
                busy.add(port)
            seen.add(port)
        if busy:
            raise PortBusy(
                f"{self.oxc_id}: port(s) {sorted(busy)} already in a cross-connect",
                oxc_id=self.oxc_id,
                ports=tuple(sorted(busy)),
            )

    def _check_range(self, ports: Sequence[int]) -> None:
        bad = sorted({p for p in ports if not 0 <= p < self.ports})
        if bad:
            raise PortOutOfRange(
                f"{self.oxc_id}: port(s) {bad} outside 0..{self.ports - 1}",
                oxc_id=self.oxc_id,
                ports=tuple(bad),
            )

    def _settle(self) -> None:
        now = self._clock()
        while self._pending and self._pending[0].visible_at <= now:
            batch = self._pending.popleft()
            _apply_pairs(self._visible, batch.disconnect, batch.connect)

    def _snapshot(self) -> ConfirmedState:
        pairs = frozenset((a, b) for a, b in self._visible.items() if a < b)
        return ConfirmedState(self.oxc_id, self.ports, pairs, frozenset(self._failed))

    def _wait_until(self, visible_at: float) -> None:
        # Without the lock: other commands and reads go on while mirrors move.
        remaining = visible_at - self._clock()
        if remaining > 0:
            self._sleep(remaining)


def _apply_pairs(
    peers: dict[int, int], disconnect: tuple[PortPair, ...], connect: tuple[PortPair, ...]
) -> None:
    """Disconnects first, then connects, on a port -> peer map (both directions)."""
    for a, b in disconnect:
        del peers[a], peers[b]
    for a, b in connect:
        peers[a] = b
        peers[b] = a


def switches_for_cluster(
    cluster: Cluster,
    *,
    reconfig_ms: float | None = None,
    fault_rate: float = 0.0,
    seed: int = 0,
    on_reconfiguration: Callable[[str, float], None] | None = None,
) -> dict[str, OpticalSwitch]:
    """One switch model per OXC of `cluster`; `reconfig_ms=None` keeps each OXC's own latency."""
    return {
        oxc.id: OpticalSwitch(
            oxc.id,
            oxc.ports,
            reconfig_ms=oxc.reconfig_ms if reconfig_ms is None else reconfig_ms,
            fault_rate=fault_rate,
            seed=seed,
            on_reconfiguration=on_reconfiguration,
        )
        for oxc in cluster.oxcs
    }

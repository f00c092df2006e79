"""Per-phase rewiring of one job, decided by the engine and charged by the simulator.

No fabric decision is made here: Lightpath's hold-or-rewire is the fabric
controller's (`engine.controller.step`), the reactive baseline's is
`engine.rewiring_rules`; this module walks a job's phases through them on
simulated time and records what each iteration cost.

`walk_controller` feeds the controller the job's phases (`PhaseObserved` when a
phase ends, with its start time) iteration after iteration, and switch
confirmations `reconfig_ms` after each change it asks for, exactly as
`trace.replay_trace` does. The controller's own measured accounting (hits,
held, misses, exposed seconds, reconfigurations) is the cost: an iteration is
charged the exposed seconds its phases waited on circuits. The walk runs on a
copy of the controller state restricted to this job (its slice, circuits and
cycle as the controller allocated them; other jobs' cross-connects do not
change its decisions), and stops when three consecutive iterations cost the
same and score the same; every later iteration is taken to do the same.

Pure; no I/O.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from app.engine.controller import (
    HELD_PLAN,
    ControllerState,
    Event,
    PhaseObserved,
    SwitchConfirmed,
    step,
)
from app.engine.plan_signature import EMPTY_PLAN_ID
from app.engine.rewiring_rules import HELD_TOPOLOGY, reactive_iteration
from app.engine.traffic import DemandMatrix

MAX_WARMUP_ITERATIONS = 64
_STEADY_REPEATS = 3


@dataclass(frozen=True, slots=True)
class IterationCost:
    """What one iteration's rewiring cost: exposed seconds, reconfigurations, phase scores."""

    exposed_s: float
    reconfigurations: int
    hits: int = 0
    held: int = 0
    misses: int = 0


@dataclass(frozen=True, slots=True)
class RewiringOutcome:
    """Warm-up iterations one by one, then the steady iteration; topology each phase ran on."""

    warmup: tuple[IterationCost, ...]
    steady: IterationCost
    topologies: tuple[str, ...] = ()  # per phase in steady state: HELD_TOPOLOGY or a plan id
    predicted: bool = False

    def cost_of(self, iteration: int) -> IterationCost:
        return self.warmup[iteration] if iteration < len(self.warmup) else self.steady

    def _total(self, name: str, iterations: int) -> int:
        warm = sum(getattr(c, name) for c in self.warmup[:iterations])
        rest = max(0, iterations - len(self.warmup)) * getattr(self.steady, name)
        return int(warm + rest)

    def hits(self, iterations: int) -> int:
        return self._total("hits", iterations)

    def held(self, iterations: int) -> int:
        return self._total("held", iterations)

    def misses(self, iterations: int) -> int:
        return self._total("misses", iterations)


NO_REWIRING = RewiringOutcome((), IterationCost(0.0, 0))


@dataclass(frozen=True, slots=True)
class PhaseSlot:
    """One phase of an iteration: its pod demand and plan, start offset and duration."""

    plan_id: str
    demand: DemandMatrix
    offset_s: float
    duration_s: float


def static_outcome(phases: Sequence[PhaseSlot], reconfig_s: float) -> RewiringOutcome:
    """The pp+dp topology asked for at placement and held: only its install can be exposed.

    Scored as the controller scores phases: every phase runs on the kept topology
    (held), except a first phase that waited for the placement install (a miss).
    """
    busy = [p for p in phases if p.plan_id != EMPTY_PLAN_ID]
    if not busy:
        return NO_REWIRING
    exposed = max(0.0, reconfig_s - busy[0].offset_s)
    waited = 1 if exposed > 0 else 0
    warm = IterationCost(exposed, 1, 0, len(busy) - waited, waited)
    return RewiringOutcome(
        (warm,),
        IterationCost(0.0, 0, 0, len(busy), 0),
        tuple(HELD_TOPOLOGY for _ in phases),
        False,
    )


def reactive_outcome(
    phases: Sequence[PhaseSlot],
    times: dict[str, dict[str, float]],
    reconfig_s: float,
) -> RewiringOutcome:
    """The reactive rule (`rewiring_rules.reactive_iteration`) over warm-up and steady state."""
    busy = [p for p in phases if p.plan_id != EMPTY_PLAN_ID]
    if not busy:
        return NO_REWIRING
    plans = [p.plan_id for p in busy]
    installed = HELD_TOPOLOGY
    warm: list[IterationCost] = []
    last: tuple[str, ...] = ()
    for i in range(MAX_WARMUP_ITERATIONS):
        ran, installed = reactive_iteration(plans, times, installed, reconfig_s)
        exposed = sum(r.exposed_s for r in ran)
        # scored as the controller scores phases: one that waited for a rewiring is
        # a miss, one already on its own confirmed circuits a hit, the rest held
        waited = [r.rewired for r in ran]
        if i == 0:
            install = max(0.0, reconfig_s - busy[0].offset_s)  # the placement install
            exposed += install
            waited[0] = waited[0] or install > 0
        misses = sum(waited)
        hits = sum(1 for r, w in zip(ran, waited, strict=True) if not w and r.topology == r.plan_id)
        cost = IterationCost(
            exposed,
            sum(r.rewired for r in ran) + (i == 0),
            hits,
            len(ran) - misses - hits,
            misses,
        )
        topo = tuple(r.topology for r in ran)
        warm.append(cost)
        if len(warm) >= 2 and warm[-1] == warm[-2] and topo == last:
            break
        last = topo
    topo_by_plan = dict(zip(plans, last, strict=True))
    topologies = tuple(topo_by_plan.get(p.plan_id, HELD_TOPOLOGY) for p in phases)
    return RewiringOutcome(tuple(warm[:-1]), warm[-1], topologies, False)


def _restricted(state: ControllerState, job_id: str) -> ControllerState:
    """The controller state with only this job: its slice, circuits and cycle."""
    jf = state.job_fabric(job_id)
    assert jf is not None and state.fabric is not None
    pj = next(pj for pj in state.jobs if pj.job.job_id == job_id)
    mine = tuple(cc for cc in state.desired if cc.job_id == job_id)
    fabric = replace(state.fabric, jobs=(jf,), cross_connects=mine, time_division=())
    return replace(
        state,
        jobs=(pj,),
        fabric=fabric,
        desired=mine,
        confirmed=frozenset(),
        cycles={job_id: state.cycles[job_id]},
    )


def walk_controller(
    state: ControllerState,
    job_id: str,
    phases: Sequence[PhaseSlot],
    iteration_s: float,
    start_s: float,
    *,
    iterations: int,
    detect_steady: bool = True,
) -> RewiringOutcome:
    """Walk the job's phases through the fabric controller from its placement at `start_s`.

    The controller asked for the job's placement topology at `start_s`; the
    switches confirm every change `reconfig_ms` after it was asked for.
    """
    busy = [p for p in phases if p.plan_id != EMPTY_PLAN_ID]
    if not busy or iteration_s <= 0:
        return NO_REWIRING
    latency = state.config.reconfig_ms / 1000.0
    s = _restricted(state, job_id)
    queue: list[tuple[float, int, int, Event]] = []
    seq = 0

    def confirm_at(at: float) -> None:
        nonlocal seq
        seq += 1
        held = frozenset(cc.key for cc in s.desired)
        heapq.heappush(queue, (at + latency, 0, seq, SwitchConfirmed(held, at + latency)))

    confirm_at(start_s)
    # The job's first phase cannot start before the placement install is confirmed:
    # it waits (one miss, exposed), and every later phase comes that much later, as
    # static and reactive count it. (Walked on the fixed timing instead, every phase
    # of the iterations before the confirmation waited: 68 misses and 34 s exposed
    # at 1 s latency where static had 1 and 1 s; and the walk, finding those
    # iterations alike, could stop before the confirmation and count nothing.)
    first_offset = min(p.offset_s for p in busy)
    wait = max(0.0, latency - first_offset)
    if wait > 0:
        # the first phase at the confirmation or the first instant after it (a confirmation
        # sorts first at the same instant): a fixed 1e-9 s after it vanished into the
        # rounding of arrivals past 1e7 s, and the phase came before the confirmation
        confirmed = start_s + latency
        start_s = confirmed - first_offset
        while start_s + first_offset < confirmed:
            start_s = math.nextafter(start_s, math.inf)
    limit = min(iterations, MAX_WARMUP_ITERATIONS) if detect_steady else iterations
    warm: list[IterationCost] = []
    topologies: tuple[str, ...] = ()
    for i in range(limit):
        base = start_s + i * iteration_s
        for p in phases:
            seq += 1
            started = base + p.offset_s
            ev = PhaseObserved(job_id, p.demand, started, started + p.duration_s)
            heapq.heappush(queue, (ev.at_s, 1, seq, ev))
        before = s.cycles[job_id].accounting
        targets: list[str] = []
        # every phase of the iteration, also one ending as it ends (a dp tail with no
        # optimizer step after it: counted in the next iteration, the last one never,
        # a sweep's lightpath 1 phase of 2 where static held 2)
        last = max(base + p.offset_s + p.duration_s for p in phases)
        end = max(base + iteration_s, math.nextafter(last, math.inf))
        while queue and queue[0][0] < end:
            _, _, _, event = heapq.heappop(queue)
            if isinstance(event, PhaseObserved):
                targets.append(s.cycles[job_id].target)
            s, decisions = step(s, event)
            if any(d.oxc is not None and d.oxc.moves for d in decisions):
                confirm_at(event.at_s)
        after = s.cycles[job_id].accounting
        cost = IterationCost(
            after.exposed_s - before.exposed_s,
            after.reconfigurations - before.reconfigurations,
            after.hits - before.hits,
            after.held - before.held,
            after.misses - before.misses,
        )
        topologies = tuple(HELD_TOPOLOGY if t == HELD_PLAN else t for t in targets[: len(phases)])
        warm.append(cost)
        if (
            detect_steady
            and len(warm) >= _STEADY_REPEATS
            and all(_same(c, cost) for c in warm[-_STEADY_REPEATS:])
        ):
            break
    steady = warm[-1]
    if len(warm) < iterations and detect_steady:
        warm.pop()
    # the first iteration carries the placement install, asked before the walk (as
    # static and reactive count it); added after steady state was found
    first = warm[0] if warm else steady
    first = replace(first, reconfigurations=first.reconfigurations + 1)
    if wait > 0 and first.held > 0:  # the first phase waited for the install
        first = replace(
            first, exposed_s=first.exposed_s + wait, held=first.held - 1, misses=first.misses + 1
        )
    warm[:1] = [first]
    return RewiringOutcome(tuple(warm), steady, topologies, True)


def _same(a: IterationCost, b: IterationCost) -> bool:
    return (
        abs(a.exposed_s - b.exposed_s) <= 1e-12
        and a.reconfigurations == b.reconfigurations
        and (a.hits, a.held, a.misses) == (b.hits, b.held, b.misses)
    )


__all__ = [
    "NO_REWIRING",
    "IterationCost",
    "PhaseSlot",
    "RewiringOutcome",
    "reactive_outcome",
    "static_outcome",
    "walk_controller",
]

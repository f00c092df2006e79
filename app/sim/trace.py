"""The simulator's thin loop over the fabric controller for a scripted event trace.

Events (arrivals, completions, phases with their start times, clock ticks) go
through `engine.controller.step` in time order; the decisions go to simulated
switches that confirm what they were asked to hold `switch_latency_s` later
(the OXCs' reconfiguration latency unless told otherwise). The worker drives
the same controller with events from the database and confirmations from the
real southbound; `tests/sim/test_conformance.py` checks both agree.

No I/O; calls only engine functions.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass, field

from app.engine.cluster import Cluster
from app.engine.controller import (
    Accounting,
    ControllerConfig,
    ControllerState,
    Event,
    JobCompleted,
    SwitchConfirmed,
    new_controller,
    step,
)
from app.engine.fabric import Decision


@dataclass
class TraceResult:
    """Decisions in order with when they were made, the final state and per-job accounting."""

    decisions: list[tuple[float, Decision]] = field(default_factory=list)
    state: ControllerState | None = None
    finished: dict[str, Accounting] = field(default_factory=dict)  # jobs that left

    def accounting(self, job_id: str) -> Accounting:
        """The job's hits, held, misses, exposed seconds and reconfigurations (or zeros)."""
        assert self.state is not None
        cycle = self.state.cycle(job_id)
        if cycle is not None:
            return cycle.accounting
        return self.finished.get(job_id, Accounting())


def replay_trace(
    cluster: Cluster,
    config: ControllerConfig,
    events: Iterable[Event],
    switch_latency_s: float | None = None,
) -> TraceResult:
    """Run `events` (any order; sorted by time, ties in input order) through the controller."""
    latency = config.reconfig_ms / 1000.0 if switch_latency_s is None else switch_latency_s
    queue: list[tuple[float, int, int, Event]] = []
    for n, e in enumerate(events):
        # confirmations sort before other events at the same instant
        heapq.heappush(queue, (e.at_s, 1, n, e))
    seq = len(queue)
    state = new_controller(cluster, config)
    out = TraceResult()
    while queue:
        at, _, _, event = heapq.heappop(queue)
        if isinstance(event, JobCompleted) and (cycle := state.cycle(event.job_id)):
            out.finished[event.job_id] = cycle.final_accounting
        state, decisions = step(state, event)
        out.decisions.extend((at, d) for d in decisions)
        if any(d.oxc is not None and d.oxc.moves for d in decisions):
            held = frozenset(cc.key for cc in state.desired)
            seq += 1
            heapq.heappush(queue, (at + latency, 0, seq, SwitchConfirmed(held, at + latency)))
    out.state = state
    return out

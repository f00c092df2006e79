"""Rewiring rules of the baselines that do not predict: `reactive` and `static`.

The fabric controller (`controller.py`) decides Lightpath's hold-or-rewire; the
baselines' decisions live here so that no fabric decision is coded outside
`app/engine/` (the simulator only carries them out and charges their cost):

- `reactive`: when a phase's demand arrives, rewire the job's slice to that
  phase's own topology only when the transfer time it saves exceeds the
  reconfiguration time (the whole reconfiguration is exposed: it starts when
  the demand is seen). Otherwise the phase runs on what is installed.
- `static`: the pp+dp topology chosen at placement is held for the job's life.

Pure functions; no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

HELD_TOPOLOGY = "held"  # the pp+dp topology installed at placement


def reactive_rewires(on_installed_s: float, on_own_s: float, reconfig_s: float) -> bool:
    """Rewire for a phase only when it saves more transfer time than the rewiring costs."""
    if not math.isfinite(on_installed_s):
        return math.isfinite(on_own_s)
    return on_installed_s - on_own_s > reconfig_s


@dataclass(frozen=True, slots=True)
class ReactivePhase:
    """One phase as a reactive fabric ran it: on which topology, exposed and rewired."""

    plan_id: str
    topology: str  # HELD_TOPOLOGY or the plan id whose own circuits it ran on
    network_s: float
    exposed_s: float
    rewired: bool


def reactive_iteration(
    plan_ids: Sequence[str],
    times: Mapping[str, Mapping[str, float]],
    installed: str,
    reconfig_s: float,
) -> tuple[tuple[ReactivePhase, ...], str]:
    """One iteration's phases under the reactive rule, from the installed topology.

    `times[plan_id][topology]` is the phase's transfer time on that topology
    (`HELD_TOPOLOGY` or any plan id's own circuits; a missing entry is unroutable).
    Returns the phases and the topology installed after the iteration.
    """
    out = []
    for pid in plan_ids:
        on = times.get(pid, {})
        here = on.get(installed, math.inf)
        own = on.get(pid, math.inf)
        if installed != pid and reactive_rewires(here, own, reconfig_s):
            out.append(ReactivePhase(pid, pid, own, reconfig_s, True))
            installed = pid
        else:
            out.append(ReactivePhase(pid, installed, here, 0.0, False))
    return tuple(out), installed


__all__ = [
    "HELD_TOPOLOGY",
    "ReactivePhase",
    "reactive_iteration",
    "reactive_rewires",
]

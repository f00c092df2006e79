"""Full garbage collections in the fabric process's idle time, not inside a pass.

CPython starts a full (generation 2) collection from whatever allocation tips its
counters, so one lands inside a fabric decision now and then. The fabric process
holds the controller's memory of every running job (plans, routes, headers): at
300 running jobs a full collection walks ~130,000 objects and takes 50-130 ms,
where the decision it interrupts takes 2-10 ms. Measured on the replay of
`bench/bench_controller.py --workload`: 12-14 full collections in 1,025 steps,
enough to set the p99.

So the fabric process (`defer_full_collections`) leaves only generations 0 and 1
automatic (each well under 2 ms) and makes the full collections itself
(`collect_if_due`) between passes, as often as CPython would have counted them
due: after `FULL_AFTER_GEN1` collections of generation 1. When passes follow one
another without a break (a backlog), a collection overdue by `OVERDUE_FACTOR`
times that count is made anyway, so cyclic garbage stays bounded.
"""

from __future__ import annotations

import gc

FULL_AFTER_GEN1 = 10  # CPython's default threshold for generation 2
OVERDUE_FACTOR = 10
_NEVER = 1 << 30


def defer_full_collections() -> None:
    """Automatic collections stop at generation 1 in this process."""
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, _NEVER)


def collect_if_due(*, idle: bool = True) -> bool:
    """A full collection when one is due (or, not idle, long overdue); True if made."""
    pending = gc.get_count()[2]  # generation-1 collections since the last full one
    due = FULL_AFTER_GEN1 if idle else FULL_AFTER_GEN1 * OVERDUE_FACTOR
    if pending < due:
        return False
    gc.collect()
    return True


__all__ = ["FULL_AFTER_GEN1", "collect_if_due", "defer_full_collections"]

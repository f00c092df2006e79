"""Garbage collections in the fabric process's idle time, not inside a pass.

CPython starts a collection from whatever allocation tips its counters, so one
lands inside a fabric decision now and then. The fabric process holds the
controller's memory of every running job (plans, routes, headers): at 300 running
jobs a full collection walks ~130,000 objects and takes 50-130 ms, where the
decision it interrupts takes 2-10 ms. Measured on the replay of
`bench/bench_controller.py --workload`: 12-14 full collections in 1,025 steps,
enough to set the p99. The young generations cost less but are not free: with
CPython's thresholds (700, 10) the same replay made 360 generation-0 and 32
generation-1 collections inside steps, up to 8.5 ms in one arrival (a
generation-1 collection walks everything the last steps built) and 4 ms at the
arrivals' p99.

So the fabric process (`defer_collections`) makes every collection on
CPython's own schedule, but between passes (`collect_if_due`): generation 0 once
`YOUNG` objects are pending, generation 1 after `MIDDLE` of those, a full
collection after `FULL_AFTER_GEN1` collections of generation 1. Inside a pass
only a pass that allocates more than `YOUNG_IN_PASS` objects net is collected (a
safety net; the replay's largest step stays below it). When passes follow one
another without a break (a backlog), a full collection overdue by
`OVERDUE_FACTOR` times its count is made anyway, so cyclic garbage stays bounded.
"""

from __future__ import annotations

import gc

YOUNG = 700  # CPython's default threshold for generation 0
MIDDLE = 10  # ... for generation 1
FULL_AFTER_GEN1 = 10  # ... for generation 2
YOUNG_IN_PASS = 100_000  # automatic collections inside a pass start only here
OVERDUE_FACTOR = 10
_NEVER = 1 << 30


def defer_collections() -> None:
    """Automatic collections in this process only past `YOUNG_IN_PASS`, never full."""
    gc.set_threshold(YOUNG_IN_PASS, MIDDLE, _NEVER)


def collect_if_due(*, idle: bool = True) -> bool:
    """The collection CPython would have made by now, between passes; True if it was
    a full one (made when due, or when not idle only when long overdue)."""
    young, middle, full = gc.get_count()
    due = FULL_AFTER_GEN1 if idle else FULL_AFTER_GEN1 * OVERDUE_FACTOR
    if full >= due:
        gc.collect()
        return True
    if middle >= MIDDLE:
        gc.collect(1)  # counts towards the full collection, as CPython's own does
    elif young >= YOUNG:
        gc.collect(0)
    return False


__all__ = ["FULL_AFTER_GEN1", "YOUNG", "YOUNG_IN_PASS", "collect_if_due", "defer_collections"]

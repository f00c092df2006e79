"""Acting on a prediction: does rewiring for the next phase fit in the compute gap?

The worker knows when each of a job's phases started (`phase_started_at` of the
traffic reports) and the predictor's period. From those it estimates when the
next phase starts; a reconfiguration that finishes before then is hidden, one
that does not is exposed (the phase waits, or runs on the wrong topology).

Times are seconds on the reporter's clock, passed in: this module reads no clock.
Pure module: no I/O, no FastAPI/SQLAlchemy/Redis/pydantic imports.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# Past cycles consulted for the interval before the next phase. A straggler makes
# one cycle's interval long; taking the shortest of three keeps the estimate early,
# which errs towards not rewiring (a kept topology costs nothing if it was right).
CYCLES_CONSULTED = 3
# Without a period, the recent inter-arrival intervals whose median is used.
RECENT_INTERVALS = 8


@dataclass(frozen=True, slots=True)
class PreinstallDecision:
    """Whether to install the predicted plan now, and the timing that decided it."""

    fits: bool
    next_phase_start_s: float | None  # None: too few reports to estimate
    gap_s: float  # time left before the next phase, from `now_s`
    exposed_reconfig_s: float  # what rewiring now would leave exposed (0 when it fits)


def estimate_next_phase_start(
    arrivals_s: Sequence[float], period: int | None = None
) -> float | None:
    """When the next phase should start, from the start times of the job's phases so far.

    With a known period p the next phase is the one p phases back in each past
    cycle, so the interval before it is read from those cycles (phases of one
    iteration have very different compute gaps). Otherwise the median recent interval.
    """
    n = len(arrivals_s)
    if n < 2:
        return None
    intervals: list[float] = []
    if period is not None and period >= 1:
        # The next phase has index n; its counterpart k cycles back has index n - k*p
        # and was preceded by the interval arrivals[n-k*p] - arrivals[n-k*p-1].
        for k in range(1, CYCLES_CONSULTED + 1):
            i = n - k * period
            if i < 1:
                break
            intervals.append(arrivals_s[i] - arrivals_s[i - 1])
    if intervals:
        return arrivals_s[-1] + min(intervals)
    first = max(1, n - RECENT_INTERVALS)
    recent = [arrivals_s[i] - arrivals_s[i - 1] for i in range(first, n)]
    import statistics  # here: ~10-70 ms of start-up otherwise (decimal, fractions)

    return arrivals_s[-1] + statistics.median(recent)


def gap_before_s(
    starts_s: Sequence[float], ends_s: Sequence[float], ahead: int, period: int | None
) -> float | None:
    """The idle time before phase n + `ahead` (n = phases seen), from past cycles.

    The gap between a phase's predecessor ending and the phase starting, read at
    its counterparts one, two, three periods back (the shortest wins, as above);
    None without a period or when no counterpart was seen.
    """
    n = min(len(starts_s), len(ends_s))
    if period is None or period < 1 or n < 2:
        return None
    starts_s, ends_s = starts_s[-n:], ends_s[-n:]
    gaps = []
    for k in range(1, CYCLES_CONSULTED + 1):
        i = n + ahead - k * period
        if i > n - 1:
            continue
        if i < 1:
            break
        gaps.append(starts_s[i] - ends_s[i - 1])
    return max(0.0, min(gaps)) if gaps else None


def should_preinstall(
    arrivals_s: Sequence[float],
    now_s: float,
    reconfig_ms: float,
    period: int | None = None,
    guard_ms: float = 0.0,
) -> PreinstallDecision:
    """Install the predicted plan only if `reconfig_ms` + `guard_ms` fit before the next phase."""
    start = estimate_next_phase_start(arrivals_s, period)
    reconfig_s = reconfig_ms / 1000.0
    if start is None:
        return PreinstallDecision(False, None, 0.0, reconfig_s)
    gap_s = max(0.0, start - now_s)
    fits = reconfig_s + guard_ms / 1000.0 <= gap_s
    return PreinstallDecision(fits, start, gap_s, 0.0 if fits else reconfig_s - gap_s)


def exposed_reconfig_s(
    reconfig_ms: float,
    gap_s: float,
    *,
    preinstalled: bool,
    installed_plan: str | None,
    demanded_plan: str,
) -> float:
    """Reconfiguration time the phase waits for, given what was done in the gap before it.

    - the fabric already holds the demanded plan: a pre-installed one costs what did
      not fit in the gap, a kept one costs nothing;
    - it holds another plan (a miss, or a kept topology that was wrong): the whole
      reconfiguration happens after the demand arrives.
    """
    reconfig_s = reconfig_ms / 1000.0
    if installed_plan != demanded_plan:
        return reconfig_s
    if preinstalled:
        return max(0.0, reconfig_s - max(0.0, gap_s))
    return 0.0

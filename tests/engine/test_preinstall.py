"""Acting on predictions: next-phase estimate, the fits-in-the-gap rule, exposed time."""

from __future__ import annotations

import pytest

from app.engine.preinstall import (
    estimate_next_phase_start,
    exposed_reconfig_s,
    should_preinstall,
)

# PP phase at 0.0, DP phase 0.8 s later, next PP 0.2 s after that: period 2, 1.0 s.
ARRIVALS = [0.0, 0.8, 1.0, 1.8, 2.0, 2.8, 3.0, 3.8]


def test_next_start_uses_the_same_phase_of_past_cycles() -> None:
    # Next is a PP phase, preceded by the short 0.2 s gap in every past cycle.
    assert estimate_next_phase_start(ARRIVALS, period=2) == pytest.approx(4.0)
    # Without a period: the median interval, which is wrong here by design.
    assert estimate_next_phase_start(ARRIVALS) == pytest.approx(4.6)
    assert estimate_next_phase_start([1.0]) is None


def test_a_straggler_cycle_does_not_delay_the_estimate() -> None:
    arrivals = ARRIVALS[:-1] + [4.5]  # the last DP came late
    assert estimate_next_phase_start(arrivals + [4.7, 5.5], period=2) == pytest.approx(5.7)


def test_preinstall_only_when_the_reconfiguration_fits() -> None:
    ok = should_preinstall(ARRIVALS, now_s=3.85, reconfig_ms=25.0, period=2)
    assert ok.fits and ok.gap_s == pytest.approx(0.15) and ok.exposed_reconfig_s == 0.0
    late = should_preinstall(ARRIVALS, now_s=3.99, reconfig_ms=25.0, period=2)
    assert not late.fits and late.exposed_reconfig_s == pytest.approx(0.015)
    guarded = should_preinstall(ARRIVALS, now_s=3.85, reconfig_ms=25.0, period=2, guard_ms=130)
    assert not guarded.fits
    assert not should_preinstall([0.0], now_s=0.1, reconfig_ms=25.0).fits


def test_exposed_reconfiguration_time() -> None:
    hit = dict(installed_plan="pp", demanded_plan="pp")
    miss = dict(installed_plan="dp", demanded_plan="pp")
    assert exposed_reconfig_s(25.0, 0.1, preinstalled=True, **hit) == 0.0
    assert exposed_reconfig_s(25.0, 0.01, preinstalled=True, **hit) == pytest.approx(0.015)
    assert exposed_reconfig_s(25.0, 0.1, preinstalled=False, **hit) == 0.0
    assert exposed_reconfig_s(25.0, 0.1, preinstalled=True, **miss) == pytest.approx(0.025)
    assert exposed_reconfig_s(25.0, 0.1, preinstalled=False, **miss) == pytest.approx(0.025)

"""Rewiring walk: the analytic steady state equals stepping every phase."""

from __future__ import annotations

import pytest

from app.sim.prediction import walk_rewiring

PATTERNS = [
    (["P", "D"], [0.03, 0.01]),
    (["P", "plan-idle"], [0.03, 0.01]),
    (["P", "P"], [0.03, 0.01]),
    (["P", "D", "E"], [0.05, 0.002, 0.02]),
    (["E", "A", "E"], [0.05, 0.002, 0.02]),  # the seed algorithm's bad case
    (["P"], [0.2]),
]


@pytest.mark.parametrize(("plans", "gaps"), PATTERNS)
@pytest.mark.parametrize("algorithm", [None, "seed", "lightpath"])
@pytest.mark.parametrize("reconfig_ms", [0.0, 10.0, 25.0, 100.0])
@pytest.mark.parametrize("per_phase", [True, False])
def test_steady_state_counted_equals_stepped(plans, gaps, algorithm, reconfig_ms, per_phase):
    iterations = 150
    fast = walk_rewiring(plans, gaps, reconfig_ms, algorithm=algorithm, per_phase=per_phase)
    slow = walk_rewiring(
        plans,
        gaps,
        reconfig_ms,
        algorithm=algorithm,
        per_phase=per_phase,
        iterations=iterations,
        detect_steady=False,
    )
    assert len(slow.warmup) == iterations
    assert len(fast.warmup) < 10
    for i in range(iterations):
        assert fast.cost_of(i) == slow.cost_of(i)
    assert fast.hits(iterations) == slow.hits(iterations)
    assert fast.misses(iterations) == slow.misses(iterations)


def test_costs_follow_the_exposure_rule():
    # P and D differ; 25 ms OXC; the PP gap hides 20 ms, the DP gap 30 ms
    reactive = walk_rewiring(["P", "D"], [0.02, 0.03], 25.0, algorithm=None)
    assert reactive.warmup[0].exposed_s == pytest.approx(0.005 + 0.025)  # install, then rewire
    assert reactive.steady.exposed_s == pytest.approx(0.050)  # both phases rewired on demand
    assert reactive.steady.reconfigurations == 2
    # the PP gap cannot hide 25 ms: a predictor holds the pp+dp topology instead
    predicted = walk_rewiring(["P", "D"], [0.02, 0.03], 25.0, algorithm="lightpath")
    assert predicted.steady.exposed_s == 0 and predicted.steady.reconfigurations == 0
    assert sum(c.exposed_s for c in predicted.warmup) == pytest.approx(0.005)  # installation
    # both gaps hide 10 ms: held while the period is learnt, then every phase pre-installed
    fits = walk_rewiring(["P", "D"], [0.02, 0.03], 10.0, algorithm="lightpath")
    assert fits.steady.exposed_s == 0 and fits.steady.reconfigurations == 2
    assert sum(c.exposed_s for c in fits.warmup) == 0  # no exposed warm-up miss
    held = walk_rewiring(["P", "D"], [0.02, 0.03], 25.0, algorithm="seed", per_phase=False)
    assert held.steady.exposed_s == 0 and held.steady.reconfigurations == 0
    assert held.misses(100) == 3  # the seed predictor: P, D, then P on the kept D

"""bench/bench_evaluation.py's targets: the verdicts the closing notes quote are computed
as they say (paired per seed, the interval deciding above / level / below)."""

from __future__ import annotations

from typing import Any

import pytest

from bench.bench_evaluation import targets, targets_line


def _agg(policy: str, values: list[float]) -> dict[str, Any]:
    mean = sum(values) / len(values) if values else None
    return {"policy": policy, "steady_utilization": {"mean": mean, "ci95": 0.0, "values": values}}


def _cell(lightpath: list[float], same_cost: list[float]) -> list[dict[str, Any]]:
    return [
        _agg("ideal", [0.70, 0.70, 0.70]),
        _agg("spray", [0.70, 0.70, 0.70]),
        _agg("spray-same-cost", same_cost),
        _agg("lightpath", lightpath),
    ]


def test_a_difference_the_seeds_agree_on_is_above_and_one_they_split_on_is_level() -> None:
    # every seed 0.5 points ahead: the interval is [0.5, 0.5], above
    above = targets(_cell([0.695, 0.685, 0.675], [0.690, 0.680, 0.670]))
    assert above["minus_same_cost"]["points"] == pytest.approx(0.5)
    assert above["minus_same_cost"]["verdict"] == "above"
    # the same mean difference, but one seed behind: the interval spans 0
    level = targets(_cell([0.705, 0.675, 0.675], [0.690, 0.680, 0.670]))
    assert level["minus_same_cost"]["verdict"] == "level"
    below = targets(_cell([0.685, 0.675, 0.665], [0.690, 0.680, 0.670]))
    assert below["minus_same_cost"]["verdict"] == "below"
    # behind on every seed, but by less than the tables' 0.01 points: level
    tiny = targets(_cell([0.68999, 0.67999, 0.66999], [0.690, 0.680, 0.670]))
    assert tiny["minus_same_cost"]["verdict"] == "level"


def test_ratios_to_ideal_and_spray_and_their_verdicts() -> None:
    t = targets(_cell([0.6916, 0.6916, 0.6916], [0.69, 0.69, 0.69]))
    assert t["of_ideal"] == pytest.approx(0.6916 / 0.70)
    assert t["vs_spray_pct"] == pytest.approx(-1.2)
    line = targets_line(t)
    assert "(>= 0.95 met)" in line and "(within 1% MISSED)" in line


def test_runs_without_a_steady_window_or_unpaired_seeds_give_no_verdict() -> None:
    assert targets(_cell([], [0.69, 0.69, 0.69]))["of_ideal"] is None
    assert targets_line(targets(_cell([], []))) == "targets: no steady window"
    # a seed with no window under one policy: the seeds no longer pair up
    assert targets(_cell([0.69, 0.69, 0.69], [0.69, 0.69]))["minus_same_cost"] is None

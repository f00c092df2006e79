"""The command line as API.md describes it."""

from __future__ import annotations

import subprocess
import sys


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args], capture_output=True, text=True, timeout=120
    )


def test_predict_prints_one_line_per_step_and_the_misses() -> None:
    for algorithm in ("seed", "lightpath"):
        result = _run("predict", "--algorithm", algorithm, "P", "D", "P", "D", "P", "D")
        assert result.returncode == 0, result.stderr
        lines = result.stdout.strip().splitlines()
        assert len(lines) == 7
        assert lines[0].startswith("1 observed=P installed=-") and lines[0].endswith("miss")
        assert lines[-1].startswith("misses=")
        misses = int(lines[-1].split("=")[1])
        assert misses == sum(1 for line in lines[:-1] if line.endswith(" miss"))
        assert lines[-2].endswith("hit"), "a period of 2 is learned within six steps"


def test_seed_fails_on_a_nested_pattern_where_lightpath_learns() -> None:
    plans = "E A E " * 6
    seed = _run("predict", "--algorithm", "seed", *plans.split())
    light = _run("predict", "--algorithm", "lightpath", *plans.split())
    misses = {
        name: int(r.stdout.strip().splitlines()[-1].split("=")[1])
        for name, r in (("seed", seed), ("lightpath", light))
    }
    assert misses["lightpath"] <= 2 * 3 + 1
    assert misses["lightpath"] < misses["seed"]


def test_unknown_algorithm_is_refused() -> None:
    result = _run("predict", "--algorithm", "oracle", "P")
    assert result.returncode == 2
    assert "seed" in result.stderr

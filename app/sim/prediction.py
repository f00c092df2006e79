"""Per-phase rewiring of one job's circuits: predictor warm-up stepped, steady state counted.

A job's iteration shows the network the same phases in the same order, each
reduced to a plan id (`plan_signature.classify_plan` of its pod demand). This
module walks those phases through the engine's predictor (`predictor.step`)
and the engine's exposure rule (`preinstall.exposed_reconfig_s`):

- before each phase the fabric pre-installs the predicted plan during the compute
  gap (when it differs from the circuits held): one reconfiguration, hidden up
  to the gap;
- at the phase the demanded plan is compared with what is held: equal costs
  nothing more, different means rewiring after the demand came (the whole
  reconfiguration latency is exposed, one more reconfiguration);
- a phase without inter-pod traffic (`plan-idle`) needs no circuits: it keeps
  whatever is held and costs nothing;
- the first phase with inter-pod traffic finds the topology planned at placement,
  installed during the job's first compute gap.

Steady state: the walk goes iteration by iteration until three consecutive
iterations cost the same and show the same per-phase hits and misses; from
then on every iteration is taken to do the same (a correct queue of a
stationary pattern stays correct for both predictors; the seed algorithm on a
pattern like `E A E` misses every phase for ever), so the rest is counted
analytically (hits per period). `walk_rewiring(..., detect_steady=False)` steps every
iteration; tests check both agree.

No I/O; calls only engine functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from app.engine.plan_signature import EMPTY_PLAN_ID
from app.engine.predictor import new_predictor, step
from app.engine.preinstall import exposed_reconfig_s, should_preinstall

# The pp+dp topology installed at placement and held while the period is learnt;
# every phase runs on it (slower than on its own plan, never unroutable).
COMBINED_PLAN_ID = "plan-combined"

# Warm-up longer than this many iterations is cut: the last iteration walked is
# taken as the steady state (never reached by the patterns the simulator makes).
MAX_WARMUP_ITERATIONS = 64


@dataclass(frozen=True, slots=True)
class IterationCost:
    """Reconfiguration cost of one iteration: exposed seconds and OXC reconfigurations."""

    exposed_s: float
    reconfigurations: int


@dataclass(frozen=True, slots=True)
class RewiringOutcome:
    """Per-iteration costs of the warm-up, the steady cost, and prediction counts."""

    warmup: tuple[IterationCost, ...]  # iterations 0 .. len-1, walked phase by phase
    steady: IterationCost  # every later iteration
    warmup_hits: int
    warmup_misses: int
    phases_per_iteration: int
    predicted: bool  # a predictor ran (hits/misses are meaningful)
    steady_hits: int = 0  # hits per steady iteration (the rest of its phases are misses)

    def hits(self, iterations: int) -> int:
        """Prediction hits over `iterations` iterations."""
        if not self.predicted:
            return 0
        extra = max(0, iterations - len(self.warmup)) * self.steady_hits
        return self._warm(iterations)[0] + extra

    def misses(self, iterations: int) -> int:
        """Prediction misses over `iterations` iterations."""
        if not self.predicted:
            return 0
        steady_misses = self.phases_per_iteration - self.steady_hits
        extra = max(0, iterations - len(self.warmup)) * steady_misses
        return self._warm(iterations)[1] + extra

    def _warm(self, iterations: int) -> tuple[int, int]:
        if iterations >= len(self.warmup):
            return self.warmup_hits, self.warmup_misses
        raise ValueError("hits/misses of a partial warm-up are not kept; walk it instead")

    def cost_of(self, iteration: int) -> IterationCost:
        """The cost of iteration `iteration` (0-based)."""
        return self.warmup[iteration] if iteration < len(self.warmup) else self.steady


def walk_rewiring(
    plans: Sequence[str],
    gaps_s: Sequence[float],
    reconfig_ms: float,
    *,
    algorithm: str | None,
    per_phase: bool = True,
    iterations: int | None = None,
    detect_steady: bool = True,
) -> RewiringOutcome:
    """Walk the phases `plans` (one iteration, with the compute gap before each).

    `algorithm` is the predictor (`seed`, `lightpath`) or None for none (reactive).
    `per_phase` False holds one topology for the whole job (the pp+dp plan): only the
    installation at placement costs, though a predictor still observes (counts).
    With a predictor, the placement-time pp+dp topology is held while the period is
    still unknown, so warm-up misses cost no reconfiguration; afterwards phases are
    pre-installed one by one only when every phase's reconfiguration fits the compute
    gap before it (`preinstall.should_preinstall`), else the pp+dp topology stays.
    """
    if len(plans) != len(gaps_s):
        raise ValueError("one gap per phase")
    state = new_predictor(algorithm) if algorithm is not None else None
    if state is not None and per_phase and not fits_every_gap(plans, gaps_s, reconfig_ms):
        per_phase = False  # a predictor holds the pp+dp topology rather than expose rewiring
    held: str | None = None
    confirmed = False
    warm: list[IterationCost] = []
    hits = misses = 0
    streak_ok = False
    last_pattern: list[bool] = []
    limit = MAX_WARMUP_ITERATIONS if detect_steady else (iterations or MAX_WARMUP_ITERATIONS)
    if iterations is not None:
        limit = min(limit, iterations)
    while len(warm) < limit:
        exposed = 0.0
        reconfigs = 0
        pattern: list[bool] = []
        for plan, gap in zip(plans, gaps_s, strict=True):
            preinstalled = False
            # until the predictor has confirmed a period, hold the placement-time
            # topology: rewiring on guesses would expose reconfigurations
            # (confirmed: a period was found and one prediction of it came true)
            learning = state is not None and not confirmed
            if state is not None:
                predicted = state.next_plan
                if (
                    per_phase
                    and not learning
                    and held is not None
                    and predicted is not None
                    and predicted not in (EMPTY_PLAN_ID, held)
                ):
                    held = predicted  # rewired during the compute gap
                    reconfigs += 1
                    preinstalled = True
                state, outcome = step(state, plan)
                confirmed = confirmed or (outcome.hit and state.period is not None)
                hits += outcome.hit
                misses += not outcome.hit
                pattern.append(outcome.hit)
            if plan == EMPTY_PLAN_ID:
                continue
            if held is None:  # the pp+dp topology planned at placement, installed meanwhile
                exposed += max(0.0, reconfig_ms / 1000.0 - gap)
                reconfigs += 1
                held = plan if state is None else COMBINED_PLAN_ID
                continue
            if not per_phase or learning or held == COMBINED_PLAN_ID:
                continue  # one topology for every phase (or still learning the period)
            exposed += exposed_reconfig_s(
                reconfig_ms, gap, preinstalled=preinstalled, installed_plan=held, demanded_plan=plan
            )
            if held != plan:
                reconfigs += 1
                held = plan
        cost = IterationCost(exposed, reconfigs)
        steady_now = bool(warm) and warm[-1] == cost and pattern == last_pattern
        warm.append(cost)
        last_pattern = pattern
        if detect_steady and steady_now and streak_ok:
            break
        streak_ok = steady_now
    steady = warm[-1] if warm else IterationCost(0.0, 0)
    return RewiringOutcome(
        tuple(warm),
        steady,
        hits,
        misses,
        len(plans),
        state is not None and bool(plans),
        sum(last_pattern),
    )


def fits_every_gap(plans: Sequence[str], gaps_s: Sequence[float], reconfig_ms: float) -> bool:
    """Whether each phase with traffic can be pre-installed inside the compute gap before it.

    The engine's rule (`preinstall.should_preinstall`) on a stationary iteration: the
    interval before a phase in the last cycle recurs in the next.
    """
    return all(
        should_preinstall([-gap, 0.0], 0.0, reconfig_ms, period=1).fits
        for plan, gap in zip(plans, gaps_s, strict=True)
        if plan != EMPTY_PLAN_ID
    )

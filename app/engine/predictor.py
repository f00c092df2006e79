"""Cycle predictors: learn a job's sequence of topology plans and say which to install next.

The network cannot see iterations; it sees one communication phase after another,
each reduced to a plan id (see `plan_signature`). A predictor consumes that
sequence one plan at a time and names the plan to wire during the compute gap
before the next phase. Two algorithms share one interface:

- `seed`: SPEC section 5's normative pseudo-code, transcribed line for line. It is
  the baseline every improvement is measured against, so it keeps its flaws.
- `lightpath`: an online minimal-period predictor. Every candidate period p (1 to
  `max_period`) is an expert predicting "the plan seen p phases ago"; the expert
  with the fewest recent mispredictions (exponentially decayed) leads, the
  smallest period wins ties. That learns a stationary period p within 2p-1
  misses, including periods whose first plan recurs inside them (`E A E`), and
  when the pattern changes the new period's expert overtakes as soon as it is
  right again, because old mistakes fade. A single odd phase (a glitch) is not
  learnt as part of the pattern: an expert whose plan p phases ago was its only
  recent surprise predicts the plan 2p phases ago instead. A phase inserted or
  dropped (a report sent twice or lost) shifts every later phase by a place: the
  leader, once it has predicted a whole period without a miss, keeps the lead
  unless an expert that has done the same is better by half a mistake, so the
  longer periods that line up with the shift for a while do not take over.

States are frozen values and `step` is pure: (state, plan) -> (new state, Step).
Pure module: no I/O, no clock, no FastAPI/SQLAlchemy/Redis/pydantic imports.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

SEED = "seed"
LIGHTPATH = "lightpath"
ALGORITHMS = (SEED, LIGHTPATH)
DEFAULT_ALGORITHM = LIGHTPATH

# Longest period the lightpath predictor learns, in phases. Per-report cost is
# O(max_period) (about 1 us per expert), and 128 phases hold a GPipe/1F1B
# iteration reported per pipeline phase for any configuration in the shipped tables.
DEFAULT_MAX_PERIOD = 128
# Per-phase decay of an expert's misprediction score: a mistake weighs half after
# about 2.4 phases, so after a pattern change the new period's expert overtakes
# the old one within a few phases of being right, while within a stationary
# pattern the ordering of experts (all hit by the same glitches) is unaffected.
DEFAULT_DECAY = 0.75
# Decay of the scores that choose between the period experts and the seed algorithm:
# slower than DEFAULT_DECAY, so the choice flips only on a sustained difference.
_META_DECAY = 0.95
# How much fewer decayed mispredictions another expert needs to take the lead.
_SWITCH_MARGIN = 0.5
# How much better the seed algorithm's record must be to be followed over an established
# leader: one odd phase inserted costs the period experts a miss more than the seed,
# which then led (and reported its whole history as the period: 121 after one odd
# phase in 120 of `P D`) for as long as both kept hitting.
_PROVEN_SEED_MARGIN = 1.5
# The seed algorithm's queue holds every plan since learning began and grows without
# bound on aperiodic sequences; the embedded copy restarts beyond this length (a
# queue that long predicts nothing the period experts cannot).
_SEED_QUEUE_CAP = 4096


@dataclass(frozen=True, slots=True)
class Step:
    """One report as a predictor saw it: the observed plan, what was installed, hit or miss."""

    observed: str
    installed_before: str | None
    hit: bool


# --------------------------------------------------------------------------- seed


@dataclass(frozen=True, slots=True)
class SeedState:
    """The seed algorithm's state: queue Q, cycle count c, position in Q, installed plan."""

    q: tuple[str, ...] = ()
    c: int = 0
    pos: int = 0
    installed: str | None = None
    hits: int = 0
    misses: int = 0

    @property
    def algorithm(self) -> str:
        return SEED

    @property
    def period(self) -> int | None:
        """The learned period (len Q) once a cycle was detected, else None."""
        return len(self.q) if self.c > 0 else None

    @property
    def cycle_count(self) -> int:
        return self.c

    @property
    def queue(self) -> tuple[str, ...]:
        return self.q

    @property
    def next_plan(self) -> str | None:
        """The plan the fabric holds for the next demand."""
        return self.installed


def step_seed(state: SeedState, plan: str) -> tuple[SeedState, Step]:
    """SPEC section 5's pseudo-code for one demand with plan `plan` (normative; do not tune)."""
    q, c, pos, installed = state.q, state.c, state.pos, state.installed
    hit = installed == plan
    before = installed
    if c == 0 and not q:  # (a) first demand ever: nothing installed
        q = (plan,)
        installed = plan
    elif c == 0:  # (b) still learning: the last topology was kept
        if plan == q[0]:
            c = 1
            pos = 1 % len(q)
            if pos == 0:  # a queue of one plan wraps at once
                c = 2
        else:
            q = q + (plan,)
        installed = plan
    elif hit:  # (c) queue known, installed == Q[pos]
        pos += 1
        if pos == len(q):  # a full pass
            pos = 0
            c += 1
    else:  # the detected period was only a part: all plans seen since learning began
        q = q * c + q[:pos] + (plan,)
        c = 0
        pos = 0
        installed = plan
    if c > 0:
        installed = q[pos]  # rewire during compute
    new = SeedState(
        q, c, pos, installed, state.hits + (1 if hit else 0), state.misses + (0 if hit else 1)
    )
    return new, Step(plan, before, hit)


# ---------------------------------------------------------------------- lightpath


@dataclass(frozen=True, slots=True)
class LightpathState:
    """The lightpath predictor's state; index i below means the expert for period i+1.

    `history` holds the last 3*max_period plans (the oldest an expert looks at);
    `count` is how many plans were ever observed, so the plan observed at absolute
    position k (0-based) is history[k - (count - len(history))].
    """

    max_period: int = DEFAULT_MAX_PERIOD
    decay: float = DEFAULT_DECAY
    history: tuple[str, ...] = ()
    count: int = 0
    scores: tuple[float, ...] = ()  # decayed mispredictions per available expert
    predictions: tuple[str, ...] = ()  # each available expert's plan for the next phase
    raw_surprise_at: tuple[int, ...] = ()  # last k with plan[k] != plan[k - p], -1 if none
    leader: int = 0  # period of the leading expert, 0 before any plan was seen
    leader_since: int = 0  # count when the leader last mispredicted or took over
    leader_proven: bool = False  # it predicted a whole period (2+ phases) without a miss
    leader_record: int = 0  # the most phases it predicted in a row since it led
    expert_plan: str | None = None  # the leading period expert's plan for the next phase
    seed: SeedState = SeedState()  # the seed algorithm run alongside, as a safety net
    expert_score: float = 0.0  # decayed mispredictions of the period experts' choice
    seed_score: float = 0.0  # decayed mispredictions of the seed algorithm
    installed: str | None = None
    hits: int = 0
    misses: int = 0

    def __post_init__(self) -> None:
        if self.max_period < 1 or not 0.0 < self.decay < 1.0:
            raise ValueError("max_period must be >= 1 and decay in (0, 1)")

    @property
    def algorithm(self) -> str:
        return LIGHTPATH

    @property
    def follows_seed(self) -> bool:
        """True while the seed algorithm has the better recent record and is followed."""
        return _follows_seed(self.seed_score, self.expert_score, self._established)

    @property
    def _established(self) -> bool:
        """The leader once predicted 4 whole periods in a row (at least 8 phases): a
        pattern of its own, not a run of one plan inside a longer one."""
        return self.leader >= 2 and self.leader_record >= max(8, 4 * self.leader)

    @property
    def period(self) -> int | None:
        """The period being followed, None before the second plan."""
        if self.follows_seed:
            return self.seed.period
        return self.leader if self.count >= 2 and self.leader else None

    @property
    def cycle_count(self) -> int:
        """Full periods predicted without a miss."""
        if self.follows_seed:
            return self.seed.cycle_count
        if not self.leader:
            return 0
        return (self.count - self.leader_since) // self.leader

    @property
    def queue(self) -> tuple[str, ...]:
        """One learned period, starting with the next plan (what will be installed)."""
        if self.follows_seed:
            return self.seed.queue
        p = self.period
        if p is None:
            return (self.installed,) if self.installed is not None else ()
        # The leader predicts plan[k - p] for every future k; the next p of those
        # are the last p plans observed, the first possibly glitch-repaired.
        tail = self.history[len(self.history) - p :]
        if self.installed is not None and tail and tail[0] != self.installed:
            tail = (self.installed,) + tail[1:]
        return tail

    @property
    def next_plan(self) -> str | None:
        """The plan the fabric holds for the next demand."""
        return self.installed


def _follows_seed(seed_score: float, expert_score: float, established: bool) -> bool:
    """Follow the seed algorithm while its recent record is strictly better, by more than
    one and a half mistakes over an established leader (`LightpathState._established`)."""
    return seed_score < expert_score - (_PROVEN_SEED_MARGIN if established else 0.0)


def new_lightpath_state(
    max_period: int = DEFAULT_MAX_PERIOD, decay: float = DEFAULT_DECAY
) -> LightpathState:
    """An empty lightpath predictor with the given limits."""
    return LightpathState(max_period=max_period, decay=decay)


def step_lightpath(state: LightpathState, plan: str) -> tuple[LightpathState, Step]:
    """Observe one phase's plan: score every period expert, then pick the next plan."""
    before = state.installed
    hit = before == plan
    n = state.count  # absolute position of `plan`
    hist = state.history
    base = n - len(hist)  # absolute position of hist[0]
    decay = state.decay

    # 1. Score the experts that made a prediction for position n.
    scores = list(state.scores)
    surprise = list(state.raw_surprise_at)
    for i, predicted in enumerate(state.predictions):
        scores[i] = scores[i] * decay + (0.0 if predicted == plan else 1.0)
        if hist[n - (i + 1) - base] != plan:  # the raw lag comparison, for glitch repair
            surprise[i] = n
    leader_since = state.leader_since
    # a whole period (at least two phases) predicted without a miss since it led
    proven = state.leader_proven or (
        state.leader > 0 and n - state.leader_since >= max(2, state.leader)
    )
    if not hit:
        leader_since = n + 1

    # 2. Append the plan; a new expert (period n) joins. It has no track record, so it
    # starts one mistake behind the best expert: it leads only once every shorter
    # period has been wrong since, never just because the others had a recent miss.
    hist = hist + (plan,)
    if len(hist) > 3 * state.max_period:
        hist = hist[len(hist) - 3 * state.max_period :]
    n += 1
    base = n - len(hist)
    if len(scores) < min(n, state.max_period):
        scores.append(min(scores) + 1.0 if scores else 0.0)
        surprise.append(-1)

    # 3. Each expert predicts position n: the plan p phases ago, unless that plan was
    # its one recent surprise and the plans 2p and 3p ago agree (a glitch, not a change).
    predictions: list[str] = []
    best = 0
    seasoned = 0  # the best of the experts that predicted a whole period of their own
    for i in range(len(scores)):
        p = i + 1
        guess = hist[n - p - base]
        if (
            surprise[i] == n - p
            and p >= 2
            and n - 3 * p >= base
            # the phase before the surprise was as p phases earlier: one odd phase, not
            # a phase inserted or dropped (which shifts every later one by a place)
            and hist[n - p - 1 - base] == hist[n - 2 * p - 1 - base]
        ):
            older = hist[n - 2 * p - base]
            if older == hist[n - 3 * p - base]:
                guess = older
        predictions.append(guess)
        if scores[i] < scores[best]:
            best = i
        if scores[i] < scores[seasoned] and 2 * p <= n:
            seasoned = i
    # A proven leader keeps the lead unless an expert that predicted a whole period of
    # its own is better by half a mistake: a phase inserted or dropped costs the true
    # period's expert a few misses in a row, while a longer period (often one that just
    # joined) happens to line up with the shift for a while.
    incumbent = state.leader - 1
    if proven and 0 <= incumbent < len(scores):
        if scores[seasoned] <= scores[incumbent] - _SWITCH_MARGIN:
            best = seasoned
        else:
            best = incumbent
    leader = best + 1
    record = max(state.leader_record, n - leader_since)
    if leader != state.leader:
        leader_since = n
        proven = False
        record = 0

    # 4. The safety net: follow the seed algorithm only while its recent record is
    # strictly better, so lightpath is never much worse than seed on any sequence
    # (it pays at most the few misses it takes the slowly decayed scores to cross).
    expert_score = state.expert_score * _META_DECAY + (0.0 if state.expert_plan == plan else 1.0)
    seed_score = state.seed_score * _META_DECAY + (0.0 if state.seed.installed == plan else 1.0)
    seed = state.seed if len(state.seed.q) <= _SEED_QUEUE_CAP else SeedState()
    seed, _ = step_seed(seed, plan)
    expert_plan = predictions[best]
    established = leader >= 2 and record >= max(8, 4 * leader)
    on_seed = _follows_seed(seed_score, expert_score, established)
    installed = seed.installed if on_seed else expert_plan
    new = replace(
        state,
        history=hist,
        count=n,
        scores=tuple(scores),
        predictions=tuple(predictions),
        raw_surprise_at=tuple(surprise),
        leader=leader,
        leader_since=leader_since,
        leader_proven=proven,
        leader_record=record,
        expert_plan=expert_plan,
        seed=seed,
        expert_score=expert_score,
        seed_score=seed_score,
        installed=installed,
        hits=state.hits + (1 if hit else 0),
        misses=state.misses + (0 if hit else 1),
    )
    return new, Step(plan, before, hit)


# ---------------------------------------------------------------------- interface

PredictorState = SeedState | LightpathState


def new_predictor(algorithm: str = DEFAULT_ALGORITHM) -> PredictorState:
    """An empty predictor of the named algorithm (`seed` or `lightpath`)."""
    if algorithm == SEED:
        return SeedState()
    if algorithm == LIGHTPATH:
        return LightpathState()
    raise ValueError(f"unknown predictor algorithm {algorithm!r}; known: {', '.join(ALGORITHMS)}")


def step(state: PredictorState, plan: str) -> tuple[PredictorState, Step]:
    """Feed one observed plan to either predictor."""
    if isinstance(state, SeedState):
        return step_seed(state, plan)
    return step_lightpath(state, plan)


def run_predictor(algorithm: str, plans: Sequence[str]) -> list[Step]:
    """Run a fresh predictor over a whole plan sequence and return every step."""
    state = new_predictor(algorithm)
    steps: list[Step] = []
    for plan in plans:
        state, s = step(state, plan)
        steps.append(s)
    return steps


def count_misses(steps: Sequence[Step]) -> int:
    """Number of steps whose installed plan was not the observed one."""
    return sum(1 for s in steps if not s.hit)


def format_steps(steps: Sequence[Step]) -> list[str]:
    """The `lightpath predict` output: one line per step, then `misses=N`."""
    width = len(str(len(steps)))
    lines = [
        f"{i:>{width}} observed={s.observed} installed={s.installed_before or '-'} "
        f"{'hit' if s.hit else 'miss'}"
        for i, s in enumerate(steps, 1)
    ]
    lines.append(f"misses={count_misses(steps)}")
    return lines

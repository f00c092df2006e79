"""Pod circuit matrices for one phase: integer, symmetric, within each pod's uplink ports.

Pure functions; must not import anything that does I/O (no FastAPI, SQLAlchemy,
Redis, pydantic) or read a clock. `plan_circuits` is the fast online path (greedy
water-filling plus two-hop routing), `plan_circuits_exact` the exact MILP
(scipy `milp`/HiGHS) for small instances, tests and benchmarks.

Model. D[p][q] bytes must go from pod p to pod q. A circuit is full duplex: c
circuits between p and q carry c * port_gbps each way. Traffic goes direct or
over one intermediate pod r (p -> r -> q, relayed by r's electrical Clos).
The phase completion time T is the smallest time in which every link carries
its load: load(a->b) <= c_ab * B_port * T. MLU is max load / (capacity * window)
with window = the port bound max_p max(out_p, in_p) / (ports_p * B_port) unless
given, so MLU = T / window: 1.0 means as fast as the pods' uplinks allow.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .memo import Memo
from .traffic import DemandMatrix

if TYPE_CHECKING:  # numpy and scipy load when the exact solver first runs (start-up time)
    import numpy as np

_SEARCH_STEPS = 40  # bisection steps on T: relative precision ~1e-6 after bracketing
_REL_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class PodCircuits:
    """Symmetric integer circuit counts between pods; the diagonal is zero."""

    pod_ids: tuple[str, ...]
    counts: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        n = len(self.pod_ids)
        if len(self.counts) != n or any(len(r) != n for r in self.counts):
            raise ValueError("circuit matrix must be square over pod_ids")
        for i in range(n):
            if self.counts[i][i] != 0:
                raise ValueError("a pod has no circuit to itself")
            for j in range(i + 1, n):
                if self.counts[i][j] != self.counts[j][i] or self.counts[i][j] < 0:
                    raise ValueError("circuit matrix must be symmetric and non-negative")

    @staticmethod
    def from_pairs(pod_ids: Sequence[str], pairs: Iterable[tuple[str, str, int]]) -> PodCircuits:
        """Build from (pod_a, pod_b, count) entries; repeated pairs add up."""
        index = {p: i for i, p in enumerate(pod_ids)}
        rows = [[0] * len(pod_ids) for _ in pod_ids]
        for a, b, n in pairs:
            if n < 0:
                raise ValueError("circuit matrix must be symmetric and non-negative")
            if a != b and n:
                rows[index[a]][index[b]] += n
                rows[index[b]][index[a]] += n
        # square, symmetric, non-negative with a zero diagonal by construction: the
        # O(pods^2) check of __post_init__ is skipped (every re-plan builds several)
        built = object.__new__(PodCircuits)
        object.__setattr__(built, "pod_ids", tuple(pod_ids))
        object.__setattr__(built, "counts", tuple(map(tuple, rows)))
        return built

    def get(self, a: str, b: str) -> int:
        """Circuits between pods `a` and `b` (0 for unknown pods)."""
        if a not in self.pod_ids or b not in self.pod_ids:
            return 0
        return self.counts[self.pod_ids.index(a)][self.pod_ids.index(b)]

    def row_sum(self, pod: str) -> int:
        """Ports of `pod` these circuits use."""
        return sum(self.counts[self.pod_ids.index(pod)]) if pod in self.pod_ids else 0

    def pairs(self) -> tuple[tuple[str, str, int], ...]:
        """(pod_a, pod_b, count) with a before b in pod order, count > 0."""
        ids = self.pod_ids
        return tuple(
            (ids[i], ids[j], c)
            for i, row in enumerate(self.counts)
            if any(row)  # most pods of a cluster-wide matrix have none: skipped in C
            for j in range(i + 1, len(ids))
            if (c := row[j])
        )

    @property
    def total(self) -> int:
        """Circuits in the matrix (each counted once)."""
        return sum(map(sum, self.counts)) // 2

    def to_dict(self) -> dict[str, dict[str, int]]:
        """The `pod_circuits` shape of GET /v1/topology (both directions listed)."""
        out: dict[str, dict[str, int]] = {}
        for a, b, c in self.pairs():
            out.setdefault(a, {})[b] = c
            out.setdefault(b, {})[a] = c
        return out

    def gbps(self, port_gbps: float) -> dict[tuple[str, str], float]:
        """Gb/s per sorted pod pair: count * port_gbps."""
        return {(min(a, b), max(a, b)): c * port_gbps for a, b, c in self.pairs()}


@dataclass(frozen=True, slots=True)
class PathShare:
    """Bytes of the src -> dst demand that take `path` (pod ids, 2 or 3 of them)."""

    src: str
    dst: str
    path: tuple[str, ...]
    size_bytes: float


@dataclass(frozen=True, slots=True)
class CircuitPlan:
    """The topology for one phase: circuits, completion time, MLU and routed paths."""

    circuits: PodCircuits
    completion_s: float
    mlu: float
    routes: tuple[PathShare, ...]
    solver: str
    reason: str = ""


def port_bound_s(demand: DemandMatrix, ports: Mapping[str, int], port_gbps: float) -> float:
    """max over pods of max(bytes out, bytes in) / (ports * B_port): no topology beats it."""
    bw = port_gbps * 1e9 / 8
    worst = 0.0
    for i, p in enumerate(demand.pod_ids):
        out_b = sum(demand.bytes[i])
        in_b = sum(row[i] for row in demand.bytes)
        if out_b or in_b:
            cap = ports.get(p, 0) * bw
            worst = max(worst, math.inf if cap <= 0 else max(out_b, in_b) / cap)
    return worst


def _route_at(
    demand: list[list[float]], cap: list[list[float]], t: float, record: bool = True
) -> list[tuple[int, int, int, float]] | None:
    """Greedy direct + two-hop routing within capacity * t; (src, dst, via|-1, bytes) or None.

    Without `record`, only whether it fits: [] or None (the search on t asks that
    some 40 times per evaluation, and listing every pair's route was most of it).
    """
    n = len(demand)
    slack = [[cap[a][b] * t - demand[a][b] for b in range(n)] for a in range(n)]
    moves: list[tuple[int, int, int, float]] = []
    excess = sorted(
        ((-slack[p][q], p, q) for p in range(n) for q in range(n) if p != q and slack[p][q] < 0),
        reverse=True,
    )
    for _, p, q in excess:
        need = -slack[p][q]
        slack[p][q] = 0.0
        direct = demand[p][q] - need
        if direct > 0 and record:
            moves.append((p, q, -1, direct))
        vias = sorted(
            (r for r in range(n) if r != p and r != q),
            key=lambda r: -min(slack[p][r], slack[r][q]),
        )
        for r in vias:
            m = min(need, slack[p][r], slack[r][q])
            if m <= 0:
                break
            slack[p][r] -= m
            slack[r][q] -= m
            need -= m
            if record:
                moves.append((p, q, r, m))
            if need <= _REL_EPS * demand[p][q]:
                break
        if need > _REL_EPS * demand[p][q]:
            return None
    if not record:
        return moves
    over = {(p, q) for _, p, q in excess}
    moves += [
        (p, q, -1, demand[p][q])
        for p in range(n)
        for q in range(n)
        if p != q and demand[p][q] > 0 and (p, q) not in over
    ]
    return moves


# evaluate_circuits is pure, and the controller asks the same of it every iteration
# of a job (each phase of its learned cycle on each candidate topology)
_EVALUATED: Memo[CircuitPlan] = Memo(8192)


def evaluate_circuits(
    demand: DemandMatrix,
    circuits: PodCircuits,
    ports: Mapping[str, int],
    port_gbps: float,
    window_s: float | None = None,
    solver: str = "greedy",
) -> CircuitPlan:
    """Completion time, MLU and paths of `demand` on `circuits` with greedy two-hop routing."""
    key = (
        demand,
        circuits,
        tuple(ports.get(p, 0) for p in demand.pod_ids),
        port_gbps,
        window_s,
        solver,
    )
    return _EVALUATED.get(
        key, lambda: _evaluate_circuits(demand, circuits, ports, port_gbps, window_s, solver)
    )


def _evaluate_circuits(
    demand: DemandMatrix,
    circuits: PodCircuits,
    ports: Mapping[str, int],
    port_gbps: float,
    window_s: float | None,
    solver: str,
) -> CircuitPlan:
    pods = demand.pod_ids
    d = [list(r) for r in demand.bytes]
    bw = port_gbps * 1e9 / 8
    cap = [[circuits.get(a, b) * bw for b in pods] for a in pods]
    if demand.total_bytes <= 0:
        return CircuitPlan(circuits, 0.0, 0.0, (), solver, "no inter-pod demand")
    lo = port_bound_s(demand, ports, port_gbps)
    if not math.isfinite(lo):
        return CircuitPlan(
            circuits, math.inf, math.inf, (), solver, "a pod with demand has no uplink ports"
        )
    direct = [
        d[p][q] / cap[p][q] if cap[p][q] > 0 else math.inf
        for p in range(len(pods))
        for q in range(len(pods))
        if d[p][q] > 0
    ]
    hi = max(direct)
    if not math.isfinite(hi):
        hi = max(lo, 1e-9)
        while _route_at(d, cap, hi, record=False) is None:
            hi *= 4
            if hi > 1e12:
                return CircuitPlan(
                    circuits,
                    math.inf,
                    math.inf,
                    (),
                    solver,
                    "some demand has neither a circuit nor a two-hop path",
                )
    lo = min(lo, hi)
    for _ in range(_SEARCH_STEPS):
        if hi - lo <= 1e-6 * hi:
            break
        mid = (lo + hi) / 2
        if _route_at(d, cap, mid, record=False) is None:
            lo = mid
        else:
            hi = mid
    moves = _route_at(d, cap, hi) or []
    return _plan_from_moves(demand, circuits, ports, port_gbps, hi, moves, window_s, solver)


def _plan_from_moves(
    demand: DemandMatrix,
    circuits: PodCircuits,
    ports: Mapping[str, int],
    port_gbps: float,
    t: float,
    moves: Sequence[tuple[int, int, int, float]],
    window_s: float | None,
    solver: str,
) -> CircuitPlan:
    pods = demand.pod_ids
    bw = port_gbps * 1e9 / 8
    load: dict[tuple[int, int], float] = {}
    routes = []
    for p, q, r, size in moves:
        hops = [(p, q)] if r < 0 else [(p, r), (r, q)]
        for h in hops:
            load[h] = load.get(h, 0.0) + size
        path = (pods[p], pods[q]) if r < 0 else (pods[p], pods[r], pods[q])
        routes.append(PathShare(pods[p], pods[q], path, size))
    window = window_s if window_s is not None else port_bound_s(demand, ports, port_gbps)
    mlu = max(
        (size / (circuits.get(pods[a], pods[b]) * bw * window) for (a, b), size in load.items()),
        default=0.0,
    )
    return CircuitPlan(circuits, t, mlu, tuple(routes), solver)


def _water_fill(
    pods: Sequence[str], weight: Mapping[tuple[int, int], float], ports: Mapping[str, int]
) -> list[list[int]]:
    """Min-max direct circuits: one per demanded pair by weight, then to max weight/count."""
    n = len(pods)
    spare = [ports.get(p, 0) for p in pods]
    c = [[0] * n for _ in range(n)]
    heap: list[tuple[float, int, int]] = []
    for (i, j), w in sorted(weight.items(), key=lambda kv: (-kv[1], kv[0])):
        if spare[i] > 0 and spare[j] > 0:
            spare[i] -= 1
            spare[j] -= 1
            c[i][j] = c[j][i] = 1
            heapq.heappush(heap, (-w / 2, i, j))
    while heap:
        _, i, j = heapq.heappop(heap)
        if spare[i] > 0 and spare[j] > 0:
            spare[i] -= 1
            spare[j] -= 1
            c[i][j] += 1
            c[j][i] += 1
            # the pair's time per byte if it got one more circuit: w / (c + 1)
            heapq.heappush(heap, (-weight[(i, j)] / (c[i][j] + 1), i, j))
    return c


def _proportional(
    pods: Sequence[str],
    weight: Mapping[tuple[int, int], float],
    ports: Mapping[str, int],
    relay_share: float = 0.02,
) -> list[list[int]]:
    """Symmetric Sinkhorn scaling of the weights to each pod's ports, then rounding.

    x_ij = a_i * W_ij * a_j with row sums -> ports; W gets a small uniform term
    (relay_share of the largest weight) among active pods so spare ports become
    two-hop relays. Floors first, then largest remainders while ports remain.
    """
    n = len(pods)
    active = sorted({i for e in weight for i in e})
    top = max(weight.values(), default=0.0) or 1.0
    w = [[0.0] * n for _ in range(n)]
    for i in active:
        for j in active:
            if i != j:
                w[i][j] = weight.get((min(i, j), max(i, j)), 0.0) / top + relay_share
    budget = [float(ports.get(p, 0)) for p in pods]
    scale = [1.0] * n
    for _ in range(50):
        for i in active:
            row = sum(w[i][j] * scale[j] for j in active)
            # damped symmetric update: a_i <- sqrt(a_i * u_i / (W a)_i)
            scale[i] = math.sqrt(scale[i] * budget[i] / row) if row > 0 else 0.0
    x = [[0.0] * n for _ in range(n)]
    c = [[0] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            x[i][j] = x[j][i] = w[i][j] * scale[i] * scale[j]
            c[i][j] = c[j][i] = int(x[i][j])
    for i in range(n):
        while sum(c[i]) > budget[i]:
            j = max(range(n), key=lambda k: c[i][k])
            c[i][j] -= 1
            c[j][i] -= 1
    spare = [int(budget[i]) - sum(c[i]) for i in range(n)]
    rest = sorted(
        ((x[i][j] - c[i][j], i, j) for i in range(n) for j in range(i + 1, n) if x[i][j] > 0),
        reverse=True,
    )
    for _, i, j in rest:
        if spare[i] > 0 and spare[j] > 0:
            c[i][j] += 1
            c[j][i] += 1
            spare[i] -= 1
            spare[j] -= 1
    return c


def _add_spare_circuits(
    demand: DemandMatrix,
    c: list[list[int]],
    ports: Mapping[str, int],
    port_gbps: float,
    window_s: float | None,
    rounds: int,
) -> CircuitPlan:
    """Hill-climb: add the spare-port circuit that cuts completion time most, `rounds` times."""
    pods = demand.pod_ids
    n = len(pods)
    best = evaluate_circuits(demand, _to_circuits(pods, c), ports, port_gbps, window_s)
    active = {i for i in range(n) if any(demand.bytes[i]) or any(r[i] for r in demand.bytes)}
    bw = port_gbps * 1e9 / 8
    d = [list(r) for r in demand.bytes]
    cap = [[c[a][b] * bw for b in range(n)] for a in range(n)]
    for _ in range(rounds):
        spare = [i for i in range(n) if ports.get(pods[i], 0) > sum(c[i])]
        cands = [(i, j) for i in spare for j in spare if i < j and (i in active or j in active)]
        if not cands or best.completion_s == 0:
            break
        pick: tuple[int, int] | None = None
        for i, j in cands:
            # one routing check at the time to beat rules out most candidates
            # before the full bisection (routing within capacity * t is monotone in t)
            beat = best.completion_s * (1 - 1e-6)
            cap[i][j] += bw
            cap[j][i] += bw
            helps = math.isinf(beat) or _route_at(d, cap, beat, record=False) is not None
            cap[i][j] -= bw
            cap[j][i] -= bw
            if not helps:
                continue
            c[i][j] += 1
            c[j][i] += 1
            trial = evaluate_circuits(demand, _to_circuits(pods, c), ports, port_gbps, window_s)
            c[i][j] -= 1
            c[j][i] -= 1
            if trial.completion_s < best.completion_s * (1 - 1e-6):
                best, pick = trial, (i, j)
        if pick is None:
            break
        c[pick[0]][pick[1]] += 1
        c[pick[1]][pick[0]] += 1
        cap[pick[0]][pick[1]] += bw
        cap[pick[1]][pick[0]] += bw
    return best


# plan_circuits is pure and the same job's demand on the same budget comes back
# often (re-allocations that leave a job unchanged, per-phase plans, a job's
# repeated phases)
_PLANNED: Memo[CircuitPlan] = Memo(4096)


def plan_circuits(
    demand: DemandMatrix,
    ports: Mapping[str, int],
    port_gbps: float,
    window_s: float | None = None,
    improve_rounds: int = 4,
    lp_max_pods: int = 8,
) -> CircuitPlan:
    """Fast online plan: the best of min-max water-filling, proportional scaling, uniform.

    Each candidate is then improved by adding spare-port circuits where greedy
    two-hop routing gains; ties go to water-filling. With at most `lp_max_pods`
    active pods the final routing is the optimal LP on the chosen circuits.
    """
    key = (
        demand,
        tuple(sorted((p, n) for p, n in ports.items() if p in demand.pod_ids)),
        port_gbps,
        window_s,
        improve_rounds,
        lp_max_pods,
    )
    return _PLANNED.get(
        key,
        lambda: _plan_circuits(demand, ports, port_gbps, window_s, improve_rounds, lp_max_pods),
    )


def _plan_circuits(
    demand: DemandMatrix,
    ports: Mapping[str, int],
    port_gbps: float,
    window_s: float | None,
    improve_rounds: int,
    lp_max_pods: int,
) -> CircuitPlan:
    pods = demand.pod_ids
    n = len(pods)
    weight = {
        (i, j): max(demand.bytes[i][j], demand.bytes[j][i])
        for i in range(n)
        for j in range(i + 1, n)
        if demand.bytes[i][j] > 0 or demand.bytes[j][i] > 0
    }
    if not weight:
        return CircuitPlan(
            _to_circuits(pods, [[0] * n for _ in pods]),
            0.0,
            0.0,
            (),
            "greedy",
            "no inter-pod demand",
        )
    active = _active_count(demand)
    if active <= 2:  # one pod pair: all its ports to each other, nothing to relay
        c = _water_fill(pods, weight, ports)
        return evaluate_circuits(demand, _to_circuits(pods, c), ports, port_gbps, window_s)
    use_lp = active <= lp_max_pods
    best: CircuitPlan | None = None
    starts = (
        _water_fill(pods, weight, ports),
        _proportional(pods, weight, ports),
        [list(r) for r in uniform_circuits(pods, ports).counts],  # never worse than static
    )
    for start in starts:
        plans = [
            _add_spare_circuits(
                demand, [r[:] for r in start], ports, port_gbps, window_s, improve_rounds
            )
        ]
        if use_lp:
            plans += [
                dataclasses.replace(
                    route_circuits_lp(demand, c, ports, port_gbps, window_s),
                    solver="greedy+lp-routing",
                )
                # in order, without repeats: a set's order follows the pod ids' str
                # hashes, and a tie keeps the first plan, so results changed with
                # PYTHONHASHSEED (one job's PP phase, 1e-9 of a run's JCT)
                for c in dict.fromkeys((_to_circuits(pods, start), plans[0].circuits))
            ]
        for plan in plans:
            if best is None or plan.completion_s < best.completion_s * (1 - 1e-9):
                best = plan
    assert best is not None
    return best


def _active_count(demand: DemandMatrix) -> int:
    n = len(demand.pod_ids)
    return sum(1 for i in range(n) if any(demand.bytes[i]) or any(r[i] for r in demand.bytes))


def _to_circuits(pods: Sequence[str], c: Sequence[Sequence[int]]) -> PodCircuits:
    return PodCircuits(tuple(pods), tuple(tuple(r) for r in c))


def load_solver() -> None:
    """Import the exact solver's libraries now.

    A worker calls this as it starts: otherwise the first arrival it plans pays
    for importing numpy and scipy (~0.4 s) while its job's circuits wait.
    """
    import numpy  # noqa: F401
    import scipy.optimize  # noqa: F401


def plan_circuits_exact(
    demand: DemandMatrix,
    ports: Mapping[str, int],
    port_gbps: float,
    window_s: float | None = None,
    time_limit_s: float = 30.0,
) -> CircuitPlan:
    """Exact MILP (scipy milp/HiGHS): integer circuits and split flows minimising T."""
    return _solve(demand, ports, port_gbps, window_s, time_limit_s, None)


def route_circuits_lp(
    demand: DemandMatrix,
    circuits: PodCircuits,
    ports: Mapping[str, int],
    port_gbps: float,
    window_s: float | None = None,
) -> CircuitPlan:
    """Optimal direct/two-hop routing on fixed circuits (an LP, HiGHS)."""
    return _solve(demand, ports, port_gbps, window_s, 30.0, circuits)


def _solve(
    demand: DemandMatrix,
    ports: Mapping[str, int],
    port_gbps: float,
    window_s: float | None,
    time_limit_s: float,
    fixed: PodCircuits | None,
) -> CircuitPlan:
    """Exact MILP, or with `fixed` circuits the routing LP: max theta = 1/T.

    Variables: c_e (integer, e an unordered pod pair), g_k >= 0 the rate of each
    (src, dst, via) path in port units, theta. Maximise theta subject to
    sum_paths(p,q) g = theta * D[p][q] / D_max, load(a->b) <= c_ab, row sums of c
    <= ports. Then T = D_max / (theta * B_port).
    """
    import numpy as np
    from scipy.optimize import Bounds, LinearConstraint, milp

    pods = demand.pod_ids
    n = len(pods)
    bw = port_gbps * 1e9 / 8
    solver = "exact" if fixed is None else "lp-routing"
    dmax = max((max(r) for r in demand.bytes), default=0.0)
    if dmax <= 0:
        c0 = fixed or _to_circuits(pods, [[0] * n for _ in pods])
        return CircuitPlan(c0, 0.0, 0.0, (), solver, "no inter-pod demand")
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    pair_ix = {p: k for k, p in enumerate(pairs)}
    paths = [
        (p, q, r)
        for p in range(n)
        for q in range(n)
        if p != q and demand.bytes[p][q] > 0
        for r in [-1, *range(n)]
        if r != p and r != q
    ]
    nc, ng = len(pairs), len(paths)
    theta = nc + ng
    nv = theta + 1
    rows: list[np.ndarray] = []
    lbs: list[float] = []
    ubs: list[float] = []

    def add(row: np.ndarray, lb: float, ub: float) -> None:
        rows.append(row)
        lbs.append(lb)
        ubs.append(ub)

    for p in range(n):
        for q in range(n):
            if p != q and demand.bytes[p][q] > 0:
                row = np.zeros(nv)
                for k, (a, b, _) in enumerate(paths):
                    if (a, b) == (p, q):
                        row[nc + k] = 1.0
                row[theta] = -demand.bytes[p][q] / dmax
                add(row, 0.0, 0.0)
    for a in range(n):
        for b in range(n):
            if a == b:
                continue
            row = np.zeros(nv)
            for k, (p, q, r) in enumerate(paths):
                hops = [(p, q)] if r < 0 else [(p, r), (r, q)]
                if (a, b) in hops:
                    row[nc + k] = 1.0
            if row.any():
                row[pair_ix[(min(a, b), max(a, b))]] = -1.0
                add(row, -np.inf, 0.0)
    for p in range(n):
        row = np.zeros(nv)
        for k, (i, j) in enumerate(pairs):
            if p in (i, j):
                row[k] = 1.0
        add(row, 0.0, float(ports.get(pods[p], 0)))
    objective = np.zeros(nv)
    objective[theta] = -1.0
    integrality = np.zeros(nv)
    lower, upper = np.zeros(nv), np.full(nv, np.inf)
    if fixed is None:
        integrality[:nc] = 1
    else:
        for k, (i, j) in enumerate(pairs):
            lower[k] = upper[k] = fixed.get(pods[i], pods[j])
    result = milp(
        objective,
        constraints=LinearConstraint(np.array(rows), np.array(lbs), np.array(ubs)),
        integrality=integrality,
        bounds=Bounds(lower, upper),
        options={"time_limit": time_limit_s},
    )
    if result.x is None or result.x[theta] <= 1e-12:
        c0 = fixed or _to_circuits(pods, [[0] * n for _ in pods])
        why = "some demand has neither a circuit nor a two-hop path"
        return CircuitPlan(c0, math.inf, math.inf, (), solver, why)
    x = result.x
    c = [[0] * n for _ in pods]
    for k, (i, j) in enumerate(pairs):
        c[i][j] = c[j][i] = int(round(x[k]))
    t = dmax / (x[theta] * bw)
    moves = [
        (p, q, r, x[nc + k] * bw * t) for k, (p, q, r) in enumerate(paths) if x[nc + k] > 1e-12
    ]
    return _plan_from_moves(
        demand, _to_circuits(pods, c), ports, port_gbps, t, moves, window_s, solver
    )


def uniform_circuits(pod_ids: Sequence[str], ports: Mapping[str, int]) -> PodCircuits:
    """A static topology: each pod's ports spread evenly over all other pods (round-robin)."""
    n = len(pod_ids)
    c = [[0] * n for _ in range(n)]
    spare = [ports.get(p, 0) for p in pod_ids]
    progress = True
    while progress:
        progress = False
        for i in range(n):
            for j in range(i + 1, n):
                if spare[i] > 0 and spare[j] > 0:
                    c[i][j] += 1
                    c[j][i] += 1
                    spare[i] -= 1
                    spare[j] -= 1
                    progress = True
    return _to_circuits(pod_ids, c)

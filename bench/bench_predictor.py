"""Cycle predictor benchmark: misses of `seed` and `lightpath` on real-shaped jobs, and cost.

Sequences come from real configurations (data/tables: Megatron-LM SC'21
Table 1, Llama 3 405B Table 4) laid out on the seed-15k cluster (75 servers per
pod, one server per TP group), run through GPipe and 1F1B schedules slot by
slot. A report is a run of slots with the same set of inter-pod pairs (an idle
slot ends it); the DP ring AllReduce is one report per iteration. Bytes get the
real per-worker jitter of data/traces/iteration_jitter (PAI 2020, CC BY
4.0): each pair's bytes scale with a worker's time over its median, a worker
slower than 1.5x has only 1/x of its bytes in the report. MoE variants add an
uneven inter-pod AllToAll after the forward and backward passes. Pattern-change
variants switch micro-batch count mid-run, or relabel every plan (another job
arrived and the job's port slice, hence every circuit plan, changed). Collector
restarts send one report twice, or lose one, mid-run: every later phase moves by
a place.

Bounds (exit 1 when missed): total lightpath misses <= 0.6 x seed's; a
stationary pattern of period p costs lightpath at most 2p+1 misses; predictor
cost per report (attribution, pod aggregation, plan id, predictor step) at 25
pods p99 <= 1 ms. Run: .venv/bin/python bench/bench_predictor.py
"""

from __future__ import annotations

import csv
import random
import sys
import time
from collections import defaultdict
from pathlib import Path

from app.engine.cluster import preset
from app.engine.plan_signature import (
    Demand,
    PlanCatalog,
    aggregate_pod_demand,
    attribute_demands,
    classify_plan,
    pod_demand_from_directed,
)
from app.engine.predictor import count_misses, new_predictor, run_predictor, step
from app.engine.traffic import DemandMatrix

SEED = 20240619
DATA = Path(__file__).resolve().parents[1] / "data"
SERVERS_PER_POD = 75  # seed-15k
ITERATIONS = 30
MAX_MICROBATCHES = 12  # the schedule simulation is per slot; more only lengthens steady state


def load_jitter() -> list[list[float]]:
    """Per iteration, every worker's batch time over its median, all four traces."""
    out: list[list[float]] = []
    for job in range(1, 5):
        series: dict[int, list[float]] = defaultdict(list)
        with open(DATA / "traces" / "iteration_jitter" / f"job_{job}_norm.csv") as f:
            for row in csv.DictReader(f):
                series[int(row["worker"])].append(float(row["batch_time_norm"]))
        medians = {w: sorted(v)[len(v) // 2] for w, v in series.items()}
        length = min(len(v) for v in series.values())
        out.extend([series[w][i] / medians[w] for w in sorted(series)] for i in range(length))
    return out


def load_configs() -> list[tuple[str, int, int, int]]:
    """(name, pp, dp, micro-batches per replica) from the two tables."""
    configs = []
    with open(DATA / "tables" / "megatron_sc21_table1.csv") as f:
        for row in csv.DictReader(f):
            pp, dp = int(row["pipeline_parallel"]), int(row["data_parallel_derived"])
            m = int(row["global_batch_size"]) // dp
            configs.append((f"megatron-{row['params_billion']}B", pp, dp, m))
    with open(DATA / "tables" / "llama3_405b_table4.csv") as f:
        for row in csv.DictReader(f):
            pp, dp = int(row["pp"]), int(row["dp"])
            configs.append(
                (f"llama3-{row['gpus']}g-cp{row['cp']}", pp, dp, int(row["batch_size_per_dp"]))
            )
    return configs


def pod_of(dp_rank: int, stage: int, pp: int) -> int:
    """Pipelines laid out whole, one after another (the compact layout)."""
    return (dp_rank * pp + stage) // SERVERS_PER_POD


Pairs = frozenset[tuple[int, int]]


def boundary_pairs(pp: int, dp: int) -> list[Pairs]:
    """For each stage boundary s -> s+1, the inter-pod pairs it crosses over all replicas."""
    out = []
    for s in range(pp - 1):
        pairs = set()
        for r in range(dp):
            a, b = pod_of(r, s, pp), pod_of(r, s + 1, pp)
            if a != b:
                pairs.add((min(a, b), max(a, b)))
        out.append(frozenset(pairs))
    return out


def dp_pairs(pp: int, dp: int) -> Pairs:
    pairs = set()
    for s in range(pp):
        for r in range(dp):
            a, b = pod_of(r, s, pp), pod_of((r + 1) % dp, s, pp)
            if a != b:
                pairs.add((min(a, b), max(a, b)))
    return frozenset(pairs)


def schedule_slots(pp: int, m: int, kind: str) -> list[set[int]]:
    """Per unit slot, the stage boundaries carrying a send (GPipe or 1F1B; F=1, B=2 slots)."""
    ops: list[list[tuple[str, int]]] = []
    for s in range(pp):
        if kind == "gpipe":
            ops.append([("F", i) for i in range(m)] + [("B", i) for i in range(m)])
        else:
            warm = min(pp - s - 1, m)
            seq = [("F", i) for i in range(warm)]
            for i in range(m - warm):
                seq += [("F", warm + i), ("B", i)]
            seq += [("B", i) for i in range(m - warm, m)]
            ops.append(seq)
    done: dict[tuple[str, int, int], int] = {}
    free = [0] * pp
    idx = [0] * pp
    sends: dict[int, set[int]] = defaultdict(set)
    remaining = sum(len(o) for o in ops)
    while remaining:
        for s in range(pp):
            if idx[s] == len(ops[s]):
                continue
            op, i = ops[s][idx[s]]
            if op == "F":
                dep = done.get(("F", s - 1, i)) if s > 0 else 0
            else:
                dep = done.get(("B", s + 1, i)) if s < pp - 1 else done.get(("F", s, i))
            if dep is None:
                continue
            start = max(
                free[s], dep + (1 if (s > 0 and op == "F") or (op == "B" and s < pp - 1) else 0)
            )
            end = start + (1 if op == "F" else 2)
            done[(op, s, i)] = end
            free[s] = end
            idx[s] += 1
            remaining -= 1
            if op == "F" and s < pp - 1:
                sends[end].add(s)
            if op == "B" and s > 0:
                sends[end].add(s - 1)
    horizon = max(sends) + 1 if sends else 0
    return [sends.get(t, set()) for t in range(horizon)]


def iteration_phases(pp: int, dp: int, m: int, kind: str, moe: bool) -> list[Pairs]:
    """The inter-pod pair sets of one iteration's reports, in order."""
    bounds = boundary_pairs(pp, dp)
    phases: list[Pairs] = []
    current: Pairs = frozenset()
    for slot in schedule_slots(pp, m, kind):
        pairs: Pairs = frozenset(p for s in slot for p in bounds[s])
        if pairs != current and current:
            phases.append(current)
        current = pairs
    if current:
        phases.append(current)
    if moe and phases:
        half = len(phases) // 2
        a2a: Pairs = frozenset({(-1, -1)})  # marker: an AllToAll report goes here
        phases = phases[:half] + [a2a] + phases[half:] + [a2a]
    d = dp_pairs(pp, dp)
    if d:
        phases.append(d)
    return phases


def to_pod_demand(
    pairs: Pairs, jitter: list[float], rng: random.Random, all_pods: list[int]
) -> DemandMatrix:
    """Bytes per pair with real jitter; an AllToAll marker becomes an uneven all-pairs demand."""
    directed: dict[tuple[str, str], float] = {}
    if (-1, -1) in pairs:
        pods = all_pods[:8]
        for i, a in enumerate(pods):
            for b in pods[i + 1 :]:
                directed[(f"pod-{a}", f"pod-{b}")] = rng.lognormvariate(0.0, 0.35)
    else:
        # A pod pair carries several workers' flows (here 4): each scales with its
        # worker's time, a straggler's is cut short.
        for k, (a, b) in enumerate(sorted(pairs)):
            fs = [jitter[(4 * k + w) % len(jitter)] for w in range(4)]
            size = sum(1.0 / f if f > 1.5 else f for f in fs)
            directed[(f"pod-{a}", f"pod-{b}")] = 1e9 * size
    return pod_demand_from_directed(directed)


def plan_ids(
    phases_per_iteration: list[list[Pairs]], rng: random.Random, jitter: list[list[float]]
) -> list[str]:
    catalog = PlanCatalog()
    out = []
    j = rng.randrange(len(jitter))
    for phases in phases_per_iteration:
        pods = sorted({p for ph in phases for pair in ph for p in pair if p >= 0}) or [0, 1]
        for ph in phases:
            catalog, pid = classify_plan(catalog, to_pod_demand(ph, jitter[j], rng, pods))
            out.append(pid)
            j = (j + 1) % len(jitter)
    return out


def minimal_period(seq: list[str]) -> int:
    n = len(seq)
    return next(p for p in range(1, n + 1) if all(seq[i] == seq[i - p] for i in range(p, n)))


def build_suite(
    rng: random.Random, jitter: list[list[float]]
) -> list[tuple[str, list[str], int | None]]:
    """(name, plan ids, stationary period or None) for every generated sequence."""
    suite: list[tuple[str, list[str], int | None]] = []
    for name, pp, dp, m in load_configs():
        m = min(m, MAX_MICROBATCHES)
        for kind in ("gpipe", "1f1b"):
            for moe in (False, True):
                it = iteration_phases(pp, dp, m, kind, moe)
                plans = plan_ids([it] * ITERATIONS, rng, jitter)
                clean = plan_ids([it] * 3, random.Random(0), [[1.0]])  # no jitter
                period = minimal_period(clean) if clean and not moe else None
                suite.append((f"{name} {kind}{' moe' if moe else ''}", plans, period))
            if pp >= 4:  # micro-batch count change: fewer micro-batches than pod span
                a = iteration_phases(pp, dp, m, kind, False)
                b = iteration_phases(pp, dp, max(2, m // 3), kind, False)
                plans = plan_ids([a] * ITERATIONS + [b] * ITERATIONS, rng, jitter)
                suite.append((f"{name} {kind} m{m}->{max(2, m // 3)}", plans, None))
            it = iteration_phases(pp, dp, m, kind, False)
            base = plan_ids([it] * ITERATIONS, rng, jitter)
            arrival = base + [p + "'" for p in base] + base
            suite.append((f"{name} {kind} job arrives+leaves", arrival, None))
            if base:  # a collector restart: one report sent twice, or lost (mid-run)
                at = rng.randrange(len(base) // 3, 2 * len(base) // 3)
                twice = base[: at + 1] + base[at:]
                suite.append((f"{name} {kind} a report twice", twice, None))
                suite.append((f"{name} {kind} a report lost", base[:at] + base[at + 1 :], None))
    return suite


def bench_cost(rng: random.Random, reports: int = 3000) -> list[float]:
    """Seconds per report at 25 pods: attribution, aggregation, plan id, predictor step.

    The job holds 8 servers in each of seed-15k's 25 pods (200 servers, PP 8 x DP 25):
    a PP report has 350 flows (both directions), a DP report 200 ring flows.
    """
    cluster = preset("seed-15k")
    servers = [[f"pod-{p}/tor-{t}/srv-{s}" for t in range(2) for s in range(4)] for p in range(25)]
    placement = {s: "job" for pod in servers for s in pod}
    pp_report = [Demand(servers[p][s], servers[p][s + 1], 5e7) for p in range(25) for s in range(7)]
    pp_report = (
        [Demand(servers[p][0], servers[(p + 1) % 25][7], 5e7) for p in range(25)]
        + [Demand(servers[(p + 1) % 25][7], servers[p][0], 5e7) for p in range(25)]
        + pp_report
    )
    dp_report = [
        Demand(servers[p][s], servers[(p + 1) % 25][s], 3e9) for p in range(25) for s in range(8)
    ]
    state = new_predictor("lightpath")
    catalog = PlanCatalog()
    costs = []
    for i in range(reports):
        base = pp_report if i % 2 == 0 else dp_report
        noisy = [Demand(d.src, d.dst, d.size_bytes * rng.uniform(0.96, 1.04)) for d in base]
        t0 = time.perf_counter()
        demands = attribute_demands(placement, noisy)["job"]
        catalog, pid = classify_plan(catalog, aggregate_pod_demand(cluster, demands))
        state, _ = step(state, pid)
        costs.append(time.perf_counter() - t0)
    return costs


def main() -> int:
    rng = random.Random(SEED)
    jitter = load_jitter()
    suite = build_suite(rng, jitter)
    failures: list[str] = []
    total = {"seed": 0, "lightpath": 0}
    print(f"{'sequence':44} {'len':>5} {'p':>4} {'seed':>6} {'lightpath':>9} {'2p+1':>5}")
    for name, plans, period in suite:
        if not plans:  # the whole job fits in one pod: no optical traffic to predict
            continue
        ms = count_misses(run_predictor("seed", plans))
        ml = count_misses(run_predictor("lightpath", plans))
        total["seed"] += ms
        total["lightpath"] += ml
        bound = ""
        if period is not None:
            # The bound is for stationary sequences: every iteration got the same ids.
            p = period
            stationary = minimal_period(plans) == p
            bound = str(2 * p + 1) if stationary else "n/s"
            if stationary and p <= 128 and ml > 2 * p + 1:
                failures.append(f"{name}: {ml} misses > 2p+1 = {2 * p + 1}")
        shown = str(period) if period is not None else "-"
        print(f"{name:44} {len(plans):>5} {shown:>4} {ms:>6} {ml:>9} {bound:>5}")
    if total["seed"] == 0:
        failures.append("miss ratio not judged: no sequence with optical traffic")
    ratio = total["lightpath"] / max(1, total["seed"])
    print(f"\ntotal misses: seed={total['seed']} lightpath={total['lightpath']} ratio={ratio:.3f}")
    if ratio > 0.6:
        failures.append(f"lightpath/seed miss ratio {ratio:.3f} > 0.6")
    costs = sorted(bench_cost(rng))
    p50, p99 = costs[len(costs) // 2] * 1e3, costs[int(len(costs) * 0.99)] * 1e3
    print(
        "cost per report at 25 pods (attribute + aggregate + plan id + step): "
        f"p50={p50:.3f} ms p99={p99:.3f} ms"
    )
    if p99 > 1.0:
        failures.append(f"p99 cost {p99:.3f} ms > 1 ms")
    for f in failures:
        print("BOUND MISSED:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

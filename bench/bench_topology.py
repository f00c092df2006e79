"""Topology engine benchmark: decision latency, circuit quality vs exact, vs static.

Fixed seeds. Prints a table and exits non-zero when a bound is missed:
- one job arrival at seed-15k with the cluster 80% full (place_job +
  plan_fabric + diff_plans): p99 <= 10 ms;
- greedy circuits vs the exact MILP on small instances: mean MLU ratio <= 1.05;
- greedy circuits never slower than a uniform static topology.
Run: .venv/bin/python bench/bench_topology.py
"""

from __future__ import annotations

import random
import statistics
import sys
import time

from app.engine.circuits import (
    evaluate_circuits,
    plan_circuits,
    plan_circuits_exact,
    uniform_circuits,
)
from app.engine.cluster import Cluster, preset
from app.engine.collective import AggregatorLedger
from app.engine.fabric import FabricPlan, PlacedJob, diff_plans, plan_fabric
from app.engine.job import Job, ModelFacts, Parallelism, Placement
from app.engine.placement import place_job
from app.engine.traffic import DemandMatrix

SEED = 20240619
P99_BOUND_MS = 10.0
MLU_RATIO_BOUND = 1.05


def _random_job(rng: random.Random, k: int) -> Job:
    dp = rng.choice([1, 2, 4, 8, 16])
    pp = rng.choice([1, 2, 4, 8])
    ep = rng.choice([1, 1, 1, 2])
    params = rng.choice([1.3e9, 7e9, 13e9, 70e9, 175e9])
    return Job(
        f"job-{k}",
        Parallelism(dp=dp, pp=pp, ep=ep),
        ModelFacts(params, 2.0, rng.choice([1.6e7, 5e7]), 4 * pp),
        submitted_order=k,
    )


def _fill(
    cluster: Cluster, rng: random.Random, target: float
) -> tuple[list[PlacedJob], FabricPlan]:
    free = set(cluster.server_ids)
    placed: list[PlacedJob] = []
    plan = plan_fabric(cluster, [], (), AggregatorLedger())
    k = 0
    misses = 0
    while len(free) > (1 - target) * cluster.server_count and misses < 200:
        job = _random_job(rng, k)
        k += 1
        agg = {t: plan.aggregators.free_gbps(cluster, t) for t in cluster.tors_by_id}
        p = place_job(cluster, free, job, aggregator_free_gbps=agg)
        if not isinstance(p, Placement):
            misses += 1
            continue
        free -= set(p.servers)
        placed.append(PlacedJob(job, p))
        plan = plan_fabric(cluster, placed, plan.cross_connects, plan.aggregators, previous=plan)
    return placed, plan


def bench_arrival(trials: int = 200) -> tuple[dict[str, float], bool]:
    cluster = preset("seed-15k")
    rng = random.Random(SEED)
    placed, plan = _fill(cluster, rng, 0.80)
    used = sum(len(pj.placement.units) for pj in placed)
    free = set(cluster.server_ids) - {s for pj in placed for s in pj.placement.servers}
    times = []
    changes = []
    for t in range(trials):
        job = _random_job(rng, 10_000 + t)
        start = time.perf_counter()
        agg = {tor: plan.aggregators.free_gbps(cluster, tor) for tor in cluster.tors_by_id}
        p = place_job(cluster, free, job, aggregator_free_gbps=agg)
        if isinstance(p, Placement):
            new = plan_fabric(
                cluster,
                [*placed, PlacedJob(job, p)],
                plan.cross_connects,
                plan.aggregators,
                previous=plan,
            )
            changes.append(len(diff_plans(plan, new, "arrival")))
        times.append((time.perf_counter() - start) * 1e3)
    times.sort()
    p99 = times[int(0.99 * (len(times) - 1))]
    row = {
        "jobs": len(placed),
        "fill": used / cluster.server_count,
        "cross_connects": len(plan.cross_connects),
        "p50_ms": statistics.median(times),
        "p99_ms": p99,
        "max_ms": times[-1],
        "placed_trials": len(changes),
        "mean_decisions": statistics.mean(changes) if changes else 0.0,
        "max_mlu": plan.mlu,
    }
    # judged only when some trial placed its job and planned the fabric
    return row, bool(changes) and p99 <= P99_BOUND_MS


def _instance(rng: random.Random) -> tuple[DemandMatrix, dict[str, int]]:
    n = rng.randint(3, 6)
    pods = tuple(f"pod-{i}" for i in range(n))
    rows = tuple(
        tuple(0.0 if i == j or rng.random() < 0.4 else rng.uniform(1, 10) * 1e9 for j in range(n))
        for i in range(n)
    )
    return DemandMatrix(pods, rows), {p: rng.choice([8, 12, 16]) for p in pods}


def bench_quality(instances: int = 60) -> tuple[dict[str, float], bool]:
    rng = random.Random(SEED + 1)
    ratios, static_ratios, greedy_ms, exact_ms = [], [], [], []
    never_worse = True
    for _ in range(instances):
        demand, ports = _instance(rng)
        t0 = time.perf_counter()
        greedy = plan_circuits(demand, ports, 400.0)
        t1 = time.perf_counter()
        exact = plan_circuits_exact(demand, ports, 400.0)
        t2 = time.perf_counter()
        static = evaluate_circuits(demand, uniform_circuits(demand.pod_ids, ports), ports, 400.0)
        greedy_ms.append((t1 - t0) * 1e3)
        exact_ms.append((t2 - t1) * 1e3)
        ratios.append(greedy.mlu / exact.mlu)
        static_ratios.append(static.mlu / greedy.mlu)
        never_worse &= greedy.completion_s <= static.completion_s * (1 + 1e-6)
    ratios.sort()
    row = {
        "instances": instances,
        "mean_mlu_ratio": statistics.mean(ratios),
        "p90_mlu_ratio": ratios[int(0.9 * (len(ratios) - 1))],
        "max_mlu_ratio": ratios[-1],
        "within_5pct": sum(r <= 1.05 for r in ratios) / len(ratios),
        "greedy_ms_mean": statistics.mean(greedy_ms),
        "exact_ms_mean": statistics.mean(exact_ms),
        "static_over_greedy_mean": statistics.mean(static_ratios),
    }
    return row, statistics.mean(ratios) <= MLU_RATIO_BOUND and never_worse


def bench_static_at_scale() -> tuple[dict[str, float], bool]:
    """Skewed pod demand at seed-15k scale: optimised vs uniform static circuits."""
    cluster = preset("seed-15k")
    rng = random.Random(SEED + 2)
    pods = tuple(p.id for p in cluster.pods)
    entries = []
    for _ in range(40):  # 40 hot pod pairs, both directions
        a, b = rng.sample(pods, 2)
        size = rng.uniform(1, 20) * 1e9
        entries += [(a, b, size), (b, a, size * rng.uniform(0.5, 1.0))]
    demand = DemandMatrix.from_entries(pods, entries)
    ports = {p.id: p.uplink_ports for p in cluster.pods}
    t0 = time.perf_counter()
    plan = plan_circuits(demand, ports, cluster.nic_gbps)
    ms = (time.perf_counter() - t0) * 1e3
    static = evaluate_circuits(demand, uniform_circuits(pods, ports), ports, cluster.nic_gbps)
    row = {
        "pods": len(pods),
        "optimised_mlu": plan.mlu,
        "static_mlu": static.mlu,
        "speedup": static.completion_s / plan.completion_s,
        "plan_ms": ms,
    }
    return row, plan.completion_s <= static.completion_s


def main() -> int:
    ok = True
    for name, fn in (
        ("arrival@seed-15k 80% full", bench_arrival),
        ("circuits vs exact (small)", bench_quality),
        ("circuits vs static (seed-15k)", bench_static_at_scale),
    ):
        row, passed = fn()
        ok &= passed
        print(f"\n{name}: {'PASS' if passed else 'FAIL'}")
        for key, value in row.items():
            shown = f"{value:.4g}" if isinstance(value, float) else str(value)
            print(f"  {key:<26} {shown}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

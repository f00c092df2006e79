"""Placement engine benchmark on seed-15k: decision time and fill against first-fit.

Fixed seed. Job sizes follow the Kalos trace's node counts
(data/traces/acme_kalos_completed_llm_jobs.csv, AcmeTrace, CC BY 4.0)
rounded to powers of two, one server per node. Two EP mixes:
- trace-like: the Kalos jobs are dense LLM pre-training, so ep=1 with a few
  MoE jobs of ep=2 (1 in 10); this is the mix the fill target is judged on;
- EP-heavy: a third of the jobs with ep 2, 4 or 8, whose EP groups leave gaps
  on seed-15k's 15-server ToRs (groups span ToRs of one pod when no ToR fits,
  never pods, so 75-server pods still strand servers). Its fill target (95%)
  is printed as met or missed; it does not fail the run.

Bounds (exit 1 when missed):
- place_job time p99 <= 5 ms per job on seed-15k;
- fill: in every trial where the first job that has to queue needs no more
  servers than are free, at least 95% of servers are in use at that moment.

Usage: .venv/bin/python bench/bench_placement.py [--trials N]
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Set
from pathlib import Path

from app.engine.cluster import Cluster, preset
from app.engine.job import Job, ModelFacts, Parallelism, Placement, Unit, Unplaceable
from app.engine.placement import place_job

SEED = 20_240_601
TRACE = Path(__file__).resolve().parents[1] / "data/traces/acme_kalos_completed_llm_jobs.csv"
P99_BOUND_MS = 5.0
FILL_BOUND = 0.95

# thread CPU time per call, keyed by the wall-time list it goes with
CPU_MS: dict[int, list[float]] = {}

PlaceFn = Callable[[Cluster, Set[str], Job], Placement | Unplaceable]


def kalos_sizes() -> list[int]:
    """Servers per job: the trace's node counts rounded to the nearest power of two."""
    with TRACE.open() as f:
        nodes = [int(r["num_nodes"]) for r in csv.DictReader(f)]
    return [1 << round(math.log2(n)) for n in nodes]


MIXES = {
    "trace-like": [1] * 9 + [2],
    "EP-heavy": [1, 1, 1, 1, 1, 1, 2, 4, 8],
}


def make_job(rng: random.Random, sizes: list[int], i: int, eps: list[int]) -> Job:
    """One job: a trace size split into (ep, dp, pp), with model facts for the estimate."""
    servers = rng.choice(sizes)
    ep = rng.choice(eps)
    ep = min(ep, servers)
    rest = servers // ep
    pp = min(rest, rng.choice([1, 2, 4, 8]))
    dp = rest // pp
    facts = ModelFacts(
        parameters=rng.choice([7e9, 13e9, 70e9]) * max(1, servers // 64),
        bytes_per_parameter=2,
        activation_bytes=float(rng.choice([16, 32, 64]) << 20),
        microbatches=4 * pp,
    )
    return Job(f"job-{i}", Parallelism(dp=dp, pp=pp, ep=ep), model=facts, submitted_order=i)


def first_fit(cluster: Cluster, free: Set[str], job: Job) -> Placement | Unplaceable:
    """Baseline: EP groups into ToRs in fabric order, first ToR with room first."""
    par = job.parallelism
    groups = [(s, d) for s in range(par.pp) for d in range(par.dp)]
    units: list[Unit] = []
    for pod in cluster.pods:
        for tor in pod.tors:
            ids = [s.id for s in tor.servers if s.id in free]
            while len(ids) >= par.ep and groups:
                stage, dp = groups.pop(0)
                units.extend(Unit(ids.pop(0), stage, dp, e) for e in range(par.ep))
            if not groups:
                return Placement(job.job_id, tuple(units), "first-fit")
    return Unplaceable(job.job_id, ("busy",))


def run_trial(
    cluster: Cluster,
    place: PlaceFn,
    seed: int,
    sizes: list[int],
    times_ms: list[float] | None,
    eps: list[int],
) -> tuple[float, bool, float]:
    """Churn, then arrivals only until one job must queue.

    Returns (share of servers in use then, whether fewer servers were free than
    that job needs, mean pods per placed job over the minimum possible).
    """
    rng = random.Random(seed)
    free = set(cluster.server_ids)
    running: dict[str, tuple[str, ...]] = {}
    pods_ratio: list[float] = []
    pod_size = len(cluster.pods[0].servers)

    def attempt(job: Job) -> bool:
        start, cpu = time.perf_counter(), time.thread_time()
        result = place(cluster, free, job)
        if times_ms is not None:
            times_ms.append((time.perf_counter() - start) * 1e3)
            CPU_MS.setdefault(id(times_ms), []).append((time.thread_time() - cpu) * 1e3)
        if isinstance(result, Unplaceable):
            return False
        running[job.job_id] = result.servers
        free.difference_update(result.servers)
        pods = len({cluster.server(s).pod_id for s in result.servers})
        pods_ratio.append(pods / math.ceil(len(result.servers) / pod_size))
        return True

    i = 0
    # Churn: arrivals and completions with occupancy hovering around 85%, so the
    # free space is scattered the way completions scatter it.
    for _ in range(400):
        used = 1 - len(free) / cluster.server_count
        if running and (used > 0.85 or rng.random() < 0.3):
            victim = rng.choice(sorted(running))
            free.update(running.pop(victim))
        else:
            attempt(make_job(rng, sizes, i, eps))
            i += 1
    while True:
        job = make_job(rng, sizes, i, eps)
        i += 1
        if not attempt(job):
            used = 1 - len(free) / cluster.server_count
            return used, len(free) < job.servers_needed, statistics.mean(pods_ratio)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    args = parser.parse_args()
    cluster = preset("seed-15k")
    sizes = kalos_sizes()
    ok = True
    print(f"seed-15k: {cluster.server_count} servers, {len(cluster.pods)} pods; seed {SEED}")
    print(f"job sizes (servers) from {TRACE.name}: {sorted(set(sizes))}")
    print()
    print(
        f"{'placer':<12} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'cpu p50':>8} "
        f"{'cpu p99':>8} {'calls':>6}"
    )
    times: dict[str, list[float]] = {"lightpath": [], "first-fit": []}
    fills: dict[tuple[str, str], list[tuple[float, bool, float]]] = {}
    for mix, eps in MIXES.items():
        for name, fn in (("lightpath", place_job), ("first-fit", first_fit)):
            fills[(mix, name)] = [
                run_trial(cluster, fn, SEED + t, sizes, times[name], eps)
                for t in range(args.trials)
            ]
    for name in ("lightpath", "first-fit"):
        ms = sorted(times[name])
        p50 = ms[len(ms) // 2]
        p99 = ms[min(len(ms) - 1, math.ceil(0.99 * len(ms)) - 1)]
        cpu = sorted(CPU_MS.get(id(times[name]), [0.0]))
        cpu50 = cpu[len(cpu) // 2]
        cpu99 = cpu[min(len(cpu) - 1, math.ceil(0.99 * len(cpu)) - 1)]
        print(
            f"{name:<12} {p50:8.3f} {p99:8.3f} {ms[-1]:8.3f} {cpu50:8.3f} {cpu99:8.3f} {len(ms):6d}"
        )
        if name == "lightpath" and p99 > P99_BOUND_MS:
            print(f"  BOUND MISSED: p99 {p99:.3f} ms > {P99_BOUND_MS} ms")
            ok = False
    print()
    print(
        f"{'mix':<11} {'placer':<10} {'fill mean':>9} {'min all':>8} {'fill min*':>9} "
        f"{'>=95%*':>8} {'excused':>8} {'pods/min':>8}"
    )
    for (mix, name), rows in fills.items():
        judged = [f for f, excused, _ in rows if not excused]
        meeting = sum(1 for f in judged if f >= FILL_BOUND)
        low = min(judged) if judged else float("nan")
        mean = statistics.mean(f for f, _, _ in rows)
        locality = statistics.mean(r for _, _, r in rows)
        excused = len(rows) - len(judged)
        print(
            f"{mix:<11} {name:<10} {mean:9.2%} {min(f for f, _, _ in rows):8.2%} {low:9.2%} "
            f"{meeting:>4}/{len(judged):<3} "
            f"{excused:>8} {locality:8.3f}"
        )
        if mix == "trace-like" and name == "lightpath":
            if not judged:  # every trial excused: the bound was never tested
                print(f"  BOUND NOT JUDGED: all {len(rows)} trials excused")
                ok = False
            elif low < FILL_BOUND:
                print(f"  BOUND MISSED: fill {low:.2%} < {FILL_BOUND:.0%} in a judged trial")
                ok = False
        if mix == "EP-heavy" and name == "lightpath" and judged and low < FILL_BOUND:
            print(f"  target missed: fill {low:.2%} < {FILL_BOUND:.0%} in a judged trial")
    print()
    print("* over trials where the queued job needed no more servers than were free")
    print("pods/min: pods a placed job spans over the fewest pods that could hold it")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""Where the optical fabric loses its time: slowdown by how many pods a job spans.

`bench_evaluation.py` shows lightpath a fraction of a point below the sprayed
Clos on comm-heavy once uplinks are fewer than 192 per pod. This script says
which jobs that time belongs to. It runs the evaluation's workload (same
family, generation seed and jittered copies, load 1.2 on seed-15k with
`--uplinks` per pod) under each policy, records for every job the pods its
placement spans, and adds up the server time each job lost to its slowdown
(run time x servers x (1 - 1/slowdown)), grouped by the pods it spans beyond
the fewest its size needs (ceil(servers / servers per pod)). A job spans more
when fragmentation leaves no pod with room: placement already takes the
fewest pods the free servers allow.

Run: .venv/bin/python bench/bench_span.py [--family comm-heavy] [--uplinks 48]
     [--seeds 3] [--latency 25] [--policies spray-same-cost,lightpath]
     [--generation-seed 1]
No bound: the figures back the README's account of where lightpath loses.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_evaluation import GENERATION_SEED, LOAD, check_uplinks, variant  # noqa: E402

from app.engine.cluster import preset  # noqa: E402
from app.sim.families import FAMILY_GPU, generate, jitter  # noqa: E402
from app.sim.policies import ELECTRICAL  # noqa: E402
from app.sim.simulator import SimResult, simulate  # noqa: E402


def lost_by_span(result: SimResult, per_pod: int) -> dict[int, list[float]]:
    """extra pods -> [jobs, server-seconds run, server-seconds lost to slowdown]."""
    out: dict[int, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for j in result.jobs:
        slowdown = j.slowdown
        if slowdown is None or j.start_s is None or j.end_s is None:
            continue
        extra = j.pods - math.ceil(j.servers / per_pod)
        ran = (j.end_s - j.start_s) * j.servers
        row = out[extra]
        row[0] += 1
        row[1] += ran
        row[2] += ran * (1 - 1 / slowdown) if slowdown > 0 else 0.0
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", default="comm-heavy")
    ap.add_argument("--uplinks", type=int, default=48)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--latency", type=float, default=25.0)
    ap.add_argument("--jobs", type=int, default=160)
    ap.add_argument("--policies", default="spray-same-cost,lightpath")
    ap.add_argument("--generation-seed", type=int, default=GENERATION_SEED)
    args = ap.parse_args()
    check_uplinks(ap, args.uplinks)
    gpu = FAMILY_GPU.get(args.family)
    workload = generate(
        args.family, preset("seed-15k"), load=LOAD, jobs=args.jobs, seed=args.generation_seed
    )
    copies = [jitter(workload, k) for k in range(args.seeds)]
    per_pod = len(preset("seed-15k").pods[0].servers)
    policies = [p for p in args.policies.split(",") if p]
    totals: dict[str, dict[int, list[float]]] = {}
    for policy in policies:
        electrical = policy in ELECTRICAL
        cluster = variant(None if electrical else args.latency, args.uplinks)
        merged: dict[int, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
        for k, w in enumerate(copies):
            print(f"{policy}: seed {k + 1}/{len(copies)}", file=sys.stderr)
            result = simulate(
                cluster,
                w,
                policy,
                seed=k,
                reconfig_ms=None if electrical else args.latency,
                gpu=gpu,
            )
            for extra, row in lost_by_span(result, per_pod).items():
                for i, v in enumerate(row):
                    merged[extra][i] += v
        totals[policy] = merged
    print(
        f"\n{args.family} (generation seed {args.generation_seed}), {args.uplinks} uplinks/pod, "
        f"{args.latency:g} ms, {args.seeds} seeds, "
        f"load {LOAD}: server time lost to slowdown, by pods spanned beyond the fewest"
    )
    header = "| pods beyond the fewest | " + " | ".join(
        f"{p}: jobs, lost server-h (% of run)" for p in policies
    )
    print(header + " |")
    print("| --- |" + " --- |" * len(policies))
    extras = sorted({e for t in totals.values() for e in t})
    for extra in extras:
        cells = []
        for p in policies:
            jobs, ran, lost = totals[p].get(extra, [0, 0.0, 0.0])
            share = 100 * lost / ran if ran else 0.0
            cells.append(f"{int(jobs)}, {lost / 3600:.1f} ({share:.2f}%)")
        print(f"| {extra} | " + " | ".join(cells) + " |")
    cells = []
    for p in policies:
        jobs = sum(r[0] for r in totals[p].values())
        ran = sum(r[1] for r in totals[p].values())
        lost = sum(r[2] for r in totals[p].values())
        cells.append(f"{int(jobs)}, {lost / 3600:.1f} ({100 * lost / ran if ran else 0:.2f}%)")
    print("| all | " + " | ".join(cells) + " |")
    print(f"load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""POST /v1/jobs -> placed at 300+ running jobs, this tree against another, interleaved.

    .venv/bin/python bench/bench_ab.py [--other /work/main] [--rounds 3]
                                       [--backend sqlite|postgres] [--redis-db 12]

On a shared machine a before/after pair measured minutes apart mostly compares
load averages. This runs `bench_api.py`'s fill (`seed-15k` filled to 95%, jobs
stay running) alternately on the other checkout and on this one, round after
round, every round the same sequence (bench_api.py's seed: some others never reach
300 running jobs), and prints p50/p99/mean of the arrivals
made with 300+ jobs running for each, with the load average before and after
every fill. `--backend sqlite`: `lightpath serve`; `postgres`: the full stack
(api, worker, mock-oxc on PostgreSQL and Redis, as `bench_api.py` runs it). No
target: a comparison.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import bench_api  # noqa: E402
from _service import lightpath, percentile  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--other", default="/work/main", help="the checkout to compare with")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--redis-db", type=int, default=12, help="for the full stack")
    args = parser.parse_args()
    trees = {"other": args.other, "this": str(ROOT)}
    samples: dict[str, list[float]] = {name: [] for name in trees}
    for r in range(args.rounds):
        for name, tree in trees.items():
            load = "/".join(f"{v:.2f}" for v in os.getloadavg())
            rng = random.Random(bench_api.SEED)  # some seeds never reach 300 running jobs
            if args.backend == "sqlite":
                with lightpath(bench_api.CLUSTER, PYTHONPATH=tree) as url:
                    fill = bench_api.fill(url, bench_api.servers(url), rng, f"r{r}")
            else:
                from bench_pipeline import full_stack

                with full_stack(bench_api.CLUSTER, redis_db=args.redis_db, tree=tree) as stack:
                    fill = bench_api.fill(stack.url, bench_api.servers(stack.url), rng, f"r{r}")
            late = [ms for running, ms in fill if running >= bench_api.JUDGED_FROM]
            samples[name] += late
            after = "/".join(f"{v:.2f}" for v in os.getloadavg())
            print(
                f"round {r} {name:5} ({tree}, {args.backend}): {len(late)} arrivals at 300+, "
                f"p50 {percentile(late, 50):.1f} ms, p99 {percentile(late, 99):.1f} ms "
                f"(load average {load} before, {after} after)",
                flush=True,
            )
    for name, late in samples.items():
        mean = statistics.fmean(late) if late else float("nan")
        print(
            f"{name:5} {trees[name]}: {len(late)} arrivals, p50 {percentile(late, 50):.1f} ms, "
            f"p99 {percentile(late, 99):.1f} ms, mean {mean:.1f} ms"
        )
    print("load average now " + "/".join(f"{v:.2f}" for v in os.getloadavg()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

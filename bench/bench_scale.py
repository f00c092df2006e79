"""The evaluation at the design notes' scale: about 300 jobs running at once on seed-15k.

The `fleet` family (`lightpath workload generate --family fleet`: the Kalos
trace's fine-tuning-sized jobs, 1-64 GPUs, with the comm-heavy configurations on
B200), or `--family fleet-stress` (the same configurations on 1-16 servers with
fewer one-server jobs: not from the trace, a mix that fragmentation scatters
over pods), at offered load 1.2, JOBS jobs, generation seed 1 (`--generation-
seed`), SEEDS jittered copies (`families.jitter`), one OXC latency. Every policy
of the evaluation runs on every copy; lightpath also runs with other limits on
how many pods a job may span beyond the fewest its size needs (`--extra-pods`:
the product's `OPTICAL_EXTRA_PODS` is one of them; `none` places a job wherever
servers are free, as every other policy does).

Printed and written (bench/out/scale/: results.json, table.md, scale.png), with
the evaluation's `targets:` line for lightpath (`bench_evaluation.targets`): steady
utilisation (mean ± 95% CI over the seeds; every run of a seed over the steady
window they all share, `report.common_window`), jobs running at once in that
window, mean iteration slowdown, network share of an iteration, mean queueing
delay, and the wall time of each run. Runs go to a pool of `--procs` processes
(default: the machine's cores); a line per finished run shows progress.

Bound (exit 1 when missed): at least 250 jobs running at once under every
policy (the scale this script exists to show).

`--workload FILE` runs a saved workload instead (JSON Lines, gzipped or not):
`bench/workloads/scatter-1500.jsonl.gz` is the mix on which lightpath first
lost to spraying at this scale (see bench/README.md).

Scarce ports: `--uplinks N` gives every pod N uplinks instead of 192 (the
electrical policies' Clos gets the same N; `spray-same-cost` 0.7 of them).

Run: .venv/bin/python bench/bench_scale.py [--family fleet-stress] [--jobs 1500] [--seeds 3]
     [--latency 25] [--workload bench/workloads/scatter-1500.jsonl.gz]
     [--policies ideal,spray,...] [--extra-pods 1,none,0,2] [--uplinks 48] [--procs 2]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_evaluation import check_uplinks, targets, targets_line, variant  # noqa: E402

from app.engine.cluster import preset  # noqa: E402
from app.engine.placement import OPTICAL_EXTRA_PODS  # noqa: E402
from app.sim.families import FAMILY_GPU, generate, jitter  # noqa: E402
from app.sim.policies import ELECTRICAL  # noqa: E402
from app.sim.report import aggregate, summarize, summarize_compared  # noqa: E402
from app.sim.simulator import SimResult, simulate  # noqa: E402
from app.sim.workload import read_workload  # noqa: E402

LOAD = 1.2
GENERATION_SEED = 1
POLICIES = ("ideal", "spray", "spray-same-cost", "ecmp", "static", "reactive", "lightpath")
MIN_RUNNING = 250.0
OUT = Path(__file__).resolve().parent / "out" / "scale"


def _limit(text: str) -> int | None:
    return None if text == "none" else int(text)


def _label(policy: str, extra: int | None) -> str:
    if policy != "lightpath" or extra == OPTICAL_EXTRA_PODS:
        return policy
    return f"lightpath, extra pods {'unlimited' if extra is None else extra}"


def run_one(
    workload_path: str | None,
    generation_seed: int,
    family: str,
    policy: str,
    extra: int | None,
    seed: int,
    jobs: int,
    latency: float,
    uplinks: int | None,
) -> tuple[str, int, SimResult, float]:
    """One policy on one jittered copy: the run (without its controller timings) and
    its wall time; summarised in `main`, over the window all runs of the seed share."""
    workload = (
        read_workload(workload_path)
        if workload_path
        else generate(family, preset("seed-15k"), load=LOAD, jobs=jobs, seed=generation_seed)
    )
    copy = jitter(workload, seed)
    electrical = policy in ELECTRICAL
    cluster = variant(None if electrical else latency, uplinks)
    t0 = time.perf_counter()
    result = simulate(
        cluster,
        copy,
        policy,
        seed=seed,
        reconfig_ms=None if electrical else latency,
        gpu=FAMILY_GPU[family],
        max_extra_pods=extra,
    )
    result.controller_steps = []  # not needed here: keep what crosses processes small
    return _label(policy, extra), seed, result, time.perf_counter() - t0


def _cell(agg: dict[str, Any], key: str, scale: float, digits: int) -> str:
    v = agg[key]
    if not v["values"]:
        return "-"
    return f"{v['mean'] * scale:.{digits}f} ± {v['ci95'] * scale:.{digits}f}"


def markdown(rows: list[dict[str, Any]], title: str) -> str:
    lines = [f"**{title}**", ""]
    lines.append(
        "| policy | steady util % | jobs running | mean slowdown | network % | "
        "mean queueing (s) | wall per run (s) |"
    )
    lines.append("| --- |" + " --- |" * 6)
    for agg in rows:
        lines.append(
            "| "
            + " | ".join(
                [
                    agg["policy"],
                    _cell(agg, "steady_utilization", 100, 2),
                    _cell(agg, "steady_running_jobs", 1, 0),
                    _cell(agg, "mean_iteration_slowdown", 1, 4),
                    _cell(agg, "mean_network_share", 100, 1),
                    _cell(agg, "mean_queueing_delay_s", 1, 0),
                    f"{agg['wall_s']['mean']:.0f}",
                ]
            )
            + " |"
        )
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4.5))
    names = [r["policy"] for r in rows]
    util = [r["steady_utilization"] for r in rows]
    means = [u["mean"] * 100 if u["values"] else math.nan for u in util]
    errs = [u["ci95"] * 100 if u["values"] else 0.0 for u in util]
    colours = ["tab:gray" if n in ELECTRICAL else "tab:blue" for n in names]
    ax.barh(names, means, xerr=errs, color=colours, capsize=3)
    lo = min(m - e for m, e in zip(means, errs, strict=True))
    ax.set_xlim(max(0.0, lo - 2), max(m + e for m, e in zip(means, errs, strict=True)) + 1)
    ax.invert_yaxis()
    ax.set_xlabel("steady utilisation % (mean, 95% CI); grey: electrical")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", default="fleet", choices=("fleet", "fleet-stress"))
    ap.add_argument("--jobs", type=int, default=1500)
    ap.add_argument("--generation-seed", type=int, default=GENERATION_SEED)
    ap.add_argument(
        "--workload",
        default=None,
        help="a saved workload (JSON Lines, .gz too) instead of --family; run on B200",
    )
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--latency", type=float, default=25.0)
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument(
        "--extra-pods",
        default=f"{OPTICAL_EXTRA_PODS},none",
        help="lightpath's limits on pods beyond the fewest (comma-separated; none = no limit)",
    )
    ap.add_argument("--uplinks", type=int, default=None, help="uplinks per pod (default 192)")
    ap.add_argument("--procs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()
    check_uplinks(ap, args.uplinks)
    policies = [p for p in args.policies.split(",") if p]
    limits = [_limit(x) for x in args.extra_pods.split(",") if x]
    variants = {p: limits if p == "lightpath" else [OPTICAL_EXTRA_PODS] for p in policies}
    tasks = []
    for policy in policies:
        for extra in variants[policy]:
            for seed in range(args.seeds):
                tasks.append(
                    (
                        args.workload,
                        args.generation_seed,
                        args.family,
                        policy,
                        extra,
                        seed,
                        args.jobs,
                        args.latency,
                        args.uplinks,
                    )
                )
    # the slowest first, so the pool's last runs are short ones
    order = {"lightpath": 0, "reactive": 1, "static": 2, "ecmp": 3}
    tasks.sort(key=lambda t: order.get(t[3], 9))
    runs: dict[str, dict[int, SimResult]] = {}
    walls: dict[str, dict[int, float]] = {}
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=max(1, args.procs)) as pool:
        futures = [pool.submit(run_one, *t) for t in tasks]
        for n, fut in enumerate(as_completed(futures), 1):
            label, seed, result, wall = fut.result()
            runs.setdefault(label, {})[seed] = result
            walls.setdefault(label, {})[seed] = wall
            own = summarize(result)  # its own window: the shared one needs every run
            steady = own["steady_utilization"]
            print(
                f"[{n}/{len(tasks)}] {label}, seed {seed}: steady over its own window "
                f"{'-' if steady is None else f'{steady * 100:.2f}%'}, {wall:.0f} s "
                f"({time.perf_counter() - t0:.0f} s elapsed)",
                file=sys.stderr,
                flush=True,
            )
    labels = [_label(p, e) for p in policies for e in variants[p]]
    labels = [lab for lab in dict.fromkeys(labels) if lab in runs]
    # every run of a seed over the steady window they share (`report.common_window`)
    seeds = sorted(set.intersection(*(set(runs[lab]) for lab in labels)))
    per_label = summarize_compared({lab: [runs[lab][k] for k in seeds] for lab in labels})
    for lab in labels:
        for k, summary in zip(seeds, per_label[lab], strict=True):
            summary["wall_s"] = walls[lab][k]
            summary["policy"] = lab
    rows = [aggregate(per_label[lab]) for lab in labels]
    shape = f" with {args.uplinks} uplinks/pod" if args.uplinks else ""
    what = (
        f"{Path(args.workload).name} (b200)"
        if args.workload
        else f"{args.family} (b200), {args.jobs} jobs, load {LOAD}, "
        f"generation seed {args.generation_seed}"
    )
    title = f"{what}, seed-15k{shape}, {args.latency:g} ms, {args.seeds} seeds"
    verdicts = targets(rows)  # the product's lightpath (its own spread limit)
    table = markdown(rows, title) + f"\n{targets_line(verdicts)}\n"
    print(table)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(table)
    doc = {
        "title": title,
        "load_average": os.getloadavg()[0],
        "wall_s": time.perf_counter() - t0,
        "aggregates": rows,
        "targets": verdicts,
    }
    (out / "results.json").write_text(json.dumps(doc, indent=1) + "\n")
    plot(rows, title, out / "scale.png")
    print(f"load average {os.getloadavg()[0]:.2f}; wrote {out}/table.md, results.json, scale.png")
    low = [
        r["policy"]
        for r in rows
        if not r["steady_running_jobs"]["values"] or r["steady_running_jobs"]["mean"] < MIN_RUNNING
    ]
    if low:
        print(f"FAIL: fewer than {MIN_RUNNING:.0f} jobs running at once under {', '.join(low)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

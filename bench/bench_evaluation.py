"""The evaluation: every workload family, policy and OXC latency, over jittered seeds.

For each family (`dense`, `bigspan`, `moe`, `comm-heavy`; `lightpath workload
generate`, 160 jobs at load 1.2 on seed-15k, generation seed 1) and each OXC
reconfiguration latency (1, 10, 25, 100 ms), seven policies (ideal, spray,
spray-same-cost, ecmp, static, reactive, lightpath) run on SEEDS jittered copies of the workload
(`families.jitter`: arrivals and iteration times; seed 0 is the workload as
generated). The electrical policies do not depend on the latency and run once
per seed. `comm-heavy` runs with B200 GPUs (`--gpu b200`), the others A100.

Printed per family and latency: steady utilisation (compute GPU-seconds over
cluster GPU-seconds while the queue is never empty under any of the policies:
one window per seed for all seven, `report.common_window`), mean and p99 iteration
slowdown, the network's share of iteration time, done/refused/stalled, each
a mean with its 95% confidence interval over the seeds. Written under
bench/out/evaluation/: results.json, table.md, and one plot per family
(steady utilisation and mean slowdown against latency, with error bars).

Scarce ports: `--uplinks N` runs the same workloads (generated on seed-15k) on
seed-15k with N uplinks per pod instead of 192 (N divisible by the 16 OXCs; the
electrical policies' Clos gets the same N), and `--electrical-gbps G` gives each
pod of the optical policies an electrical core of G Gb/s beside the OXCs (a
hybrid fabric; the electrical baselines are unchanged). Write those runs to
another `--out`.

Held-out workloads: `--generation-seed S` generates every family with seed S
instead of 1 (the workloads the project was tuned on); nothing else changes.

Targets (printed and written under "targets" in table.md and results.json, per
family and latency; they do not fail the run): lightpath's steady utilisation
over the ideal fabric's (>= 0.95), lightpath against `spray` (within 1%), and
lightpath minus `spray-same-cost` paired per seed (same workload copy, same
window) with its 95% confidence interval: "above" or "below" when the interval
excludes 0 and the difference is 0.005 points or more, else "level".

Bound (exit 1 when missed): the timed cell (one family, one latency: 160 jobs x
7 policies x SEEDS seeds) under 600 s of wall time on this machine.

Run: .venv/bin/python bench/bench_evaluation.py [--families dense,moe] [--latencies 1,25]
     [--seeds 5] [--jobs 160] [--uplinks 16] [--electrical-gbps 1600]
     [--generation-seed 808]
     (families can run as separate processes; `--merge` then rebuilds table.md
     from their results_<family>.json)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from app.engine.cluster import Cluster, build_cluster, preset
from app.sim.families import FAMILIES, FAMILY_GPU, generate, jitter
from app.sim.report import (
    aggregate,
    coinciding,
    evaluation_table,
    mean_ci95,
    summarize_compared,
)
from app.sim.simulator import SimResult, simulate

POLICIES = ("ideal", "spray", "spray-same-cost", "ecmp", "static", "reactive", "lightpath")
ELECTRICAL = ("ideal", "spray", "spray-same-cost", "ecmp")
LATENCIES_MS = (25.0, 1.0, 100.0, 10.0)  # 25 ms first: the reference column
LOAD = 1.2
GENERATION_SEED = 1
CELL_BOUND_S = 600.0
NEGLIGIBLE_POINTS = 0.005  # differences of utilisation points the tables print as 0.00
OUT = Path(__file__).resolve().parent / "out" / "evaluation"


def variant(
    reconfig_ms: float | None, uplinks: int | None, electrical_gbps: float = 0.0
) -> Cluster:
    """seed-15k, or seed-15k with `uplinks` per pod and an electrical core per pod."""
    base = preset("seed-15k", reconfig_ms=reconfig_ms)
    if uplinks is None and not electrical_gbps:
        return base
    pod, oxc = base.pods[0], base.oxcs[0]
    return build_cluster(
        "seed-15k",
        pods=len(base.pods),
        tors_per_pod=len(pod.tors),
        servers_per_tor=len(pod.tors[0].servers),
        uplink_ports_per_pod=uplinks or pod.uplink_ports,
        oxcs=len(base.oxcs),
        oxc_ports=oxc.ports,
        reconfig_ms=oxc.reconfig_ms,
        aggregator_gbps=pod.tors[0].aggregator_gbps,
        pod_aggregator_gbps=pod.aggregator_gbps,
        pod_electrical_gbps=electrical_gbps,
    )


def check_uplinks(ap: argparse.ArgumentParser, uplinks: int | None) -> None:
    """A usage error for an uplink count the OXCs cannot split evenly."""
    if uplinks is None:
        return
    try:
        variant(None, uplinks)
    except ValueError as exc:
        ap.error(f"--uplinks {uplinks}: {exc}")


def run_family(
    family: str,
    latencies: list[float],
    seeds: int,
    jobs: int,
    console: Console,
    partial: Path | None = None,
    uplinks: int | None = None,
    electrical_gbps: float = 0.0,
    generation_seed: int = GENERATION_SEED,
) -> dict[str, Any]:
    gpu = FAMILY_GPU.get(family)
    workload = generate(family, preset("seed-15k"), load=LOAD, jobs=jobs, seed=generation_seed)
    base_cluster = variant(None, uplinks)
    copies = [jitter(workload, k) for k in range(seeds)]
    electrical: dict[str, list[SimResult]] = {}
    t0 = time.perf_counter()
    for policy in ELECTRICAL:
        electrical[policy] = [
            simulate(base_cluster, w, policy, seed=k, gpu=gpu) for k, w in enumerate(copies)
        ]
    electrical_s = time.perf_counter() - t0
    cells = {}
    for latency in latencies:
        cluster = variant(latency, uplinks, electrical_gbps)
        t1 = time.perf_counter()
        runs = dict(electrical)
        for policy in POLICIES:
            if policy in ELECTRICAL:
                continue
            runs[policy] = [
                simulate(cluster, w, policy, seed=k, reconfig_ms=latency, gpu=gpu)
                for k, w in enumerate(copies)
            ]
        wall = time.perf_counter() - t1 + electrical_s
        # every policy over one steady window per seed (`report.common_window`)
        per_policy = summarize_compared({p: runs[p] for p in POLICIES})
        aggregates = [aggregate(per_policy[p]) for p in POLICIES]
        shape = f", {uplinks} uplinks/pod" if uplinks else ""
        shape += f", {electrical_gbps:g} Gb/s core/pod" if electrical_gbps else ""
        title = (
            f"{family} ({gpu or 'a100'}{shape}), {latency:g} ms, {seeds} seeds, wall {wall:.0f} s"
        )
        console.print(evaluation_table(aggregates, title))
        verdicts = targets(aggregates)
        console.print(targets_line(verdicts))
        cells[f"{latency:g}"] = {
            "wall_s": wall,
            "aggregates": aggregates,
            "coinciding": coinciding(aggregates),
            "targets": verdicts,
        }
        if partial is not None:  # each cell as soon as it is done
            doc = {"family": family, "gpu": gpu or "a100", "jobs": jobs, "seeds": seeds}
            doc["generation_seed"] = generation_seed
            doc |= {"uplinks": uplinks, "electrical_gbps": electrical_gbps}
            doc["cells"] = dict(sorted(cells.items(), key=lambda kv: float(kv[0])))
            partial.write_text(json.dumps(doc, indent=1) + "\n")
    return {
        "family": family,
        "gpu": gpu or "a100",
        "jobs": jobs,
        "seeds": seeds,
        "generation_seed": generation_seed,
        "uplinks": uplinks,
        "electrical_gbps": electrical_gbps,
        "load_average": os.getloadavg()[0],
        "cells": dict(sorted(cells.items(), key=lambda kv: float(kv[0]))),
    }


def targets(aggregates: list[dict[str, Any]]) -> dict[str, Any]:
    """Issue 13's targets for one cell: lightpath over ideal, against spray, and paired
    per seed against spray-same-cost (None where a policy had no steady window)."""
    util = {a["policy"]: a["steady_utilization"] for a in aggregates}
    lp, ideal, spray, same = (
        util.get(p) for p in ("lightpath", "ideal", "spray", "spray-same-cost")
    )
    out: dict[str, Any] = {"of_ideal": None, "vs_spray_pct": None, "minus_same_cost": None}
    if not (lp and lp["values"]):
        return out
    if ideal and ideal["values"] and ideal["mean"] > 0:
        out["of_ideal"] = lp["mean"] / ideal["mean"]
    if spray and spray["values"] and spray["mean"] > 0:
        out["vs_spray_pct"] = 100 * (lp["mean"] / spray["mean"] - 1)
    if same and len(same["values"]) == len(lp["values"]):
        diffs = [100 * (a - b) for a, b in zip(lp["values"], same["values"], strict=True)]
        mean, half = mean_ci95(diffs)
        # level: the interval holds 0, or the two-decimal figures would print 0.00
        if abs(mean) < NEGLIGIBLE_POINTS or mean - half <= 0 <= mean + half:
            word = "level"
        else:
            word = "above" if mean > 0 else "below"
        out["minus_same_cost"] = {"points": mean, "ci95": half, "verdict": word}
    return out


def targets_line(t: dict[str, Any]) -> str:
    """The targets as one line: each figure with met / missed."""
    parts = []
    if t["of_ideal"] is not None:
        ok = "met" if t["of_ideal"] >= 0.95 else "MISSED"
        parts.append(f"lightpath {t['of_ideal']:.4f} x ideal (>= 0.95 {ok})")
    if t["vs_spray_pct"] is not None:
        ok = "met" if t["vs_spray_pct"] >= -1.0 else "MISSED"
        parts.append(f"{t['vs_spray_pct']:+.2f}% against spray (within 1% {ok})")
    d = t["minus_same_cost"]
    if d is not None:
        parts.append(
            f"minus spray-same-cost, paired: {d['points']:+.2f} ± {d['ci95']:.2f} points "
            f"({d['verdict']})"
        )
    return "targets: " + ("; ".join(parts) if parts else "no steady window")


def _cell_md(agg: dict[str, Any], key: str, scale: float, digits: int) -> str:
    v = agg[key]
    if not v["values"]:
        return "-"  # no steady window: the queue never built up
    return f"{v['mean'] * scale:.{digits}f} ± {v['ci95'] * scale:.{digits}f}"


def markdown(results: list[dict[str, Any]]) -> str:
    lines = []
    for fam in results:
        shape = f", {fam['uplinks']} uplinks/pod" if fam.get("uplinks") else ""
        if fam.get("electrical_gbps"):
            shape += f", optical policies with a {fam['electrical_gbps']:g} Gb/s core/pod"
        lines.append(
            f"\n**{fam['family']}** ({fam['gpu']}{shape}, {fam['jobs']} jobs, load {LOAD}, "
            f"generation seed {fam.get('generation_seed', GENERATION_SEED)}, "
            f"{fam.get('seeds', '?')} seeds; mean ± 95% CI)\n"
        )
        latencies = sorted(fam["cells"], key=float)
        head = "| policy | network % (25 ms) | " + " | ".join(
            f"steady util % @ {lat} ms" for lat in latencies
        )
        lines.append(head + " | slowdown @ 25 ms | done/refused/stalled |")
        lines.append("|" + " --- |" * (len(latencies) + 4))
        ref = fam["cells"].get("25", fam["cells"][latencies[0]])
        for i, policy in enumerate(POLICIES):
            row = [policy]
            agg_ref = ref["aggregates"][i]
            row.append(_cell_md(agg_ref, "mean_network_share", 100, 1))
            for lat in latencies:
                agg = fam["cells"][lat]["aggregates"][i]
                same = fam["cells"][lat]["coinciding"].get(policy)
                row.append(
                    _cell_md(agg, "steady_utilization", 100, 2) + (f" (= {same})" if same else "")
                )
            row.append(_cell_md(agg_ref, "mean_iteration_slowdown", 1, 4))
            row.append(
                "/".join(
                    str(round(agg_ref[k]["mean"]))
                    for k in ("jobs_completed", "jobs_refused", "jobs_stalled")
                )
            )
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
        for lat in latencies:
            verdicts = fam["cells"][lat].get("targets")
            if verdicts is not None:
                lines.append(f"- {lat} ms: {targets_line(verdicts)}")
    return "\n".join(lines) + "\n"


def plot(fam: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    latencies = sorted(float(x) for x in fam["cells"])
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for i, policy in enumerate(POLICIES):
        util = [fam["cells"][f"{x:g}"]["aggregates"][i]["steady_utilization"] for x in latencies]
        slow = [
            fam["cells"][f"{x:g}"]["aggregates"][i]["mean_iteration_slowdown"] for x in latencies
        ]
        style = "--" if policy in ELECTRICAL else "-"
        a.errorbar(
            latencies,
            [u["mean"] * 100 if u["values"] else math.nan for u in util],
            yerr=[u["ci95"] * 100 if u["values"] else 0.0 for u in util],
            label=policy,
            capsize=3,
            linestyle=style,
            marker="o",
        )
        b.errorbar(
            latencies,
            [s["mean"] if s["values"] else math.nan for s in slow],
            yerr=[s["ci95"] if s["values"] else 0.0 for s in slow],
            label=policy,
            capsize=3,
            linestyle=style,
            marker="o",
        )
    for ax in (a, b):
        ax.set_xscale("log")
        ax.set_xlabel("OXC reconfiguration (ms)")
    a.set_ylabel("steady utilisation % (95% CI)")
    b.set_ylabel("mean iteration slowdown (95% CI)")
    a.legend(fontsize=8)
    fig.suptitle(f"{fam['family']} ({fam['gpu']}), {fam['jobs']} jobs, load {LOAD}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser()
    # the fleet families (300 running jobs) have their own script: bench_scale.py
    ap.add_argument(
        "--families", default=",".join(f for f in FAMILIES if not f.startswith("fleet"))
    )
    ap.add_argument("--latencies", default=",".join(f"{x:g}" for x in LATENCIES_MS))
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--jobs", type=int, default=160)
    ap.add_argument("--out", default=str(OUT), help="output directory")
    ap.add_argument("--uplinks", type=int, default=None, help="uplinks per pod (default 192)")
    ap.add_argument(
        "--generation-seed",
        type=int,
        default=GENERATION_SEED,
        help=f"workload generation seed (default {GENERATION_SEED}; others: held-out workloads)",
    )
    ap.add_argument(
        "--electrical-gbps", type=float, default=0.0, help="optical policies' core per pod"
    )
    ap.add_argument(
        "--merge", action="store_true", help="only rebuild table.md from results_*.json"
    )
    ap.add_argument("extra", nargs="*", help="with --merge: more result directories")
    args = ap.parse_args()
    check_uplinks(ap, args.uplinks)
    out = Path(args.out)
    console = Console(width=200)
    if args.merge:
        # every results_<family>.json under out and the extra directories, cells joined
        order = {f: i for i, f in enumerate(FAMILIES)}
        out.mkdir(parents=True, exist_ok=True)
        by_family: dict[str, dict[str, Any]] = {}
        for d in [out, *map(Path, args.extra)]:
            for p in sorted(d.glob("results_*.json")):
                doc = json.loads(p.read_text())
                have = by_family.setdefault(doc["family"], dict(doc, cells={}))
                have["cells"].update(doc["cells"])
        merged = sorted(by_family.values(), key=lambda r: order.get(r["family"], 99))
        for fam in merged:
            fam["cells"] = dict(sorted(fam["cells"].items(), key=lambda kv: float(kv[0])))
            plot(fam, out / f"{fam['family']}.png")
        (out / "table.md").write_text(markdown(merged))
        console.print(markdown(merged))
        return 0
    families = [f for f in args.families.split(",") if f]
    latencies = [float(x) for x in args.latencies.split(",") if x]
    out.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()
    results = []
    worst = 0.0
    for family in families:
        partial = out / f"results_{family}.json"
        fam = run_family(
            family,
            latencies,
            args.seeds,
            args.jobs,
            console,
            partial,
            uplinks=args.uplinks,
            electrical_gbps=args.electrical_gbps,
            generation_seed=args.generation_seed,
        )
        results.append(fam)
        worst = max([worst] + [c["wall_s"] for c in fam["cells"].values()])
        plot(fam, out / f"{family}.png")
        (out / f"results_{family}.json").write_text(json.dumps(fam, indent=1) + "\n")
    (out / "table.md").write_text(markdown(results))
    console.print(markdown(results))
    after = os.getloadavg()
    console.print(
        f"slowest cell (160 jobs x {len(POLICIES)} policies x {args.seeds} seeds): {worst:.0f} s "
        f"(bound {CELL_BOUND_S:.0f} s); load average before {load[0]:.2f}, after {after[0]:.2f}"
    )
    return 0 if worst <= CELL_BOUND_S else 1


if __name__ == "__main__":
    sys.exit(main())

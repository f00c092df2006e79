"""Simulator benchmark: speed at scale, and the policy comparison on a Kalos-derived workload.

Fixed seeds. Prints tables, writes plots under bench/out/simulator/ and exits
non-zero when a bound is missed:

1. Scale: 200 jobs x 2,000 iterations on seed-15k for ideal, ecmp, static,
   reactive and lightpath: total wall time <= 120 s.
2. Comparison: the Kalos trace (data/traces, AcmeTrace CC BY 4.0) with
   models and plans from the Megatron-LM / Llama 3 tables, arrivals compressed
   by ARRIVAL_SCALE so the cluster is loaded (the real trace keeps seed-15k
   ~1% busy, where every fabric looks alike), for OXC latencies 1, 10, 25 and
   100 ms. Bounds per latency: lightpath utilisation >= 0.95 x ideal and >= the
   utilisation of ecmp, static and reactive, strictly above ecmp; lightpath's
   mean iteration slowdown strictly below reactive's and ecmp's and not above
   static's; exposed reconfiguration after warm-up <= 1% of communication time.

Run: .venv/bin/python bench/bench_simulator.py [--quick]
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from app.engine.cluster import preset
from app.sim.report import comparison, summarize, write_comparison_plot, write_json, write_plots
from app.sim.simulator import simulate
from app.sim.workload import from_kalos_trace

SEED = 20240619
TRACE = Path(__file__).resolve().parents[1] / "data/traces/acme_kalos_completed_llm_jobs.csv"
OUT = Path(__file__).resolve().parent / "out" / "simulator"
SCALE_POLICIES = ("ideal", "ecmp", "static", "reactive", "lightpath")
COMPARE_POLICIES = ("ideal", "ecmp", "static", "reactive", "lightpath", "lightpath-seed")
LATENCIES_MS = (1.0, 10.0, 25.0, 100.0)
SCALE_WALL_BOUND_S = 120.0
UTIL_VS_IDEAL_BOUND = 0.95
EXPOSED_SHARE_BOUND = 0.01
ARRIVAL_SCALE = 0.005  # 90 days of arrivals in ~11 hours

console = Console(width=160)


_HEAD = {
    "jobs_completed": "done",
    "gpu_utilization": "util",
    "util_vs_ideal": "util/ideal",
    "makespan_s": "makespan s",
    "mean_iteration_slowdown": "slowdown",
    "reconfigurations": "reconfigs",
    "exposed_reconfig_s": "exposed s",
    "exposed_share_of_communication_after_warmup": "exposed/comm",
    "prediction_hits": "hits",
    "prediction_misses": "misses",
    "max_mlu": "max MLU",
    "wall_s": "wall s",
}


def _table(title: str, rows: list[dict[str, object]], columns: list[str]) -> Table:
    table = Table(title=title)
    for c in columns:
        table.add_column(
            _HEAD.get(c, c), justify="left" if c == "policy" else "right", no_wrap=True
        )
    for r in rows:
        table.add_row(*(f"{r[c]:.4g}" if isinstance(r[c], float) else str(r[c]) for c in columns))
    return table


def scale_run(failures: list[str]) -> None:
    workload = from_kalos_trace(TRACE, jobs=200, seed=SEED)
    workload = [dataclasses.replace(w, arrival_s=0.0, iterations=2000) for w in workload]
    cluster = preset("seed-15k")
    rows = []
    total = 0.0
    results = []
    for policy in SCALE_POLICIES:
        started = time.perf_counter()
        result = simulate(cluster, workload, policy, seed=SEED)
        wall = time.perf_counter() - started
        total += wall
        s = summarize(result)
        rows.append({**s, "wall_s": wall})
        results.append(result)
    console.print(
        _table(
            "scale: 200 jobs x 2,000 iterations, seed-15k, 25 ms OXC",
            rows,
            [
                "policy",
                "jobs_completed",
                "gpu_utilization",
                "mean_iteration_slowdown",
                "reconfigurations",
                "exposed_reconfig_s",
                "wall_s",
            ],
        )
    )
    console.print(f"total wall time {total:.1f} s (bound {SCALE_WALL_BOUND_S:.0f} s)")
    write_plots(results, OUT, prefix="scale_")
    if total > SCALE_WALL_BOUND_S:
        failures.append(f"scale: {total:.1f} s > {SCALE_WALL_BOUND_S:.0f} s")


def compare_run(failures: list[str], quick: bool) -> None:
    workload = from_kalos_trace(TRACE, seed=SEED)
    workload = [dataclasses.replace(w, arrival_s=w.arrival_s * ARRIVAL_SCALE) for w in workload]
    latencies = LATENCIES_MS[2:3] if quick else LATENCIES_MS
    fixed = {}
    for policy in ("ideal", "ecmp"):  # neither depends on the OXC latency
        fixed[policy] = simulate(preset("seed-15k"), workload, policy, seed=SEED)
    for latency in latencies:
        cluster = preset("seed-15k", reconfig_ms=latency)
        results = []
        for policy in COMPARE_POLICIES:
            if policy in fixed:
                results.append(fixed[policy])
            else:
                results.append(simulate(cluster, workload, policy, seed=SEED, reconfig_ms=latency))
        summaries = [summarize(r) for r in results]
        by = {s["policy"]: s for s in summaries}
        for s in summaries:
            s["util_vs_ideal"] = s["gpu_utilization"] / by["ideal"]["gpu_utilization"]
        console.print(
            _table(
                f"Kalos-derived workload ({len(workload)} jobs), seed-15k, OXC {latency:g} ms",
                summaries,
                [
                    "policy",
                    "jobs_completed",
                    "gpu_utilization",
                    "util_vs_ideal",
                    "makespan_s",
                    "mean_iteration_slowdown",
                    "reconfigurations",
                    "exposed_reconfig_s",
                    "exposed_share_of_communication_after_warmup",
                    "prediction_hits",
                    "prediction_misses",
                    "max_mlu",
                    "wall_s",
                ],
            )
        )
        tag = f"kalos_{latency:g}ms_"
        write_json(OUT / f"{tag}comparison.json", comparison(summaries))
        write_comparison_plot(summaries, OUT / f"{tag}comparison.png")
        write_plots(results, OUT, prefix=tag)
        lp = by["lightpath"]
        where = f"{latency:g} ms"
        if lp["util_vs_ideal"] < UTIL_VS_IDEAL_BOUND:
            failures.append(f"{where}: lightpath util {lp['util_vs_ideal']:.4f} x ideal < 0.95")
        for other in ("ecmp", "static", "reactive"):
            if lp["gpu_utilization"] < by[other]["gpu_utilization"] * (1 - 1e-12):
                failures.append(f"{where}: lightpath utilisation below {other}")
        if lp["gpu_utilization"] <= by["ecmp"]["gpu_utilization"]:
            failures.append(f"{where}: lightpath utilisation not above ecmp")
        for other in ("ecmp", "reactive"):
            if lp["mean_iteration_slowdown"] >= by[other]["mean_iteration_slowdown"]:
                failures.append(f"{where}: lightpath slowdown not below {other}")
        if lp["mean_iteration_slowdown"] > by["static"]["mean_iteration_slowdown"] * (1 + 1e-12):
            failures.append(f"{where}: lightpath slowdown above static")
        share = lp["exposed_share_of_communication_after_warmup"]
        if share > EXPOSED_SHARE_BOUND:
            failures.append(f"{where}: exposed reconfiguration {share:.4f} of communication > 1%")
    console.print(f"plots and JSON under {OUT}")


def main() -> int:
    quick = "--quick" in sys.argv
    failures: list[str] = []
    OUT.mkdir(parents=True, exist_ok=True)
    if not quick:
        scale_run(failures)
    compare_run(failures, quick)
    for f in failures:
        console.print(f"[red]BOUND MISSED[/red] {f}")
    if not failures:
        console.print("[green]all bounds met[/green]")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

"""Results of simulations: summary.json, comparison.json, rich tables and matplotlib plots.

Field names of the summary are API.md's (`summary.json`); extra fields are
additions, never renames. Plots use the Agg backend (no display needed).
Imports no web, database or bus code.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from .simulator import SimResult

SUMMARY_FIELDS = (
    "policy",
    "jobs_completed",
    "makespan_s",
    "gpu_utilization",
    "mean_jct_s",
    "mean_iteration_slowdown",
    "reconfigurations",
    "exposed_reconfig_s",
    "prediction_hits",
    "prediction_misses",
    "max_mlu",
    "wall_s",
)


def summarize(result: SimResult) -> dict[str, Any]:
    """The summary.json dict of one run (API.md fields first, then additions)."""
    done = [j for j in result.jobs if j.end_s is not None]
    makespan = result.makespan_s
    slowdowns = [s for s in (j.slowdown for j in done) if s is not None]
    comm_after = sum(j.comm_after_warmup_s for j in done)
    exposed_after = sum(j.exposed_after_warmup_s for j in done)
    out: dict[str, Any] = {
        "policy": result.policy,
        "jobs_completed": len(done),
        "makespan_s": makespan,
        # compute GPU-seconds over cluster GPU-seconds across the makespan
        "gpu_utilization": (
            result.compute_gpu_s / (result.cluster_gpus * makespan) if makespan > 0 else 0.0
        ),
        "mean_jct_s": (
            sum(j.end_s - j.arrival_s for j in done if j.end_s is not None) / len(done)
            if done
            else 0.0
        ),
        "mean_iteration_slowdown": sum(slowdowns) / len(slowdowns) if slowdowns else 0.0,
        "reconfigurations": sum(j.reconfigurations for j in done),
        "exposed_reconfig_s": sum(j.exposed_s for j in done),
        "prediction_hits": sum(j.hits for j in done),
        "prediction_misses": sum(j.misses for j in done),
        "prediction_held": sum(j.held for j in done),
        "max_mlu": max((j.mlu for j in done), default=0.0),
        "wall_s": result.wall_s,
        # additions
        "jobs_refused": sum(1 for j in result.jobs if j.refused),
        "reconfig_ms": result.reconfig_ms,
        "communication_s": sum(j.comm_s for j in done),
        "exposed_reconfig_after_warmup_s": exposed_after,
        "exposed_share_of_communication_after_warmup": (
            exposed_after / comm_after if comm_after > 0 else 0.0
        ),
        "max_iteration_slowdown": max(slowdowns, default=0.0),
    }
    return out


def job_rows(result: SimResult) -> list[dict[str, Any]]:
    """Per-job results (for jobs.json and the plots)."""
    return [
        {
            "job_id": j.job_id,
            "servers": j.servers,
            "arrival_s": j.arrival_s,
            "start_s": j.start_s,
            "end_s": j.end_s,
            "iterations": j.iterations,
            "ideal_iteration_s": j.ideal_iteration_s,
            "iteration_slowdown": j.slowdown,
            "exposed_reconfig_s": j.exposed_s,
            "reconfigurations": j.reconfigurations,
            "prediction_hits": j.hits,
            "prediction_misses": j.misses,
            "algorithm": j.algorithm,
            "fabric_mode": j.mode,
            "holds_topology": j.holds_topology,
            "refused": j.refused,
        }
        for j in result.jobs
    ]


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.5g}" if abs(value) < 1e7 else f"{value:.4e}"
    return str(value)


_SHORT = {
    "jobs_completed": "done",
    "makespan_s": "makespan s",
    "gpu_utilization": "GPU util",
    "mean_jct_s": "mean JCT s",
    "mean_iteration_slowdown": "slowdown",
    "reconfigurations": "reconfigs",
    "exposed_reconfig_s": "exposed s",
    "prediction_hits": "hits",
    "prediction_misses": "misses",
    "max_mlu": "max MLU",
    "wall_s": "wall s",
}


def summary_table(
    summaries: Sequence[dict[str, Any]], title: str = "Lightpath simulation"
) -> Table:
    """One row per policy, the API.md fields as columns (short headers)."""
    table = Table(title=title)
    columns = [f for f in SUMMARY_FIELDS if f != "policy"]
    table.add_column("policy", style="bold", no_wrap=True)
    for name in columns:
        table.add_column(_SHORT.get(name, name), justify="right", no_wrap=True)
    for s in summaries:
        table.add_row(s["policy"], *(_fmt(s[c]) for c in columns))
    return table


def print_table(summaries: Sequence[dict[str, Any]], console: Console | None = None) -> None:
    """Print the summary table to the terminal (stdout)."""
    (console or Console(width=160)).print(summary_table(summaries))


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")


def utilisation_timeline(result: SimResult, points: int = 400) -> tuple[list[float], list[float]]:
    """(times, busy fraction of the cluster's GPUs) sampled on `points` equal steps."""
    makespan = result.makespan_s
    if makespan <= 0:
        return [0.0], [0.0]
    deltas: dict[float, float] = {}
    for start, end, gpus in result.busy_segments:
        deltas[start] = deltas.get(start, 0.0) + gpus
        deltas[end] = deltas.get(end, 0.0) - gpus
    edges = sorted(deltas)
    times = [makespan * i / (points - 1) for i in range(points)]
    values = []
    level = 0.0
    k = 0
    for t in times:
        while k < len(edges) and edges[k] <= t:
            level += deltas[edges[k]]
            k += 1
        values.append(max(0.0, level) / result.cluster_gpus)
    return times, values


def write_plots(results: Sequence[SimResult], out_dir: Path, prefix: str = "") -> list[Path]:
    """Utilisation over time per policy, slowdown CDF, exposed reconfiguration per job."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []

    fig, ax = plt.subplots(figsize=(8, 4))
    for r in results:
        times, values = utilisation_timeline(r)
        ax.plot([t / 3600 for t in times], values, label=r.policy, linewidth=1)
    ax.set_xlabel("simulated time (h)")
    ax.set_ylabel("GPU utilisation (computing)")
    ax.set_ylim(0, 1.05)
    ax.legend()
    ax.set_title("GPU utilisation over time")
    paths.append(_save(fig, out_dir / f"{prefix}utilisation.png", plt))

    fig, ax = plt.subplots(figsize=(6, 4))
    for r in results:
        values = sorted(s for s in (j.slowdown for j in r.jobs) if s is not None)
        if values:
            ys = [(i + 1) / len(values) for i in range(len(values))]
            ax.step(values, ys, where="post", label=r.policy)
    ax.set_xlabel("iteration time / ideal")
    ax.set_ylabel("fraction of jobs")
    ax.set_title("Iteration-time slowdown CDF")
    ax.legend()
    paths.append(_save(fig, out_dir / f"{prefix}slowdown_cdf.png", plt))

    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / max(1, len(results))
    for i, r in enumerate(results):
        xs = [k + i * width for k in range(len(r.jobs))]
        ax.bar(xs, [j.exposed_s for j in r.jobs], width=width, label=r.policy)
    ax.set_xlabel("job (workload order)")
    ax.set_ylabel("exposed reconfiguration (s)")
    ax.set_title("Exposed reconfiguration per job")
    ax.legend()
    paths.append(_save(fig, out_dir / f"{prefix}exposed_reconfig.png", plt))
    return paths


def write_comparison_plot(summaries: Sequence[dict[str, Any]], path: Path) -> Path:
    """Bars of utilisation and mean slowdown per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    names = [s["policy"] for s in summaries]
    a.bar(names, [s["gpu_utilization"] for s in summaries])
    a.set_ylabel("GPU utilisation")
    a.tick_params(axis="x", rotation=30)
    b.bar(names, [s["mean_iteration_slowdown"] for s in summaries])
    b.set_ylabel("mean iteration slowdown")
    b.tick_params(axis="x", rotation=30)
    fig.suptitle("Policy comparison")
    return _save(fig, path, plt)


def _save(fig: Any, path: Path, plt: Any) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def comparison(summaries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """comparison.json: every policy's summary, and each one relative to ideal."""
    ideal = next((s for s in summaries if s["policy"] == "ideal"), None)
    relative = {}
    if ideal is not None and ideal["gpu_utilization"] > 0:
        for s in summaries:
            relative[s["policy"]] = {
                "gpu_utilization_vs_ideal": s["gpu_utilization"] / ideal["gpu_utilization"],
                "makespan_vs_ideal": (
                    s["makespan_s"] / ideal["makespan_s"] if ideal["makespan_s"] else None
                ),
            }
    return {"policies": list(summaries), "relative_to_ideal": relative}

"""Results of simulations: summary.json, comparison.json, rich tables and matplotlib plots.

Field names of the summary are API.md's (`summary.json`); extra fields are
additions, never renames. Plots use the Agg backend (no display needed).
Imports no web, database or bus code.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from .simulator import JobResult, SimResult

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


def steady_window(result: SimResult) -> tuple[float, float]:
    """The longest interval during which the queue was never empty (warm-up, drain cut)."""
    best = (0.0, 0.0)
    start: float | None = None
    for t, n in result.queue_timeline:
        if n > 0 and start is None:
            start = t
        elif n == 0 and start is not None:
            if t - start > best[1] - best[0]:
                best = (start, t)
            start = None
    if start is not None:
        end = result.makespan_s
        if end - start > best[1] - best[0]:
            best = (start, end)
    return best


def common_window(results: Sequence[SimResult]) -> tuple[float, float]:
    """The stretch where no run's queue was empty: the intersection of their
    `steady_window`s ((0, 0) when they do not overlap).

    Policies compared on one workload are measured over this one window. Each run's
    own window favours a policy that keeps jobs waiting: its queue lasts longer, so its
    window takes in busy time another policy had already finished (a helper's moe run:
    lightpath 0.9068 over its 9,052 s window above ideal's 0.9066 over 5,127 s; over
    either one window lightpath was 0.9 points below)."""
    lo, hi = 0.0, math.inf
    for r in results:
        a, b = steady_window(r)
        if b <= a:
            return (0.0, 0.0)
        lo, hi = max(lo, a), min(hi, b)
    return (lo, hi) if results and hi > lo else (0.0, 0.0)


def steady_utilization(
    result: SimResult, window: tuple[float, float] | None = None
) -> float | None:
    """Compute GPU-seconds over cluster GPU-seconds in `window` (default: the run's own
    `steady_window`; None: no window, the queue never built up)."""
    a, b = steady_window(result) if window is None else window
    if b <= a:
        return None
    busy = 0.0
    for start, end, gpus in result.busy_segments:
        lo, hi = max(a, start), min(b, end)
        if hi > lo:
            busy += gpus * (hi - lo)
    return busy / (result.cluster_gpus * (b - a))


def steady_running_jobs(
    result: SimResult, window: tuple[float, float] | None = None
) -> float | None:
    """Jobs running at once, averaged over `window` (as `steady_utilization`)."""
    a, b = steady_window(result) if window is None else window
    if b <= a:
        return None
    held = 0.0
    for j in result.jobs:
        if j.start_s is None:
            continue
        end = j.end_s if j.end_s is not None else result.makespan_s
        lo, hi = max(a, j.start_s), min(b, end)
        if hi > lo:
            held += hi - lo
    return held / (b - a)


def summarize_compared(
    runs: Mapping[str, Sequence[SimResult]],
) -> dict[str, list[dict[str, Any]]]:
    """Each policy's summaries, run k of every policy (the same workload copy and seed)
    measured over their `common_window`."""
    seeds = min((len(v) for v in runs.values()), default=0)
    windows = [common_window([v[k] for v in runs.values()]) for k in range(seeds)]
    return {
        p: [summarize(r, window=windows[k]) for k, r in enumerate(v[:seeds])]
        for p, v in runs.items()
    }


def _percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return ordered[k]


def summarize(result: SimResult, window: tuple[float, float] | None = None) -> dict[str, Any]:
    """The summary.json dict of one run (API.md fields first, then additions).

    `window`: where the steady figures are measured (`common_window` of the runs it is
    compared with); by default the run's own `steady_window`."""
    steady = steady_window(result) if window is None else window
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
            result.compute_gpu_s / (result.cluster_gpus * makespan) if makespan > 0 else None
        ),
        "mean_jct_s": (
            sum(j.end_s - j.arrival_s for j in done if j.end_s is not None) / len(done)
            if done
            else None
        ),
        "mean_iteration_slowdown": sum(slowdowns) / len(slowdowns) if slowdowns else None,
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
        "max_iteration_slowdown": max(slowdowns, default=None),
        "steady_utilization": steady_utilization(result, steady),
        "steady_window_s": max(0.0, steady[1] - steady[0]),
        "steady_window": [steady[0], steady[1]] if steady[1] > steady[0] else None,
        "steady_window_shared": window is not None,
        "steady_running_jobs": steady_running_jobs(result, steady),
        "p99_iteration_slowdown": _percentile(slowdowns, 0.99) if slowdowns else None,
        "mean_queueing_delay_s": (
            sum(j.start_s - j.arrival_s for j in done if j.start_s is not None) / len(done)
            if done
            else None
        ),
        "mean_network_share": (
            sum(shares) / len(shares) if (shares := [_share(j) for j in done]) else None
        ),
        "jobs_stalled": sum(1 for j in result.jobs if j.stalled),
        # admitted but still queued when the run ended (behind a job that never ends):
        # completed + refused + stalled + never_started + the rest = every job
        "jobs_never_started": sum(1 for j in result.jobs if j.start_s is None and not j.refused),
        # jobs that ran part of their life taking turns on shared ports, or on the
        # electrical core (optical policies; what the controller did, not believed)
        "jobs_shared": sum(1 for j in result.jobs if "time_division" in j.modes),
        "jobs_electrical": sum(1 for j in result.jobs if "electrical" in j.modes),
    }
    return out


def _share(j: JobResult) -> float:
    """The share of the job's mean iteration time not spent computing (network, rewiring)."""
    if j.start_s is None or j.end_s is None or j.iterations <= 0:
        return 0.0
    mean = (j.end_s - j.start_s) / j.iterations
    return max(0.0, 1.0 - j.compute_iteration_s / mean) if mean > 0 else 0.0


def job_rows(result: SimResult) -> list[dict[str, Any]]:
    """Per-job results (for jobs.json and the plots)."""
    return [
        {
            "policy": result.policy,
            "job_id": j.job_id,
            "iteration_s": (
                (j.end_s - j.start_s) / j.iterations
                if j.end_s is not None and j.start_s is not None
                else None
            ),
            "network_share": _share(j),
            "queueing_delay_s": j.start_s - j.arrival_s if j.start_s is not None else None,
            "jct_s": j.end_s - j.arrival_s if j.end_s is not None else None,
            "stalled": j.stalled,
            "prediction_held": j.held,
            "servers": j.servers,
            "pods": j.pods,
            "arrival_s": j.arrival_s,
            "start_s": j.start_s,
            "end_s": j.end_s,
            "iterations": j.iterations,
            # null when unknown (a refused job never got a placement to time)
            "ideal_iteration_s": j.ideal_iteration_s or None,
            "iteration_slowdown": j.slowdown,
            "exposed_reconfig_s": j.exposed_s,
            "reconfigurations": j.reconfigurations,
            "prediction_hits": j.hits,
            "prediction_misses": j.misses,
            "algorithm": j.algorithm,
            "fabric_mode": j.mode,
            "fabric_modes": list(j.modes),
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
    """Strict JSON: a figure that is not finite (an MLU over no capacity) is null."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_finite(data), indent=2, sort_keys=False, allow_nan=False) + "\n")


def _finite(data: Any) -> Any:
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: _finite(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [_finite(v) for v in data]
    return data


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


def _pyplot() -> Any:
    """matplotlib's pyplot, headless, with every text literal: a cluster file's `name`
    is the user's text, and a "$" in it started mathtext (a cluster named "r$^$" was a
    ValueError, and no plots)."""
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["text.parse_math"] = False
    import matplotlib.pyplot as plt

    return plt


def write_plots(results: Sequence[SimResult], out_dir: Path, prefix: str = "") -> list[Path]:
    """Utilisation over time per policy, slowdown CDF, exposed reconfiguration per job."""
    plt = _pyplot()

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
    if ax.get_legend_handles_labels()[0]:  # every job refused: nothing to label
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
    plt = _pyplot()

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    names = [s["policy"] for s in summaries]
    a.bar(names, [s["gpu_utilization"] or 0 for s in summaries])  # None: nothing ran
    a.set_ylabel("GPU utilisation")
    a.tick_params(axis="x", rotation=30)
    b.bar(names, [s["mean_iteration_slowdown"] or 0 for s in summaries])
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
    if ideal is not None and (ideal["gpu_utilization"] or 0) > 0:
        for s in summaries:
            relative[s["policy"]] = {
                "gpu_utilization_vs_ideal": (s["gpu_utilization"] or 0) / ideal["gpu_utilization"],
                "makespan_vs_ideal": (
                    s["makespan_s"] / ideal["makespan_s"] if ideal["makespan_s"] else None
                ),
            }
    return {"policies": list(summaries), "relative_to_ideal": relative}


# two-sided 95% Student t quantiles by degrees of freedom (1..30); 1.96 beyond
_T95 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def mean_ci95(values: Sequence[float]) -> tuple[float, float]:
    """(mean, half-width of the 95% confidence interval of the mean; 0 for one value)."""
    if not values:
        return 0.0, 0.0
    if not all(math.isfinite(v) for v in values):
        return math.inf, math.inf
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, 0.0
    t = _T95[len(values) - 2] if len(values) - 1 <= len(_T95) else 1.96
    return mean, t * statistics.stdev(values) / math.sqrt(len(values))


def aggregate(per_seed: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One policy's summaries over seeds: every number as {mean, ci95, values}."""
    out: dict[str, Any] = {"policy": per_seed[0]["policy"], "seeds": len(per_seed)}
    for key, value in per_seed[0].items():
        # None: a figure some runs have not (no steady window); the others' values count
        if key == "policy" or isinstance(value, bool):
            continue
        if value is not None and not isinstance(value, (int, float)):
            continue
        values = [float(s[key]) for s in per_seed if isinstance(s.get(key), (int, float))]
        mean, half = mean_ci95(values) if values else (None, None)  # undefined: null
        out[key] = {"mean": mean, "ci95": half, "values": values}
    return out


def human_s(seconds: float | None) -> str:
    """Seconds in a unit a person reads at a glance (ms, s, min, h, d)."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    a = abs(seconds)
    if a < 1:
        return f"{seconds * 1000:.3g} ms"
    if a < 120:
        return f"{seconds:.3g} s"
    if a < 7200:
        return f"{seconds / 60:.3g} min"
    if a < 172800:
        return f"{seconds / 3600:.3g} h"
    return f"{seconds / 86400:.3g} d"


def _pm(agg: dict[str, Any], key: str, scale: float = 1.0, digits: int = 2) -> str:
    v = agg.get(key)
    if not isinstance(v, dict) or not v["values"]:
        return "-"
    if len(v["values"]) < 2:
        return f"{v['mean'] * scale:.{digits}f}"
    return f"{v['mean'] * scale:.{digits}f} ± {v['ci95'] * scale:.{digits}f}"


def coinciding(aggregates: Sequence[dict[str, Any]]) -> dict[str, str]:
    """Policies whose per-seed results equal an earlier policy's (to 1e-9)."""
    out: dict[str, str] = {}
    keys = ("steady_utilization", "mean_iteration_slowdown", "mean_jct_s")
    for i, a in enumerate(aggregates):
        va = [x for k in keys for x in a[k]["values"]]
        for b in aggregates[:i]:
            vb = [x for k in keys for x in b[k]["values"]]
            if len(va) != len(vb) or not va:
                continue
            if all(abs(x - y) <= 1e-9 for x, y in zip(va, vb, strict=True)):
                out[a["policy"]] = b["policy"]
                break
    return out


NO_STEADY_WINDOW = (
    "steady util '-': the queue never built up, so there is no steady window; at this "
    "load every policy's utilisation is the offered load: compare slowdown and JCT "
    "(or raise --load / the job count)"
)
ALL_REFUSED = (
    "every job was refused: none can ever fit this cluster (jobs.json gives each one's "
    "reason); use a larger cluster or a workload made for it"
)


def _caption(aggregates: Sequence[dict[str, Any]]) -> str | None:
    done = sum(sum(a["jobs_completed"]["values"]) for a in aggregates)
    refused = sum(sum(a["jobs_refused"]["values"]) for a in aggregates)
    if not done and refused:
        return ALL_REFUSED  # not a queue that never built up
    if any(not a["steady_utilization"]["values"] for a in aggregates):
        return NO_STEADY_WINDOW
    return None


def evaluation_table(aggregates: Sequence[dict[str, Any]], title: str) -> Table:
    """Mean ± 95% CI over seeds per policy; coinciding policies and refused jobs shown."""
    same = coinciding(aggregates)
    table = Table(title=title, caption=_caption(aggregates))
    for name in (
        "policy",
        "steady util %",
        "slowdown",
        "p99 slowdown",
        "network %",
        "mean JCT",
        "queueing",
        "done/refused/stalled/unstarted",
        "exposed reconfig",
    ):
        table.add_column(name, justify="left" if name == "policy" else "right", no_wrap=True)
    for a in aggregates:
        label = a["policy"] + (f" (= {same[a['policy']]})" if a["policy"] in same else "")
        counts = "/".join(
            str(round(a[k]["mean"]))
            for k in ("jobs_completed", "jobs_refused", "jobs_stalled", "jobs_never_started")
            if isinstance(a.get(k), dict)
        )
        table.add_row(
            label,
            _pm(a, "steady_utilization", 100.0),
            _pm(a, "mean_iteration_slowdown", 1.0, 4),
            _pm(a, "p99_iteration_slowdown", 1.0, 3),
            _pm(a, "mean_network_share", 100.0, 1),
            human_s(a["mean_jct_s"]["mean"]),
            human_s(a["mean_queueing_delay_s"]["mean"]),
            counts,
            human_s(a["exposed_reconfig_s"]["mean"]),
        )
    return table


def write_error_bar_plot(aggregates: Sequence[dict[str, Any]], path: Path, title: str) -> Path:
    """Steady utilisation and mean slowdown per policy, mean with 95% CI error bars."""
    plt = _pyplot()

    same = coinciding(aggregates)
    names = [a["policy"] + ("*" if a["policy"] in same else "") for a in aggregates]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    util = [x["steady_utilization"] for x in aggregates]
    judged = [u for u in util if u["values"]]
    a.bar(
        names,
        [u["mean"] * 100 if u["values"] else math.nan for u in util],
        yerr=[u["ci95"] * 100 if u["values"] else 0.0 for u in util],
        capsize=4,
    )
    if len(judged) < len(util):
        a.set_title("'-': no steady window (the queue never built up)", fontsize=8)
    lo = min((u["mean"] - u["ci95"]) * 100 for u in judged) if judged else 0.0
    a.set_ylim(max(0.0, lo - 2.0), 100.0)
    a.set_ylabel("steady utilisation % (95% CI)")
    a.tick_params(axis="x", rotation=30)
    slow = [x["mean_iteration_slowdown"] for x in aggregates]
    slow = [s if s["values"] else {"mean": math.nan, "ci95": 0.0} for s in slow]
    b.bar(names, [s["mean"] for s in slow], yerr=[s["ci95"] for s in slow], capsize=4)
    top = max((s["mean"] + s["ci95"] for s in slow if s["mean"] == s["mean"]), default=1.0)
    b.set_ylim(0.95, max(1.05, top + 0.02))
    b.set_ylabel("mean iteration slowdown (95% CI)")
    b.tick_params(axis="x", rotation=30)
    fig.suptitle(title + ("  (* coincides with an earlier policy)" if same else ""))
    return _save(fig, path, plt)


def _as_count(per_seed: Sequence[dict[str, Any]], key: str, mean: float) -> float | int:
    """A count (an int in every seed's summary) stays an int where its mean is whole."""
    counts = all(type(s.get(key)) is int for s in per_seed)
    return int(mean) if counts and math.isfinite(mean) and mean.is_integer() else mean


def seeded_summary(per_seed: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """summary.json over seeds: each number the mean, and `ci95` its CI half-widths."""
    agg = aggregate(per_seed)
    out: dict[str, Any] = dict(per_seed[0])
    ci: dict[str, float] = {}
    for key, value in agg.items():
        if isinstance(value, dict):
            out[key] = _as_count(per_seed, key, value["mean"]) if value["values"] else None
            ci[key] = value["ci95"]
    out["steady_window"] = None  # one per seed: see each run's summary
    out["seeds"] = len(per_seed)
    out["ci95"] = ci
    return out

"""What `lightpath simulate` and `lightpath workload from-trace` do, as plain functions.

The CLI parses arguments and calls these; they return a process exit code
(0 fine, 2 bad input) and print their tables to stdout, progress and errors to
stderr. The cluster is loaded with `app.wiring.load_cluster` (imported when
called, so importing `app.sim` pulls in no web or database code).
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from .policies import POLICIES
from .report import (
    comparison,
    job_rows,
    print_table,
    summarize,
    write_comparison_plot,
    write_json,
    write_plots,
)
from .simulator import SimResult, simulate
from .workload import WorkloadError, from_kalos_trace, read_workload, write_workload

EXIT_OK = 0
EXIT_BAD_INPUT = 2


def run_simulate(
    cluster_name_or_file: str,
    workload_path: str,
    policies: list[str],
    out_dir: str | None,
    seed: int,
    reconfig_ms: float | None,
) -> int:
    """Simulate each policy over the workload; print the table; write JSON and plots to out_dir.

    One policy writes `summary.json`; several (`--compare`) write `comparison.json`,
    `summary_<policy>.json` each and `comparison.png`. Both write `jobs_<policy>.json`
    and the plots (utilisation.png, slowdown_cdf.png, exposed_reconfig.png).
    """
    err = Console(stderr=True)
    unknown = [p for p in policies if p not in POLICIES]
    if not policies or unknown:
        err.print(
            f"error: unknown policy {', '.join(unknown) or '(none)'}; known: {', '.join(POLICIES)}"
        )
        return EXIT_BAD_INPUT
    if reconfig_ms is not None and reconfig_ms < 0:
        err.print("error: the reconfiguration latency must be >= 0 ms")
        return EXIT_BAD_INPUT
    from app.wiring import ConfigError, load_cluster

    try:
        cluster = load_cluster(cluster_name_or_file, reconfig_ms)
    except (ConfigError, ValueError, KeyError) as exc:
        err.print(f"error: {exc}")
        return EXIT_BAD_INPUT
    try:
        workload = read_workload(workload_path)
    except WorkloadError as exc:
        err.print(f"error: {exc}")
        return EXIT_BAD_INPUT
    results: list[SimResult] = []
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=False,
    ) as progress:
        for policy in policies:
            task = progress.add_task(f"{policy:>14}", total=len(workload))

            def advance(done: int, total: int, task: TaskID = task) -> None:
                progress.update(task, completed=done, total=total)

            results.append(
                simulate(
                    cluster, workload, policy, seed=seed, reconfig_ms=reconfig_ms, progress=advance
                )
            )
            progress.update(task, completed=len(workload))
    summaries = [summarize(r) for r in results]
    print_table(summaries)
    if out_dir is not None:
        out = Path(out_dir)
        for r in results:
            write_json(out / f"jobs_{r.policy}.json", job_rows(r))
        if len(results) == 1:
            write_json(out / "summary.json", summaries[0])
        else:
            for s in summaries:
                write_json(out / f"summary_{s['policy']}.json", s)
            write_json(out / "comparison.json", comparison(summaries))
            write_comparison_plot(summaries, out / "comparison.png")
        paths = write_plots(results, out)
        err.print(f"wrote results and plots to {out} ({', '.join(p.name for p in paths)})")
    return EXIT_OK


def run_from_trace(trace_path: str, out_path: str, jobs: int | None, seed: int) -> int:
    """Build a workload file from the Kalos trace and the model tables in data/."""
    err = Console(stderr=True)
    try:
        entries = from_kalos_trace(trace_path, jobs=jobs, seed=seed)
        count = write_workload(out_path, entries)
    except WorkloadError as exc:
        err.print(f"error: {exc}")
        return EXIT_BAD_INPUT
    except OSError as exc:
        err.print(f"error: cannot write {out_path}: {exc.strerror or exc}")
        return EXIT_BAD_INPUT
    err.print(f"wrote {count} jobs to {out_path}")
    return EXIT_OK

"""What `lightpath simulate` and `lightpath workload from-trace` do, as plain functions.

The CLI parses arguments and calls these; they return a process exit code
(0 fine, 2 bad input) and print their tables to stdout, progress and errors to
stderr. The cluster is loaded with `app.cluster_files.load_cluster` (imported when
called; neither it nor `app.sim` pulls in web or database code).
"""

from __future__ import annotations

import math
from pathlib import Path

from rich.console import Console
from rich.markup import escape as rich_escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from app.engine.cluster import MAX_RECONFIG_MS
from app.engine.gpu_profiles import gpu_profile
from app.engine.memory import DEFAULT_ZERO_STAGE

from .families import FAMILY_GPU, generate, jitter
from .policies import POLICIES
from .report import (
    aggregate,
    comparison,
    evaluation_table,
    job_rows,
    print_table,
    seeded_summary,
    summarize,
    summarize_compared,
    write_comparison_plot,
    write_error_bar_plot,
    write_json,
    write_plots,
)
from .simulator import SimResult, simulate
from .workload import (
    WorkloadError,
    WorkloadJob,
    check_span,
    from_kalos_trace,
    read_workload,
    write_workload,
)

EXIT_OK = 0
EXIT_BAD_INPUT = 2


def _stderr() -> Console:
    """Messages as written: no markup (a job id "[/]" in a message was a MarkupError
    traceback), no highlighting, no wrapping at 80 columns when not on a terminal."""
    return Console(stderr=True, markup=False, highlight=False, soft_wrap=True)


def run_simulate(
    cluster_name_or_file: str,
    workload_path: str,
    policies: list[str],
    out_dir: str | None,
    seed: int,
    reconfig_ms: float | None,
    seeds: int = 1,
    gpu: str | None = None,
    gpu_memory_bytes: float | None = None,
    default_zero_stage: int = DEFAULT_ZERO_STAGE,
) -> int:
    """Simulate each policy over the workload; print the table; write JSON and plots to out_dir.

    `gpu_memory_bytes` and `default_zero_stage` are the service's admission settings
    (LIGHTPATH_GPU_MEMORY_BYTES, LIGHTPATH_DEFAULT_ZERO_STAGE): the simulation admits
    what the service configured the same way admits.

    One policy writes `summary.json`; several (`--compare`) write `comparison.json`,
    `summary_<policy>.json` each and `comparison.png`. Both write `jobs.json` (every
    job under every policy and seed), `jobs_<policy>.json` and the plots. With
    `seeds` > 1 each policy runs on `seeds` jittered copies of the workload (seed,
    seed+1, ...: arrivals and iteration times, `families.jitter`) and every figure
    is a mean with a 95% confidence interval (`evaluation.png` has the error bars).
    """
    err = _stderr()
    unknown = [p for p in policies if p not in POLICIES]
    if not policies or unknown:
        err.print(
            f"error: unknown policy {', '.join(unknown) or '(none)'}; known: {', '.join(POLICIES)}"
        )
        return EXIT_BAD_INPUT
    if reconfig_ms is not None and not 0 <= reconfig_ms <= MAX_RECONFIG_MS:  # NaN fails too
        err.print(f"error: the reconfiguration latency must be from 0 to {MAX_RECONFIG_MS:,.0f} ms")
        return EXIT_BAD_INPUT
    if seeds < 1:
        err.print("error: --seeds must be at least 1")
        return EXIT_BAD_INPUT
    try:
        if gpu is not None:
            gpu_profile(gpu)
    except ValueError as exc:
        err.print(f"error: {exc}")
        return EXIT_BAD_INPUT
    from app.cluster_files import ConfigError, load_cluster

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
    if out_dir is not None:
        # after the inputs (a refused run leaves no empty directory), before the
        # simulation (a run must not end in a traceback)
        try:
            Path(out_dir).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            err.print(f"error: --out {out_dir}: cannot write results there ({exc.strerror or exc})")
            return EXIT_BAD_INPUT
    runs: dict[str, list[SimResult]] = {p: [] for p in policies}
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=False,
    ) as progress:
        # no live bar off a terminal (a log file, CI): a line every tenth of the jobs
        plain = not err.is_terminal
        for policy in policies:
            task = progress.add_task(f"{policy:>14}", total=len(workload) * seeds)
            for k in range(seeds):
                base = k * len(workload)

                def advance(
                    done: int,
                    total: int,
                    task: TaskID = task,
                    base: int = base,
                    label: str = f"{policy}: seed {k + 1}/{seeds}",
                ) -> None:
                    progress.update(task, completed=base + done)
                    if plain and done % max(1, total // 10) == 0:
                        err.print(f"{label}: {done}/{total} jobs done")

                runs[policy].append(
                    simulate(
                        cluster,
                        jitter(workload, seed + k) if seeds > 1 else workload,
                        policy,
                        seed=seed + k,
                        reconfig_ms=reconfig_ms,
                        progress=advance,
                        gpu=gpu,
                        gpu_memory_bytes=gpu_memory_bytes,
                        default_zero_stage=default_zero_stage,
                    )
                )
            progress.update(task, completed=len(workload) * seeds)
    results = [runs[p][0] for p in policies]
    # policies compared are measured over one steady window per seed (`common_window`)
    per_seed = (
        summarize_compared({p: runs[p] for p in policies})
        if len(policies) > 1
        else {p: [summarize(r) for r in runs[p]] for p in policies}
    )
    aggregates = [aggregate(per_seed[p]) for p in policies]
    # one seed: the run's figures; several: the means, with `ci95` half-widths
    summaries = [per_seed[p][0] if seeds == 1 else seeded_summary(per_seed[p]) for p in policies]
    if seeds == 1:
        print_table(summaries)
    title = f"{cluster.name}, {seeds} seed(s), reconfiguration {cluster.reconfig_ms:g} ms"
    # a cluster file's `name` is the user's text, not markup ("lab [/] rack")
    Console(width=200).print(evaluation_table(aggregates, rich_escape(title)))
    if out_dir is not None:
        out = Path(out_dir)
        rows = []
        for p in policies:
            for k, r in enumerate(runs[p]):
                rows += [dict(row, seed=seed + k) for row in job_rows(r)]
        write_json(out / "jobs.json", rows)
        for r in results:
            write_json(out / f"jobs_{r.policy}.json", job_rows(r))
        if len(results) == 1:
            write_json(out / "summary.json", summaries[0])
        else:
            for s in summaries:
                write_json(out / f"summary_{s['policy']}.json", s)
            write_json(out / "comparison.json", dict(comparison(summaries), seeds=aggregates))
            write_comparison_plot(summaries, out / "comparison.png")
        write_error_bar_plot(aggregates, out / "evaluation.png", title)
        paths = write_plots(results, out)
        err.print(f"wrote results and plots to {out} ({', '.join(p.name for p in paths)})")
    return EXIT_OK


def run_generate(
    family: str, cluster_name_or_file: str, load: float, jobs: int, seed: int, out_path: str
) -> int:
    """Write a synthetic workload of one family (`families.generate`)."""
    err = _stderr()
    from app.cluster_files import ConfigError, load_cluster

    try:
        cluster = load_cluster(cluster_name_or_file)
        entries = generate(family, cluster, load=load, jobs=jobs, seed=seed)
        count = write_workload(out_path, entries)
    except (ConfigError, WorkloadError, ValueError) as exc:
        err.print(f"error: {exc}")
        return EXIT_BAD_INPUT
    except OSError as exc:
        err.print(f"error: cannot write {out_path}: {exc.strerror or exc}")
        return EXIT_BAD_INPUT
    hint = f" (meant for --gpu {FAMILY_GPU[family]})" if family in FAMILY_GPU else ""
    err.print(f"wrote {count} {family} jobs to {out_path}{hint}")
    return EXIT_OK


def run_from_trace(
    trace_path: str, out_path: str, jobs: int | None, seed: int, load: float = 1.0
) -> int:
    """Build a workload file from the Kalos trace and the model tables in data/.

    `load` > 1 compresses the arrivals (times / load): more jobs wait at once.
    """
    err = _stderr()
    if not 0 < load < math.inf:  # inf put every arrival at 0; NaN fails too
        err.print("error: --load must be a positive finite number")
        return EXIT_BAD_INPUT
    try:
        entries = from_kalos_trace(trace_path, jobs=jobs, seed=seed)
        entries = [WorkloadJob(e.job, round(e.arrival_s / load, 3), e.iterations) for e in entries]
        check_span(entries, f"--load {load:g}")
        count = write_workload(out_path, entries)
    except WorkloadError as exc:
        err.print(f"error: {exc}")
        return EXIT_BAD_INPUT
    except OSError as exc:
        err.print(f"error: cannot write {out_path}: {exc.strerror or exc}")
        return EXIT_BAD_INPUT
    err.print(f"wrote {count} jobs to {out_path}")
    if jobs is not None and count < jobs:
        err.print(f"note: --jobs {jobs} asked for more jobs than the trace holds ({count})")
    return EXIT_OK

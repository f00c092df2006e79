"""Fabric controller benchmark: decision time per event at seed-15k with 300 running jobs.

Fills `seed-15k` with 300 jobs of a trace-like size mix (placed by the engine's
`place_job`), feeds them through `engine.controller.step`, then times every kind
of event the worker and the simulator feed it while the cluster stays full:
phase reports of random jobs (with per-phase rewiring once periods are known),
switch confirmations, clock ticks (turns on shared ports), and one arrival plus
one completion at a time (the cluster stays at ~300 jobs). Fixed seed.

Prints p50/p99 per event kind and exits non-zero when any p99 exceeds 10 ms.

That synthetic mix is mostly one-pod jobs (few cross-pod slices). `--workload
FILE` measures instead on a workload replayed through the simulator's lightpath
policy (`bench/workloads/scatter-1500.jsonl.gz`: 250-300 jobs running, many
spanning pods): the CPU time of every arrival and completion the simulator feeds
the controller while at least `--min-running` jobs are running, exactly the
calls the worker makes (`SimResult.controller_steps`). The replay runs `--repeat`
times (3), each in a fresh process, and is judged on the median run's p99: on a
shared VM the same code's p50 moved from 1.96 to 2.97 ms between consecutive runs,
so one run's p99 says as much about the machine as about the code.

`--learn`: the synthetic jobs state no model facts to the controller (it sizes
them as the default 7B model) while their phase reports carry their real 7B, 13B
or 70B bytes, so the controller learns their demand from the reports (see the
README's "Traffic reports and the cycle predictor"); phases whose step changed
the job's demand are timed apart (`phase (learned)`).

Both modes run under the worker's fabric-process collector policy
(`app.worker.gc_policy`): garbage collections between steps, not inside one, as
the fabric process makes them between passes.

Run: .venv/bin/python bench/bench_controller.py [--events N]
     .venv/bin/python bench/bench_controller.py --workload bench/workloads/scatter-1500.jsonl.gz
         [--jobs 800] [--min-running 250] [--repeat 3]
     .venv/bin/python bench/bench_controller.py --learn
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections import Counter, defaultdict

from app.engine.cluster import preset
from app.engine.controller import (
    ControllerConfig,
    JobCompleted,
    JobPlaced,
    PhaseObserved,
    SwitchConfirmed,
    Tick,
    network_view,
    new_controller,
    step,
)
from app.engine.job import Job, ModelFacts, Parallelism, Placement
from app.engine.placement import place_job
from app.engine.plan_signature import Demand, aggregate_pod_demand
from app.engine.traffic import PHASE_DP, PHASE_PP, job_traffic
from app.sim.families import jitter
from app.sim.simulator import simulate
from app.sim.workload import read_workload
from app.worker.gc_policy import collect_if_due, defer_collections

SEED = 20261123
P99_BOUND_MS = 10.0
REPLAY_RECONFIG_MS = 25.0  # the evaluation's OXC latency
RUNNING = 300


def _job(rng: random.Random, k: int) -> Job:
    # many small jobs and, one in 10, a 40-48 server job: once pods fill up these
    # span pods, so cross-pod slices, circuits and turns are part of the measurement
    if k % 10 == 0:
        dp, pp = rng.choice([20, 24]), 2
    else:
        dp = rng.choices([1, 2, 4], weights=[60, 30, 10])[0]
        pp = 1
    return Job(
        f"job-{k}",
        Parallelism(dp=dp, pp=pp, ep=1),
        ModelFacts(rng.choice([7e9, 13e9, 70e9]), 2.0, 3e7, 8),
    )


def _phases(cluster, job: Job, placement: Placement) -> list:
    """The job's pp and dp phases as server demands (what telemetry would report)."""
    out = []
    for t in job_traffic(cluster, job, placement, "ring"):
        if t.phase in (PHASE_PP, PHASE_DP):
            demands = [Demand(f.src, f.dst, f.size_bytes) for f in t.flows]
            out.append(aggregate_pod_demand(cluster, demands))
    return out


def replay(path: str, jobs: int, min_running: int, collector: bool, repeat: int) -> int:
    """Controller CPU time per arrival and completion inside a lightpath simulation,
    `repeat` times, each in a fresh process (the engine's memos start cold, as they
    would for a new workload): judged on the median run's p99 per event kind."""
    print(f"{'run':<5}{'event':<12}{'n':>6}{'p50 cpu ms':>12}{'p90':>8}{'p99':>8}{'max':>8}")
    p99s: dict[str, list[float]] = defaultdict(list)
    running: list[int] = []
    for run in range(1, repeat + 1):
        print(
            f"run {run}/{repeat}: replaying {jobs} jobs of {path} (lightpath) ...", file=sys.stderr
        )
        child = [sys.executable, __file__, "--workload", path, "--jobs", str(jobs)]
        child += ["--min-running", str(min_running), "--one-run", str(run)]
        child += [] if collector else ["--no-gc"]
        done = subprocess.run(child, stdout=subprocess.PIPE, text=True, check=False)
        got = None
        for line in done.stdout.splitlines():
            if line.startswith(RESULT):
                got = json.loads(line[len(RESULT) :])
            else:
                print(line)
        if done.returncode != 0 or got is None:
            print(f"run {run} failed (exit {done.returncode}): not judged", file=sys.stderr)
            return 1
        if not got["running"] or set(got["p99"]) != {"arrival", "completion"}:
            print(
                f"run {run}: no arrival or completion with {min_running} or more jobs running",
                file=sys.stderr,
            )
            return 1
        running += got["running"]
        for kind, v in got["p99"].items():
            p99s[kind].append(v)
    worst = max(statistics.median(v) for v in p99s.values())
    ok = worst <= P99_BOUND_MS
    spread = "; ".join(
        f"{k} p99 {min(v):.2f}-{max(v):.2f} over {len(v)} runs" for k, v in p99s.items()
    )
    print(
        f"worst median p99 with {min(running)}-{max(running)} jobs running: {worst:.2f} ms CPU "
        f"(bound {P99_BOUND_MS} ms): "
        + ("ok" if ok else "MISSED")
        + f" ({spread}); load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores"
    )
    return 0 if ok else 1


RESULT = "RESULT "  # a child run's last line: its p99 per event kind, as JSON


def _replay_once(path: str, jobs: int, min_running: int, collector: bool, run: int) -> None:
    if not collector:
        gc.disable()  # diagnosis: how much of the tail is collector pauses
    cluster = preset("seed-15k", reconfig_ms=REPLAY_RECONFIG_MS)
    workload = jitter(read_workload(path), 1)[:jobs]
    # the fabric process's collector policy: start-up state frozen, collections
    # between passes, never inside one (`app.worker.gc_policy`)
    gc.freeze()
    defer_collections()

    def progress(done: int, total: int) -> None:
        if done % 200 == 0:
            print(f"  {done}/{total} jobs done", file=sys.stderr)

    result = simulate(
        cluster,
        workload,
        "lightpath",
        seed=1,
        reconfig_ms=cluster.reconfig_ms,
        progress=progress,
        between_steps=collect_if_due if collector else None,
    )
    steps = [s for s in result.controller_steps if s.running >= min_running]
    p99: dict[str, float] = {}
    for kind in ("arrival", "completion"):
        ordered = sorted(s.cpu_ms for s in steps if s.event == kind)
        if not ordered:
            continue
        p99[kind] = _p99(ordered)
        print(
            f"{run:<5}{kind:<12}{len(ordered):>6}{statistics.median(ordered):>12.2f}"
            f"{ordered[int(0.9 * len(ordered))]:>8.2f}{p99[kind]:>8.2f}{ordered[-1]:>8.2f}"
        )
    print(RESULT + json.dumps({"p99": p99, "running": [s.running for s in steps]}), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=3000)
    parser.add_argument("--workload", help="replay this workload through the simulator instead")
    parser.add_argument("--jobs", type=int, default=800, help="with --workload: its first N jobs")
    parser.add_argument("--min-running", type=int, default=250)
    parser.add_argument(
        "--no-gc", action="store_true", help="with --workload: the collector off (diagnosis)"
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="with --workload: replays; the bound holds the median run's p99 (one run's "
        "moves 20-40%% with this VM's speed)",
    )
    parser.add_argument(
        "--learn",
        action="store_true",
        help="synthetic jobs state no model facts; their reports carry their real bytes",
    )
    parser.add_argument("--one-run", type=int, help=argparse.SUPPRESS)  # a child of --repeat
    args = parser.parse_args()
    if args.workload and args.one_run:
        _replay_once(args.workload, args.jobs, args.min_running, not args.no_gc, args.one_run)
        return 0
    if args.workload:
        if args.repeat < 1:
            parser.error("--repeat must be at least 1")
        return replay(args.workload, args.jobs, args.min_running, not args.no_gc, args.repeat)
    rng = random.Random(SEED)
    cluster = preset("seed-15k")
    state = new_controller(cluster, ControllerConfig(reconfig_ms=cluster.reconfig_ms))
    free = set(cluster.server_ids)
    placed: dict[str, tuple[Job, Placement]] = {}
    k = 0
    now = 0.0
    times: dict[str, list[float]] = defaultdict(list)  # wall ms
    cpu_times: dict[str, list[float]] = defaultdict(list)  # this process's CPU ms

    # the fabric process's collector policy (`app.worker.gc_policy`), as in the replay
    defer_collections()

    def feed(kind: str, event) -> None:
        nonlocal state
        demand = state.demands.get(event.job_id) if kind == "phase" else None
        start, cpu = time.perf_counter(), time.process_time()
        state, decisions = step(state, event)
        if kind == "phase" and state.demands.get(event.job_id) is not demand:
            kind = "phase (learned)"
        times[kind].append((time.perf_counter() - start) * 1000)
        cpu_times[kind].append((time.process_time() - cpu) * 1000)
        collect_if_due()
        if any(d.kind == "oxc" for d in decisions):
            held = frozenset(cc.key for cc in state.desired)
            start, cpu = time.perf_counter(), time.process_time()
            state, _ = step(state, SwitchConfirmed(held, event.at_s + 0.025))
            times["confirm"].append((time.perf_counter() - start) * 1000)
            cpu_times["confirm"].append((time.process_time() - cpu) * 1000)
            collect_if_due()

    def arrive() -> bool:
        """Place the next job of the mix that fits the free servers (a few tries)."""
        nonlocal k
        for _ in range(50):
            job = _job(rng, k)
            k += 1
            p = place_job(cluster, free, job)
            if isinstance(p, Placement):
                free.difference_update(p.servers)
                placed[job.job_id] = (job, p)  # its reports carry the real bytes
                told = dataclasses.replace(job, model=None) if args.learn else job
                feed("arrival", JobPlaced(told, p, now))
                return True
        return False

    print(f"filling seed-15k with {RUNNING} jobs ...", file=sys.stderr)
    while len(placed) < RUNNING and arrive():
        now += 0.01
    # the worker does the same once its memory is loaded: long-lived state leaves the
    # collector's generations, so a full collection does not walk 300 jobs' plans
    gc.freeze()
    fill_ms = list(times.pop("arrival"))
    fill_cpu = list(cpu_times.pop("arrival"))
    times.pop("confirm", None)
    cpu_times.pop("confirm", None)
    phases = {j: _phases(cluster, job, p) for j, (job, p) in placed.items()}
    counters: dict[str, int] = defaultdict(int)
    modes = Counter(view.mode for j in placed if (view := network_view(state, j)) is not None)
    print(
        f"{len(placed)} jobs running ({dict(modes)} by network mode), "
        f"{len(free)} servers free; timing events ...",
        file=sys.stderr,
    )
    for i in range(args.events):
        now += 0.02
        r = rng.random()
        if r < 0.03 and placed:
            gone = rng.choice(sorted(placed))
            _, p = placed.pop(gone)
            free.update(p.servers)
            phases.pop(gone, None)
            feed("completion", JobCompleted(gone, now))
            if arrive():
                job_id = f"job-{k - 1}"
                job, p = placed[job_id]
                phases[job_id] = _phases(cluster, job, p)
        elif r < 0.07:
            feed("tick", Tick(now))
        else:
            job_id = rng.choice(sorted(phases))
            seq = phases[job_id]
            if not seq:
                continue
            n = counters[job_id]
            counters[job_id] += 1
            demand = seq[n % len(seq)]
            feed("phase", PhaseObserved(job_id, demand, now, now + 0.001))
        if i and i % 1000 == 0:
            print(f"  {i}/{args.events} events", file=sys.stderr)
    worst = 0.0
    print(f"{'event':<16}{'n':>7}{'p50 ms':>10}{'p99 ms':>10}{'p99 cpu ms':>12}")
    rows = {"arrival (fill)": (fill_ms, fill_cpu)}
    rows.update({kind: (values, cpu_times[kind]) for kind, values in times.items()})
    for kind, (values, cpu_values) in rows.items():
        if not values:
            continue
        p99 = _p99(values)
        if kind != "arrival (fill)":
            worst = max(worst, p99)
        print(
            f"{kind:<16}{len(values):>7}{statistics.median(values):>10.2f}{p99:>10.2f}"
            f"{_p99(cpu_values):>12.2f}"
        )
    judged = [k for k, v in times.items() if v]
    ok = bool(judged) and worst <= P99_BOUND_MS  # no event measured: not judged, fails
    load = os.getloadavg()[0]
    print(
        f"worst p99 at {len(placed)} running jobs: {worst:.2f} ms (bound {P99_BOUND_MS} ms): "
        + ("ok" if ok else "MISSED")
        + f"; load average {load:.2f} on {os.cpu_count()} cores"
    )
    return 0 if ok else 1


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


if __name__ == "__main__":
    sys.exit(main())

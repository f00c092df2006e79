"""Simulator properties: ideal is the bound, hand-computed times, determinism, bulk == stepped."""

from __future__ import annotations

import pytest

from app.engine.cluster import build_cluster, preset
from app.engine.collective import REDUCE_S_PER_BYTE
from app.engine.job import Collective, ComputeTimes, Job, ModelFacts, Parallelism
from app.sim.policies import POLICIES
from app.sim.report import SUMMARY_FIELDS, summarize
from app.sim.simulator import simulate
from app.sim.workload import WorkloadJob, parse_workload_job
from tests.support import narrow_cluster

ALPHA = 14e-6  # NCCL NET/Ring/Simple, the engine's ALPHA_RING_S
SERVER_BPS = 8 * 400e9 / 8  # 8 NICs of 400 Gb/s per server, bytes/s


def _job(job_id, dp, pp, *, params=2e9, act=16e6, m=8, f=0.01, b=0.02, opt=0.005, coll="auto"):
    return Job(
        job_id,
        Parallelism(dp=dp, pp=pp),
        ModelFacts(parameters=params, bytes_per_parameter=2, activation_bytes=act, microbatches=m),
        ComputeTimes(f, b, opt),
        Collective(coll),
    )


def _mixed_workload(iterations=300):
    """Jobs on `small` (4 pods x 8 servers): most must cross pods once the first ones run."""
    specs = [(4, 2), (8, 1), (2, 4), (6, 2), (4, 1), (3, 2), (8, 2), (2, 2)]
    return [
        WorkloadJob(_job(f"j{i}", dp, pp, params=4e9 + i * 1e9), i * 7.0, iterations + 37 * i)
        for i, (dp, pp) in enumerate(specs)
    ]


def _sharing_workload():
    """Wide jobs arriving while others run: they share pods' links and ports mid-run."""
    return [
        WorkloadJob(_job("a", 12, 1, params=8e9), 0.0, 400),
        WorkloadJob(_job("b", 12, 1, params=6e9), 13.3, 300),
        WorkloadJob(_job("c", 4, 2, params=5e9), 27.1, 250),
        WorkloadJob(_job("d", 2, 1), 31.0, 90),
    ]


def _comparable(result):
    return [
        (j.job_id, j.start_s, j.end_s, j.exposed_s, j.reconfigurations, j.hits, j.misses)
        for j in result.jobs
    ]


def test_ideal_slowdown_is_one_and_no_policy_beats_it():
    cluster = preset("small")
    workload = _mixed_workload()
    ideal = simulate(cluster, workload, "ideal", seed=3)
    assert all(j.slowdown == pytest.approx(1.0, abs=1e-12) for j in ideal.jobs)
    assert summarize(ideal)["mean_iteration_slowdown"] == pytest.approx(1.0, abs=1e-12)
    slower_somewhere = False
    for policy in POLICIES:
        result = simulate(cluster, workload, policy, seed=3)
        for j in result.jobs:
            assert j.slowdown is not None and j.slowdown >= 1.0 - 1e-12, (policy, j.job_id)
            slower_somewhere |= j.slowdown > 1.0 + 1e-6
    assert slower_somewhere  # the baselines are not all the bound


def test_zero_latency_reactive_equals_ideal_where_circuits_suffice():
    # two pods whose 32 uplinks match their 4 servers' 32 NICs: circuits suffice
    cluster = build_cluster(
        "two",
        pods=2,
        tors_per_pod=1,
        servers_per_tor=4,
        uplink_ports_per_pod=32,
        oxcs=2,
        oxc_ports=64,
        reconfig_ms=0.0,
    )
    workload = [
        WorkloadJob(_job("ring", 8, 1, coll="ring"), 0.0, 50),
        WorkloadJob(_job("pipe", 4, 2, coll="ring"), 1.0, 40),
    ]
    ideal = simulate(cluster, workload, "ideal")
    reactive = simulate(cluster, workload, "reactive", reconfig_ms=0.0)
    assert {j.mode for j in reactive.jobs} == {"isolated"}
    for a, b in zip(ideal.jobs, reactive.jobs, strict=True):
        assert b.end_s == pytest.approx(a.end_s, rel=1e-12)
        assert b.exposed_s == 0.0
    slow = simulate(cluster, workload, "reactive", reconfig_ms=25.0)
    # one phase per iteration on its own topology: the rule never rewires what cannot pay
    assert slow.jobs[0].reconfigurations == 1  # the placement install only
    assert slow.jobs[0].end_s == pytest.approx(ideal.jobs[0].end_s, rel=1e-12)


def test_single_job_matches_hand_computed_iteration_time():
    cluster = preset("small")
    f, b, opt, m, act, p = 0.01, 0.02, 0.005, 8, 16e6, 2
    # PP only (dp=1): GPipe span with sends at the server's NIC rate
    s = ALPHA + act / SERVER_BPS
    span = p * f + (p - 1) * s + (m - 1) * max(f, s) + p * b + (p - 1) * s + (m - 1) * max(b, s)
    pipe = [WorkloadJob(_job("p", 1, p, act=act, m=m, f=f, b=b, opt=opt), 0.0, 100)]
    # DP only, two servers under one ToR: ring T = (N-1)(2a + 2S/(N B) + S C / N), N = 2
    size = 2e9 * 2  # parameters * bytes per parameter, one stage
    ring = 2 * ALPHA + size / SERVER_BPS + size * REDUCE_S_PER_BYTE / 2
    dp = [WorkloadJob(_job("d", 2, 1, m=m, f=f, b=b, opt=opt), 0.0, 100)]
    for policy in POLICIES:
        r = simulate(cluster, pipe, policy)
        assert r.jobs[0].end_s == pytest.approx(100 * (span + opt), rel=1e-12), policy
        r = simulate(cluster, dp, policy)
        # 2e9 parameters = 50 buckets of 40M: all but the last overlap the last backward
        exposed = max(ring / 50, ring - b * (1 - 1 / 50))
        assert r.jobs[0].end_s == pytest.approx(100 * (m * (f + b) + exposed + opt), rel=1e-12)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("shape", ["mixed", "sharing"])
def test_bulk_advance_equals_stepping_every_iteration(policy, shape):
    cluster = preset("small", reconfig_ms=25.0)
    workload = _mixed_workload(iterations=120) if shape == "mixed" else _sharing_workload()
    bulk = simulate(cluster, workload, policy, seed=5)
    stepped = simulate(cluster, workload, policy, seed=5, step_by_step=True)
    for a, b in zip(_comparable(bulk), _comparable(stepped), strict=True):
        assert a[0] == b[0] and a[4:] == b[4:]
        assert a[1:4] == pytest.approx(b[1:4], rel=1e-9, abs=1e-9)
    assert bulk.compute_gpu_s == pytest.approx(stepped.compute_gpu_s, rel=1e-12)


def test_runs_are_deterministic_for_a_seed():
    cluster = preset("small")
    workload = _mixed_workload()
    for policy in ("ecmp", "lightpath", "lightpath-seed"):
        one = summarize(simulate(cluster, workload, policy, seed=11))
        two = summarize(simulate(cluster, workload, policy, seed=11))
        one.pop("wall_s"), two.pop("wall_s")
        assert one == two
    summary = summarize(simulate(cluster, workload, "lightpath", seed=11))
    assert set(SUMMARY_FIELDS) <= set(summary)
    assert summary["prediction_hits"] + summary["prediction_held"] > 0


def test_ecmp_polarisation_depends_on_the_seed_and_hurts():
    cluster = preset("small")
    workload = _mixed_workload()
    ideal = summarize(simulate(cluster, workload, "ideal"))
    runs = [summarize(simulate(cluster, workload, "ecmp", seed=s)) for s in range(3)]
    assert len({r["makespan_s"] for r in runs}) > 1
    assert all(r["mean_iteration_slowdown"] > ideal["mean_iteration_slowdown"] for r in runs)


def test_jobs_without_circuits_run_on_the_electrical_core_no_faster_than_ideal():
    workload = [
        WorkloadJob(_job(f"w{i}", 10, 1, params=6e9 + i * 1e9), 1.0 * i, 200) for i in range(3)
    ]
    core = narrow_cluster(1600.0)
    ideal = {j.job_id: j for j in simulate(core, workload, "ideal").jobs}
    run = simulate(core, workload, "lightpath")
    modes = {j.job_id: j.mode for j in run.jobs}
    assert "electrical" in modes.values(), modes
    for j in run.jobs:
        assert j.end_s is not None and not j.stalled
        # the electrical core is slower than the NICs: never faster than ideal
        assert j.end_s - j.start_s >= ideal[j.job_id].end_s - ideal[j.job_id].start_s - 1e-9
    stepped = simulate(core, workload, "lightpath", step_by_step=True)
    for a, b in zip(_comparable(run), _comparable(stepped), strict=True):
        assert a[0] == b[0] and a[4:] == b[4:]
        assert a[1:4] == pytest.approx(b[1:4], rel=1e-9, abs=1e-9)
    assert summarize(run)["jobs_electrical"] == sum("electrical" in j.modes for j in run.jobs)
    assert summarize(run)["jobs_electrical"] >= 1
    # without the core the same jobs keep to circuits (or turns)
    turns = simulate(narrow_cluster(0.0), workload, "lightpath")
    assert "electrical" not in {j.mode for j in turns.jobs}
    assert summarize(turns)["jobs_electrical"] == 0


def test_a_run_whose_queue_never_builds_reports_no_steady_utilisation_not_zero():
    from rich.console import Console

    from app.sim.report import NO_STEADY_WINDOW, aggregate, evaluation_table

    cluster = preset("small")
    workload = [WorkloadJob(_job("solo", 2, 1), 0.0, 50)]
    runs = [summarize(simulate(cluster, workload, p, seed=s)) for p in ("ideal",) for s in (0, 1)]
    assert all(r["steady_utilization"] is None for r in runs)
    console = Console(width=300, record=True)
    console.print(evaluation_table([aggregate(runs)], "t"))
    text = console.export_text()
    assert NO_STEADY_WINDOW.split(";")[0] in " ".join(text.split())
    assert "0.00" not in text.split("ideal")[1].split("│")[1]


@pytest.mark.parametrize("reconfig_ms", [25.0, 100.0, 1000.0])
def test_the_placement_install_is_charged_once_however_long_the_switches_take(reconfig_ms):
    """Iterations of 4 ms: the switches confirm the placement's circuits after 6 to
    250 of them. Lightpath's walk used to find those iterations alike (their phases
    waiting, unscored) and stop before the confirmation: no phase counted and the
    install uncharged from 100 ms on; walked on the fixed timing, every phase before
    the confirmation waited instead. The first phase waits, once, as under static."""
    job = Job(
        "x",
        Parallelism(dp=16, pp=1),
        ModelFacts(parameters=1.3e9, bytes_per_parameter=2, activation_bytes=16e6, microbatches=1),
        ComputeTimes(0.001, 0.002, 0.001),
    )
    cluster = preset("small", reconfig_ms=reconfig_ms)
    runs = {
        policy: simulate(cluster, [WorkloadJob(job, 0.0, 1000)], policy, reconfig_ms=reconfig_ms)
        for policy in ("static", "lightpath")
    }
    for policy, result in runs.items():
        (j,) = result.jobs
        assert j.hits + j.held + j.misses == 1000, policy
        assert j.misses == 1, policy
    exposed = {p: r.jobs[0].exposed_s for p, r in runs.items()}
    assert exposed["lightpath"] == pytest.approx(exposed["static"], rel=1e-6)
    assert exposed["static"] == pytest.approx(reconfig_ms / 1000 - 0.001, rel=1e-3)


def test_a_run_where_no_job_ran_reports_null_not_zero():
    """A slowdown of 0.0 (below the ideal fabric's 1) and a JCT of 0 s were reported
    when every job was refused: undefined figures are null."""
    workload = [WorkloadJob(_job("wide", 64, 1), 0.0, 100)]  # small holds 32 servers
    summary = summarize(simulate(preset("small"), workload, "lightpath"))
    assert summary["jobs_completed"] == 0 and summary["jobs_refused"] == 1
    for key in (
        "gpu_utilization",
        "mean_jct_s",
        "mean_iteration_slowdown",
        "p99_iteration_slowdown",
        "max_iteration_slowdown",
        "mean_queueing_delay_s",
        "mean_network_share",
    ):
        assert summary[key] is None, key


@pytest.mark.parametrize("shift", [1e8, 3.1e9])
def test_a_workload_scores_the_same_whenever_it_arrives(shift):
    """Arrivals up to 3.2e9 s are valid, but the first phase after the placement install
    started 1e-9 s after the switches confirmed it, an offset that rounds away past 1e7
    s: the phase came before the confirmation (a third job read 2 misses where it had
    1). Shifted by `shift`, the same workload reads the same counts and slowdowns (to
    the resolution of its times)."""
    z = {"parameters": 7e9, "bytes_per_parameter": 2, "activation_bytes": 5e7, "microbatches": 8}
    bodies = [
        {"job_id": "x", "parallelism": {"dp": 12, "pp": 1}, "arrival_s": 0, "iterations": 1000},
        {"job_id": "y", "parallelism": {"dp": 4, "pp": 3}, "arrival_s": 1, "iterations": 1000},
        {"job_id": "z", "parallelism": {"dp": 2, "pp": 6}, "model": z, "arrival_s": 1.37,
         "iterations": 1000},
    ]  # fmt: skip
    jobs = [parse_workload_job(b, f"line {n}", n) for n, b in enumerate(bodies)]
    late = [WorkloadJob(w.job, w.arrival_s + shift, w.iterations) for w in jobs]
    cluster = preset("small")
    for policy in ("ideal", "lightpath"):
        early_run, late_run = (simulate(cluster, w, policy) for w in (jobs, late))
        for a, b in zip(early_run.jobs, late_run.jobs, strict=True):
            assert (a.hits, a.held, a.misses) == (b.hits, b.held, b.misses), (policy, a.job_id)
            assert b.exposed_s == pytest.approx(a.exposed_s, rel=1e-6, abs=1e-9)
            # (times of 3.1e9 s are kept to 5e-7 s: a 50 s job's slowdown to 1e-8)
            assert b.slowdown == pytest.approx(a.slowdown, rel=1e-7)


def test_jobs_the_queue_starts_after_a_stall_that_cannot_progress_are_stalled_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A sweep: the end-of-run cleanup stalled the running job once; the next job it let
    in could not progress either and stayed running, the rest counted as never started."""
    import dataclasses
    import math

    from app.sim import simulator as sim_module

    real = sim_module.profile_optical

    def no_circuit_carries(*args, **kwargs):  # type: ignore[no-untyped-def]
        p = real(*args, **kwargs)
        return dataclasses.replace(p, pp_alone_s=math.inf, dp_alone_s=math.inf)

    monkeypatch.setattr(sim_module, "profile_optical", no_circuit_carries)
    cluster = preset("small")  # 32 servers: one 20-server job at a time
    workload = [WorkloadJob(_job(f"w{i}", 20, 1), float(i), 10) for i in range(3)]
    jobs = simulate(cluster, workload, "lightpath").jobs
    assert [j.stalled is not None for j in jobs] == [True, True, True], [j.stalled for j in jobs]
    assert all(j.end_s is None or j.stalled for j in jobs)


@pytest.mark.parametrize("iterations", [2, 5])
def test_every_phase_of_a_short_job_is_counted_once(iterations: int) -> None:
    """A sweep: with no backward or optimizer time the dp phase ends past its iteration;
    the walk left the last one uncounted (lightpath 1 phase of 2 where static held 2)."""
    from app.engine.cluster import cluster_from_dict

    pods = [
        {"id": f"p{i}", "uplink_ports": 2,
         "tors": [{"id": f"p{i}/t0", "servers": [{"id": f"p{i}/s{k}"} for k in range(2)]}]}
        for i in range(2)
    ]  # fmt: skip
    oxc = {"id": "o0", "ports": 4, "reconfig_ms": 25, "pod_ports": {"p0": [0, 1], "p1": [2, 3]}}
    cluster = cluster_from_dict({"pods": pods, "oxcs": [oxc]})
    job = _job("a", 4, 1, params=1e9, m=1, f=0.1, b=0.0, opt=0.0)
    counts = {}
    for policy in ("static", "lightpath"):
        s = summarize(simulate(cluster, [WorkloadJob(job, 0.0, iterations)], policy))
        counts[policy] = s["prediction_hits"] + s["prediction_misses"] + s["prediction_held"]
    assert counts == {"static": iterations, "lightpath": iterations}, counts

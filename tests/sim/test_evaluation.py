"""The evaluation's guarantees: calibrated timing, charged sharing, bounds, determinism."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from app.engine.cluster import Cluster, build_cluster, cluster_from_dict, preset
from app.engine.collective import AggregatorLedger
from app.engine.controller import ControllerConfig, new_controller
from app.engine.fabric import FabricPlan
from app.engine.job import ComputeTimes, Job, ModelFacts, Parallelism, PipelineSchedule
from app.engine.memory import check_job_memory
from app.engine.placement import OPTICAL_EXTRA_PODS
from app.engine.rewiring_rules import reactive_rewires
from app.sim.commands import run_from_trace, run_generate, run_simulate
from app.sim.families import FAMILIES, FAMILY_GPU, generate, jitter
from app.sim.policies import POLICIES, turn_factor
from app.sim.report import common_window, job_rows, mean_ci95, summarize, summarize_compared
from app.sim.simulator import JobResult, SimResult, simulate
from app.sim.workload import WorkloadError, WorkloadJob, read_workload

TABLE = Path(__file__).resolve().parents[2] / "data" / "tables" / "megatron_sc21_table1.csv"


def _table1_rows() -> list[dict[str, str]]:
    with open(TABLE, newline="") as f:
        return list(csv.DictReader(f))


def _row_job(r: dict[str, str]) -> Job:
    """A Table 1 row as Lightpath runs it: TP (and TP<8 replicas) inside 8-GPU servers,
    with Megatron's 1F1B schedule and activation recomputation (else the memory check
    the simulator applies, as the service does, refuses the larger rows)."""
    gpus, tp, pp = int(r["num_gpus"]), int(r["tensor_parallel"]), int(r["pipeline_parallel"])
    dp_megatron = int(r["data_parallel_derived"])
    h, s = int(r["hidden_size"]), int(r["seq_len"])
    mbs = 8 // tp  # one server runs 8/tp Megatron replicas' micro-batches side by side
    return Job(
        f"gpt-{r['params_billion']}",
        Parallelism(dp=gpus // (8 * pp), pp=pp),
        ModelFacts(
            parameters=float(r["params_billion"]) * 1e9,
            bytes_per_parameter=2.0,
            activation_bytes=float(h * s * mbs * 2),
            microbatches=int(r["global_batch_size"]) // dp_megatron,
            hidden_size=h,
            num_layers=int(r["num_layers"]),
            seq_len=s,
            microbatch_size=mbs,
            activation_checkpointing=True,
        ),
        schedule=PipelineSchedule.ONE_F_ONE_B,
    )


@pytest.mark.parametrize("row", _table1_rows(), ids=lambda r: f"{r['params_billion']}B")
def test_megatron_table1_rows_alone_on_ideal_within_10_percent(row: dict[str, str]) -> None:
    cluster = preset("seed-15k")
    job = _row_job(row)
    result = simulate(cluster, [WorkloadJob(job, 0.0, 3)], "ideal", gpu="a100")
    j = result.jobs[0]
    assert j.end_s is not None and j.start_s is not None
    iteration = (j.end_s - j.start_s) / 3
    derived = float(row["derived_iteration_time_s"])
    assert iteration == pytest.approx(derived, rel=0.10), (iteration, derived)


# ---------------------------------------------------------------- sharing is charged


def _job(job_id: str, dp: int, pp: int = 1, *, params: float = 4e9, f: float = 0.02) -> Job:
    return Job(
        job_id,
        Parallelism(dp=dp, pp=pp),
        ModelFacts(parameters=params, bytes_per_parameter=2, activation_bytes=16e6, microbatches=8),
        ComputeTimes(f, 2 * f, 0.005),
    )


def _tight_cluster() -> Cluster:
    """Three pods of four servers with one uplink each: two wide jobs cannot both have
    circuits of their own (the allocation shares ports by demand, so with more
    uplinks both would be isolated with fewer circuits each)."""
    return build_cluster(
        "tight",
        pods=3,
        tors_per_pod=1,
        servers_per_tor=4,
        uplink_ports_per_pod=1,
        oxcs=1,
        oxc_ports=3,
        reconfig_ms=25.0,
    )


def _mean_iteration(job: JobResult) -> float:
    assert job.end_s is not None and job.start_s is not None
    return (job.end_s - job.start_s) / job.iterations


@pytest.mark.parametrize("policy", ["static", "reactive", "lightpath"])
def test_a_job_taking_turns_is_never_faster_than_alone(policy: str) -> None:
    cluster = _tight_cluster()
    jobs = [
        WorkloadJob(_job("a", 6), 0.0, 400),
        WorkloadJob(_job("b", 6, params=3e9), 1.0, 300),
    ]
    together = simulate(cluster, jobs, policy)
    assert {j.mode for j in together.jobs} >= {"time_division"}  # the scenario shares ports
    for j in together.jobs:
        alone = simulate(cluster, [next(w for w in jobs if w.job.job_id == j.job_id)], policy)
        assert _mean_iteration(j) >= _mean_iteration(alone.jobs[0]) * (1 - 1e-12), j.job_id
        if j.mode == "time_division":
            assert _mean_iteration(j) > _mean_iteration(alone.jobs[0])  # the turns cost


def test_turns_charge_every_sharer_and_each_reconfiguration() -> None:
    cluster = _tight_cluster()
    state = new_controller(cluster, ControllerConfig(25.0, turn_ms=1000.0))
    assert turn_factor(state) == pytest.approx(1 / (1 - 0.025))
    fabric = FabricPlan((), (), 0.0, AggregatorLedger(), ("x", "y", "z"), ())
    shared = replace(state, fabric=fabric)
    assert turn_factor(shared) == pytest.approx(3 / (1 - 0.025))


def test_reactive_rewires_only_when_the_saving_pays() -> None:
    assert not reactive_rewires(0.050, 0.030, 0.025)  # saves 20 ms, costs 25 ms
    assert reactive_rewires(0.080, 0.030, 0.025)
    assert reactive_rewires(math.inf, 0.030, 0.025)  # unroutable on what is installed


# ---------------------------------------------------------------- a job that cannot progress


def test_a_job_no_circuit_could_carry_is_refused_not_hung() -> None:
    # two OXCs, each wired to one pod only: no circuit can ever join pod-1 and pod-2.
    # The job spanning both was placed and reported stalled; it now never fits.
    cluster = cluster_from_dict(
        {
            "name": "split",
            "pods": [
                {
                    "id": f"pod-{p}",
                    "uplink_ports": 4,
                    "tors": [
                        {"id": f"tor-{p}", "servers": [{"id": f"s-{p}-{i}"} for i in range(4)]}
                    ],
                }
                for p in (1, 2)
            ],
            "oxcs": [
                {"id": "oxc-1", "ports": 8, "pod_ports": {"pod-1": [0, 1, 2, 3]}},
                {"id": "oxc-2", "ports": 8, "pod_ports": {"pod-2": [0, 1, 2, 3]}},
            ],
        }
    )
    jobs = [
        WorkloadJob(_job("wide", 8), 0.0, 100),
        WorkloadJob(_job("next", 2), 1.0, 50),
    ]
    result = simulate(cluster, jobs, "lightpath")
    wide, nxt = result.jobs
    assert wide.refused and wide.end_s is None and not wide.stalled
    assert nxt.end_s is not None  # the queue behind it was served
    assert summarize(result)["jobs_refused"] == 1
    # its row in jobs.json has no figure it never had (ideal_iteration_s read 0.0)
    row = next(r for r in job_rows(result) if r["job_id"] == "wide")
    assert row["refused"] and row["ideal_iteration_s"] is None and row["iteration_s"] is None


# ---------------------------------------------------------------- bounds and determinism


@pytest.mark.parametrize("family", FAMILIES)
def test_ideal_bounds_every_policy_on_each_family(family: str) -> None:
    cluster = preset("seed-15k")
    workload = generate(family, cluster, load=1.2, jobs=24, seed=3)
    gpu = FAMILY_GPU.get(family)
    for policy in POLICIES:
        for j in simulate(cluster, workload, policy, gpu=gpu).jobs:
            assert j.slowdown is not None and j.slowdown >= 1.0 - 1e-9, (policy, j.job_id)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_generated_job_passes_the_services_memory_check(family: str) -> None:
    """The service would admit every job of every family (80 GiB, the smallest GPU):
    the evaluation runs no job that POST /v1/jobs would refuse."""
    cluster = preset("seed-15k")
    for seed in (1, 2):
        for entry in generate(family, cluster, load=1.2, jobs=120, seed=seed):
            check = check_job_memory(entry.job, 80 * 1024**3, tp=cluster.gpus_per_server)
            assert check is not None and check.fits, (entry.job.job_id, check)


def _pods_of(servers: int, uplinks: int, pods: int) -> Cluster:
    """`pods` pods of one ToR of `servers` servers and `uplinks` uplinks on one OXC."""
    return build_cluster(
        "odd", pods=pods, tors_per_pod=1, servers_per_tor=servers,
        uplink_ports_per_pod=uplinks, oxcs=1, oxc_ports=uplinks * pods,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("family", "cluster"),
    [
        ("moe", _pods_of(4, 4, 8)),  # EP groups of 8 on 4-server pods: 19 of 20 refused
        ("dense", _pods_of(8, 1, 4)),  # one uplink a pod joins no three pods: 18 of 20
        ("fleet", _pods_of(4, 2, 6)),
    ],
)
def test_a_family_generated_for_a_cluster_runs_every_job_on_it(
    family: str, cluster: Cluster
) -> None:
    """`workload generate --cluster FILE` wrote jobs `simulate` refused on that very
    cluster (the presets were never affected: their workloads are unchanged). Every job
    drawn is one the cluster's admission takes, or the family is said not to fit."""
    try:
        workload = generate(family, cluster, load=1.0, jobs=20, seed=1)
    except WorkloadError as exc:
        assert "fits this cluster" in str(exc)
        return
    result = simulate(cluster, workload, "ideal", gpu=FAMILY_GPU.get(family))
    assert [j.refused for j in result.jobs if j.refused] == []
    assert summarize(result)["jobs_completed"] == 20


def test_generation_jitter_and_runs_are_deterministic_per_seed() -> None:
    cluster = preset("seed-15k")
    one = generate("moe", cluster, load=1.2, jobs=30, seed=4)
    two = generate("moe", cluster, load=1.2, jobs=30, seed=4)
    assert one == two and one != generate("moe", cluster, load=1.2, jobs=30, seed=5)
    assert jitter(one, 2) == jitter(two, 2) and jitter(one, 2) != one
    assert jitter(one, 0) == one
    for policy in ("ecmp", "lightpath"):
        a = summarize(simulate(cluster, jitter(one, 2), policy, seed=2))
        b = summarize(simulate(cluster, jitter(one, 2), policy, seed=2))
        a.pop("wall_s"), b.pop("wall_s")
        assert a == b


def test_steady_utilization_is_stable_over_five_seeds() -> None:
    cluster = preset("seed-15k")
    workload = generate("dense", cluster, load=1.2, jobs=160, seed=1)
    values = []
    for k in range(5):
        s = summarize(simulate(cluster, jitter(workload, k), "ideal", seed=k))
        assert s["steady_utilization"] is not None and s["steady_window_s"] > 0
        values.append(s["steady_utilization"])
    mean, half = mean_ci95(values)
    assert 0.5 < mean <= 1.0
    assert half <= 0.02 * mean, (mean, half, values)


def test_comm_heavy_spends_10_to_40_percent_of_iterations_on_the_network() -> None:
    cluster = preset("seed-15k")
    workload = generate("comm-heavy", cluster, load=1.2, jobs=40, seed=1)
    share = summarize(simulate(cluster, workload, "ideal", gpu="b200"))["mean_network_share"]
    assert 0.10 <= share <= 0.40
    dense = generate("dense", cluster, load=1.2, jobs=40, seed=1)
    assert summarize(simulate(cluster, dense, "ideal"))["mean_network_share"] < share


def test_cli_generates_a_family_and_simulates_seeds(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    assert run_generate("dense", "seed-15k", 1.2, 20, 1, str(path)) == 0
    assert len(read_workload(path)) == 20
    assert run_generate("nope", "seed-15k", 1.2, 20, 1, str(path)) == 2
    out = tmp_path / "out"
    code = run_simulate("seed-15k", str(path), ["ideal", "spray"], str(out), 0, None, seeds=2)
    assert code == 0
    rows = json.loads((out / "jobs.json").read_text())
    assert len(rows) == 20 * 2 * 2
    assert {"iteration_s", "ideal_iteration_s", "iteration_slowdown", "network_share"} <= set(
        rows[0]
    )
    assert {"queueing_delay_s", "jct_s", "policy", "seed"} <= set(rows[0])
    assert (out / "evaluation.png").stat().st_size > 0
    summary = json.loads((out / "summary_ideal.json").read_text())
    assert summary["seeds"] == 2 and "steady_utilization" in summary["ci95"]
    # a count every seed agrees on is a count, not a mean (20, not 20.0)
    assert summary["jobs_completed"] == 20 and type(summary["jobs_completed"]) is int
    assert type(summary["makespan_s"]) is float
    assert run_simulate("seed-15k", str(path), ["ideal"], None, 0, None, gpu="z80") == 2
    # refused inputs leave no empty results directory behind
    refused = tmp_path / "refused"
    assert (
        run_simulate("seed-15k", str(tmp_path / "absent.jsonl"), ["ideal"], str(refused), 0, None)
        == 2
    )
    assert run_simulate("no-such-cluster", str(path), ["ideal"], str(refused), 0, None) == 2
    assert not refused.exists()


def test_lightpath_rewires_per_phase_only_where_gap_and_way_back_pay() -> None:
    cluster = build_cluster(
        "four",
        pods=4,
        tors_per_pod=1,
        servers_per_tor=4,
        uplink_ports_per_pod=8,
        oxcs=2,
        oxc_ports=32,
        reconfig_ms=25.0,
    )

    def job(f: float) -> Job:
        return Job(
            "j",
            Parallelism(dp=8, pp=2),
            ModelFacts(
                parameters=8e9, bytes_per_parameter=2, activation_bytes=256e6, microbatches=8
            ),
            ComputeTimes(f, 2 * f, f),
        )

    short = simulate(cluster, [WorkloadJob(job(0.005), 0.0, 200)], "lightpath").jobs[0]
    # 15 ms gaps < 25 ms: it holds; its one reconfiguration is the placement install
    assert short.hits == 0 and short.reconfigurations == 1
    long = simulate(cluster, [WorkloadJob(job(0.2), 0.0, 200)], "lightpath").jobs[0]
    # 0.4 s before PP fits a rewiring, but DP's buckets start during the last
    # backward pass: PP's own circuits would be left for DP, which loses more on
    # them than PP gains, so the controller holds and no phase runs on wrong circuits
    assert long.misses == 0 and long.hits == 0
    assert long.hits + long.held + long.misses == 2 * 200  # every phase scored once
    static = simulate(cluster, [WorkloadJob(job(0.2), 0.0, 200)], "static").jobs[0]
    assert long.slowdown is not None and static.slowdown is not None
    assert long.slowdown <= static.slowdown
    # one scoring for every policy (API: hit, held, miss per phase; the placement
    # install is a reconfiguration, and a phase that waited for one is a miss)
    reactive = simulate(cluster, [WorkloadJob(job(0.2), 0.0, 200)], "reactive").jobs[0]
    for ran in (long, static, reactive):
        assert ran.hits + ran.held + ran.misses == 2 * 200, ran
        assert ran.reconfigurations >= 1
        assert (ran.exposed_s > 0) == (ran.misses > 0), ran
    assert static.reconfigurations == 1 and static.held >= 2 * 200 - 1


def test_from_trace_load_factor_compresses_arrivals(tmp_path: Path) -> None:
    trace = TABLE.parents[1] / "traces" / "acme_kalos_completed_llm_jobs.csv"
    one, two = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    assert run_from_trace(str(trace), str(one), 30, 0) == 0
    assert run_from_trace(str(trace), str(two), 30, 0, load=2.0) == 0
    a, b = read_workload(one), read_workload(two)
    assert [w.job.job_id for w in a] == [w.job.job_id for w in b]
    for x, y in zip(a, b, strict=True):
        assert y.arrival_s == pytest.approx(x.arrival_s / 2, abs=1e-3)
    assert run_from_trace(str(trace), str(two), 30, 0, load=0.0) == 2
    # files `simulate` would refuse are not written: every arrival at 0 (inf), or past
    # the 3.2e9 s a workload may span (a sweep's --load 1e-300 wrote 9.6e305 s)
    for load in (math.inf, math.nan, 1e-300):
        three = tmp_path / f"three-{load}.jsonl"
        assert run_from_trace(str(trace), str(three), 30, 0, load=load) == 2
        assert not three.exists()
    far = tmp_path / "far.jsonl"
    assert run_generate("dense", "seed-15k", 1e-12, 10, 1, str(far)) == 2
    assert not far.exists()


def test_generated_jobs_fit_one_set_of_joined_pods() -> None:
    """On two OXC islands of 16 servers each, 39 of 40 generated dense jobs wanted 32
    servers (the whole cluster's) and every policy refused them."""
    from app.engine.placement import never_fits
    from tests.engine.test_placement import _split_fabric

    islands = _split_fabric()
    workload = generate("dense", islands, load=1.0, jobs=40, seed=11)
    assert len(workload) == 40
    assert max(w.job.parallelism.servers for w in workload) <= 16
    assert not [w.job.job_id for w in workload if never_fits(islands, w.job)]


def test_policies_compared_are_measured_over_one_steady_window() -> None:
    """Each run's own window favoured a policy that keeps jobs waiting: its queue lasts
    longer, so its window takes in busy time the other run had finished (a helper's
    moe run put lightpath above ideal that way). Compared runs share the intersection
    of their windows."""
    # 16 GPUs. "prompt" queues over 0-100 s and keeps 14.5 busy; "holding" keeps a job
    # waiting, its queue lasts until 200 s: 14 busy, then 16 once the job runs
    prompt = SimResult(
        "ideal", 16, [], [(0.0, 100.0, 14.5), (100.0, 150.0, 8.0)], 0.0,
        queue_timeline=[(0.0, 1), (100.0, 0)],
    )  # fmt: skip
    holding = SimResult(
        "lightpath", 16, [], [(0.0, 100.0, 14.0), (100.0, 200.0, 16.0)], 0.0,
        queue_timeline=[(0.0, 1), (200.0, 0)],
    )  # fmt: skip
    own = {r.policy: summarize(r)["steady_utilization"] for r in (prompt, holding)}
    assert own["lightpath"] > own["ideal"]  # 0.9375 over 200 s against 0.906 over 100 s
    assert common_window([prompt, holding]) == (0.0, 100.0)
    shared = summarize_compared({"ideal": [prompt], "lightpath": [holding]})
    assert shared["ideal"][0]["steady_utilization"] == pytest.approx(14.5 / 16)
    assert shared["lightpath"][0]["steady_utilization"] == pytest.approx(14.0 / 16)
    assert shared["lightpath"][0]["steady_window"] == [0.0, 100.0]
    assert shared["lightpath"][0]["steady_window_shared"] is True
    # a run whose queue never built up: no window for any of them
    idle = SimResult("spray", 16, [], [(0.0, 100.0, 8.0)], 0.0, queue_timeline=[(0.0, 0)])
    assert common_window([prompt, idle]) == (0.0, 0.0)
    assert summarize_compared({"a": [prompt], "b": [idle]})["a"][0]["steady_utilization"] is None


def test_a_clos_of_the_optical_layers_cost_has_fewer_uplinks_and_is_slower() -> None:
    from app.sim.ecmp import SAME_COST_CAPACITY, clos_shape

    cluster = preset("seed-15k")
    same, cheap = clos_shape(cluster), clos_shape(cluster, capacity=SAME_COST_CAPACITY)
    assert cheap.uplinks["pod-0"] == round(0.7 * same.uplinks["pod-0"]) < same.uplinks["pod-0"]
    # a 4-stage pipeline over the four pods of `small`: each stage's 8 servers send
    # activations to the next pod's, more than its 16 uplinks carry at NIC rate
    small = preset("small")
    job = Job(
        "wide",
        Parallelism(dp=8, pp=4),
        ModelFacts(parameters=1e9, bytes_per_parameter=2, activation_bytes=2e9, microbatches=8),
        ComputeTimes(0.001, 0.002, 0.001),
    )
    runs = {
        p: simulate(small, [WorkloadJob(job, 0.0, 20)], p) for p in ("spray", "spray-same-cost")
    }
    full, same_cost = (runs[p].jobs[0].slowdown for p in ("spray", "spray-same-cost"))
    assert full is not None and same_cost is not None and same_cost > full * 1.01


def test_fleet_runs_about_300_jobs_at_once_on_seed_15k() -> None:
    """The design notes' scale: the fleet family keeps ~300 jobs running at load 1.2."""
    cluster = preset("seed-15k")
    workload = generate("fleet", cluster, load=1.2, jobs=1500, seed=1)
    assert {w.job.parallelism.servers for w in workload} <= {1, 2, 4, 8}
    summary = summarize(simulate(cluster, workload, "ideal", gpu="b200"))
    assert summary["steady_running_jobs"] >= 300, summary["steady_running_jobs"]
    assert summary["mean_network_share"] >= 0.10


def test_lightpath_holds_small_jobs_back_from_scattering_over_pods_short_of_uplinks() -> None:
    """Six of seed-15k's pods with 48 uplinks each and the fleet-stress mix: placed
    wherever servers are free, 26 jobs span two or more pods beyond the fewest and take
    starved circuits; lightpath's placement (`OPTICAL_EXTRA_PODS`) holds them back
    while those pods' uplinks are taken, and the cluster does more work for it. An
    electrical policy places wherever servers are free."""
    cluster = build_cluster(
        "six-pods",
        pods=6,
        tors_per_pod=5,
        servers_per_tor=15,
        uplink_ports_per_pod=48,
        oxcs=16,
        oxc_ports=320,
        reconfig_ms=25,
    )
    workload = generate("fleet-stress", cluster, load=1.2, jobs=400, seed=1)
    per_pod = len(cluster.pods[0].servers)

    def scattered(result: SimResult) -> int:
        return sum(
            1
            for j in result.jobs
            if j.start_s is not None and j.pods - -(-j.servers // per_pod) > OPTICAL_EXTRA_PODS
        )

    held = simulate(cluster, workload, "lightpath", gpu="b200")
    free = simulate(cluster, workload, "lightpath", gpu="b200", max_extra_pods=None)
    assert all(j.end_s is not None for j in held.jobs)  # nobody waits for ever
    assert scattered(held) < scattered(free)
    assert scattered(simulate(cluster, workload, "spray", gpu="b200")) >= 10
    # over one window for both (holding jobs back makes a queue last longer)
    compared = summarize_compared({"held": [held], "free": [free]})
    steady_held = compared["held"][0]["steady_utilization"]
    steady_free = compared["free"][0]["steady_utilization"]
    assert steady_held > steady_free + 0.02, (steady_held, steady_free)


def test_a_slowdown_rounded_below_the_ideal_reads_one() -> None:
    """The ideal fabric's mean slowdown read 0.9999999999999928: (end - start) /
    iterations rounds. Nothing is faster than the ideal; a real shortfall still shows."""
    from app.sim.simulator import JobResult

    start, ideal = 1234.567, 0.3
    end = start + 7 * ideal  # the float sum lands just below
    rounded = JobResult("r", 8, 0.0, 7, start_s=start, end_s=end, ideal_iteration_s=ideal)
    assert (end - start) / 7 / ideal < 1.0
    assert rounded.slowdown == 1.0
    short = JobResult("s", 8, 0.0, 10, start_s=0.0, end_s=2.9, ideal_iteration_s=0.3)
    assert short.slowdown is not None and short.slowdown < 0.97


def test_a_clos_counts_the_pods_electrical_core_beside_their_uplinks() -> None:
    """A cluster file of pods with no optical uplinks and a 3.2 Tb/s electrical core:
    the optical policies ran on the core, the Clos baselines on one phantom 400G link
    per pod (spray 1.127x slower than static there)."""
    from app.engine.cluster import build_cluster
    from app.sim.ecmp import clos_shape

    def pods(uplinks: int, core_gbps: float):
        return build_cluster(
            "core",
            pods=2,
            tors_per_pod=1,
            servers_per_tor=4,
            uplink_ports_per_pod=uplinks,
            oxcs=1,
            oxc_ports=max(2 * uplinks, 2),
            pod_electrical_gbps=core_gbps,
        )

    assert clos_shape(pods(0, 3200.0)).uplinks == {"pod-0": 8, "pod-1": 8}
    assert clos_shape(pods(2, 800.0)).uplinks == {"pod-0": 4, "pod-1": 4}
    assert clos_shape(pods(2, 0.0)).uplinks == {"pod-0": 2, "pod-1": 2}


def test_a_clos_over_few_uplinks_gets_those_uplinks_not_eight() -> None:
    """Before, every pod's core got at least 8 NIC-rate links (one per spine), so on a
    fabric with 2 uplinks per pod the electrical baselines had 4x the optical capacity."""
    from app.engine.cluster import build_cluster
    from app.sim.ecmp import SAME_COST_CAPACITY, clos_shape

    thin = build_cluster(
        "thin",
        pods=2,
        tors_per_pod=1,
        servers_per_tor=4,
        uplink_ports_per_pod=2,
        oxcs=1,
        oxc_ports=4,
    )
    assert clos_shape(thin).uplinks == {"pod-0": 2, "pod-1": 2}
    assert clos_shape(thin, capacity=SAME_COST_CAPACITY).uplinks == {"pod-0": 1, "pod-1": 1}
    assert clos_shape(thin).spines == 2
    # a ring over both pods' 8 servers: more than 2 links carry at NIC rate
    job = Job(
        "span",
        Parallelism(dp=8, pp=1),
        ModelFacts(parameters=7e9, bytes_per_parameter=4, activation_bytes=2e7, microbatches=4),
        ComputeTimes(0.001, 0.002, 0.001),
    )
    run = simulate(thin, [WorkloadJob(job, 0.0, 20)], "spray")
    assert run.jobs[0].slowdown is not None and run.jobs[0].slowdown > 1.05


def test_result_files_are_strict_json_with_undefined_figures_null(tmp_path: Path) -> None:
    """Before, an MLU over no capacity was written as a bare `Infinity` (which strict
    parsers refuse), and a figure no seed had (no steady window) as a mean of 0."""
    from app.sim.report import aggregate, write_json

    seeds = [
        {"policy": "static", "max_mlu": math.inf, "steady_utilization": None, "jobs": 3},
        {"policy": "static", "max_mlu": 2.0, "steady_utilization": None, "jobs": 3},
    ]
    path = tmp_path / "comparison.json"
    write_json(path, {"seeds": [aggregate(seeds)], "first": seeds[0]})
    text = path.read_text()
    data = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard {c}"))
    assert data["first"]["max_mlu"] is None
    agg = data["seeds"][0]
    assert agg["steady_utilization"] == {"mean": None, "ci95": None, "values": []}
    assert agg["max_mlu"]["mean"] is None and agg["jobs"]["mean"] == 3.0


def test_jobs_left_queued_at_the_end_are_counted() -> None:
    """Before, a job still queued when the run ended (behind one that never ends) was
    in no count: done/refused/stalled summed to fewer than the jobs."""
    jobs = [
        JobResult("done", 8, 0.0, 10, start_s=0.0, end_s=5.0, ideal_iteration_s=0.5),
        JobResult("stuck", 8, 0.0, 10, start_s=0.0, stalled="no circuit carries its traffic"),
        JobResult("behind", 8, 1.0, 10),
        JobResult("too-big", 8, 2.0, 10, refused="needs more servers than the cluster has"),
    ]
    s = summarize(SimResult("static", 16, jobs, [], 0.0))
    counts = [s[k] for k in ("jobs_completed", "jobs_refused", "jobs_stalled")]
    assert counts == [1, 1, 1] and s["jobs_never_started"] == 1


def test_a_comparison_where_every_job_was_refused_says_so() -> None:
    """A sweep's cluster refused every job under every policy; the table's caption said
    the queue never built up (true, but not why the figures were empty)."""
    from app.sim.report import ALL_REFUSED, NO_STEADY_WINDOW, _caption, aggregate

    refused = [JobResult("big", 64, 0.0, 10, refused="needs more servers than the cluster has")]
    nothing = [aggregate([summarize(SimResult(p, 16, refused, [], 0.0))]) for p in ("a", "b")]
    assert _caption(nothing) == ALL_REFUSED
    done = [JobResult("small", 1, 0.0, 10, start_s=0.0, end_s=5.0, ideal_iteration_s=0.5)]
    idle = [aggregate([summarize(SimResult("a", 16, done, [(0.0, 5.0, 8.0)], 40.0))])]
    assert _caption(idle) == NO_STEADY_WINDOW

"""The discrete-event simulation: a workload through the engine on simulated time.

Events (a heapq on simulated seconds): job arrivals, iteration ends and job
completions. On an arrival or completion the queue is served
(`queue.admit_queued` with the policy's `place_job`), the optical fabric is
re-planned (`fabric.plan_fabric`, which keeps unchanged jobs' circuits) and the
jobs touched get their profile (`policies.py`). State is incremental: a set of
free servers, the current cross-connects, the aggregator ledger and one record
per running job; the cluster value is never copied.

Iterations are not all simulated one by one. A job's iteration time depends on
its profile, the reconfiguration cost of that iteration (warm-up iterations,
walked phase by phase through the predictor, differ; every later one costs the
same) and the jobs it shares resources with. That only changes at events, so a
steady job is advanced in bulk: one completion event at the end of its
remaining iterations, and when an event changes its iteration time, the
iteration in progress ends at the old rate and the rest continue at the new
one. This is exactly what stepping every iteration gives (`step_by_step=True`
does that; tests check both agree).

Sharing an electrical resource: when several jobs use one (a Clos link under
ECMP or spraying, or a pod's way into an electrical core), job j's phase on it
sees the capacity the others leave at their average rate, never less than a
fair 1/n share: cap_j = max(C - sum_k amount_k / T_k, C / n), as if their bursts
never met. The others' iteration times T_k depend on j's in turn; two
fixed-point rounds settle them at each event. Optical ports are not shared this
way: a circuit is its job's whether it sends or not, and jobs taking turns on
shared ports are charged their turns (`policies.turn_factor`).
"""

from __future__ import annotations

import heapq
import math
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from app.engine.cluster import Cluster
from app.engine.collective import AggregatorLedger
from app.engine.controller import (
    ControllerConfig,
    ControllerState,
    JobCompleted,
    JobPlaced,
    free_uplinks,
    new_controller,
)
from app.engine.controller import step as control
from app.engine.gpu_profiles import gpu_profile
from app.engine.job import Job, Placement
from app.engine.memory import DEFAULT_ZERO_STAGE
from app.engine.placement import OPTICAL_EXTRA_PODS, Placer, place_job, refusals
from app.engine.predictor import DEFAULT_ALGORITHM
from app.engine.queue import QueuePolicy, admit_queued

from .ecmp import DEFAULT_SPINES, clos_shape
from .policies import (
    ELECTRICAL,
    IDEAL,
    FabricContext,
    JobProfile,
    as_submitted,
    core_capacity,
    fabric_key,
    profile_ecmp,
    profile_ideal,
    profile_optical,
    spec_of,
)
from .timing import pipeline_span_s, with_stated_compute
from .workload import WorkloadJob

_ARRIVAL, _ITERATION, _COMPLETION = 1, 0, 0  # completions/iterations before arrivals
_FIXED_POINT_ROUNDS = 2
_EPS = 1e-9


@dataclass
class JobResult:
    """What one job did under one policy."""

    job_id: str
    servers: int
    arrival_s: float
    iterations: int
    start_s: float | None = None
    end_s: float | None = None
    ideal_iteration_s: float = 0.0
    exposed_s: float = 0.0
    exposed_after_warmup_s: float = 0.0
    comm_after_warmup_s: float = 0.0
    comm_s: float = 0.0
    reconfigurations: int = 0
    hits: int = 0
    held: int = 0
    misses: int = 0
    mlu: float = 0.0
    algorithm: str = ""
    mode: str = ""  # the fabric mode it started in
    modes: tuple[str, ...] = ()  # every mode it ran in, in order (allocations change)
    holds_topology: bool = True
    refused: str | None = None
    stalled: str | None = None  # why the job could not progress (reported, not completed)
    compute_iteration_s: float = 0.0  # the iteration with an infinitely fast network
    pods: int = 0  # pods its placement spans

    @property
    def slowdown(self) -> float | None:
        """Mean iteration time over the ideal fabric's, or None if it did not run."""
        if self.start_s is None or self.end_s is None or self.ideal_iteration_s <= 0:
            return None
        ratio = (self.end_s - self.start_s) / self.iterations / self.ideal_iteration_s
        # (end - start) / iterations rounds: the ideal fabric read 0.9999999999999928, and
        # 1.0000000000271798 for a job arriving at 3.1e9 s; within 1e-9 of 1 is 1 (a real
        # shortfall, which would be a bug, is still shown)
        return 1.0 if abs(ratio - 1.0) < 1e-9 else ratio


@dataclass
class SimResult:
    """One policy's run: per-job results, the busy-GPU timeline, counters and wall time."""

    policy: str
    cluster_gpus: int
    jobs: list[JobResult]
    busy_segments: list[tuple[float, float, float]]  # (start, end, busy GPUs)
    compute_gpu_s: float
    wall_s: float = 0.0
    reconfig_ms: float = 0.0
    queue_timeline: list[tuple[float, int]] = field(default_factory=list)  # (time, queued)
    # every fabric controller step it drove: (event, jobs the controller held, CPU ms)
    controller_steps: list[ControllerStep] = field(default_factory=list)

    @property
    def makespan_s(self) -> float:
        return max((j.end_s for j in self.jobs if j.end_s is not None), default=0.0)


@dataclass(frozen=True, slots=True)
class ControllerStep:
    """One arrival or completion the simulator fed the fabric controller, and its cost."""

    event: str  # "arrival" | "completion"
    running: int  # jobs the controller held before the event
    cpu_ms: float  # this process's CPU time in `engine.controller.step`


@dataclass
class _Run:
    """A running job's incremental state."""

    entry: WorkloadJob
    job: Job
    placement: Placement
    profile: JobProfile
    result: JobResult
    gpus: int
    iter_done: int = 0
    seg_start: float = 0.0
    base_s: float = 0.0  # iteration time without reconfiguration cost
    pp_net: float = 0.0
    dp_net: float = 0.0
    version: int = 0
    rates: dict[tuple[str, ...], float] = field(default_factory=dict)
    fabric_key: tuple[object, ...] = ()

    def iteration_total_s(self, index: int) -> float:
        return self.base_s + self.profile.rewiring.cost_of(index).exposed_s

    @property
    def warmup(self) -> int:
        return len(self.profile.rewiring.warmup)


ProgressFn = Callable[[int, int], None]


class Simulation:
    """One policy over one workload on one cluster. `run()` returns the SimResult."""

    def __init__(
        self,
        cluster: Cluster,
        workload: Sequence[WorkloadJob],
        policy: str,
        *,
        seed: int = 0,
        reconfig_ms: float | None = None,
        step_by_step: bool = False,
        queue_policy: QueuePolicy = QueuePolicy.FIFO,
        ecmp_spines: int = DEFAULT_SPINES,
        progress: ProgressFn | None = None,
        gpu: str | None = None,
        max_extra_pods: int | None = OPTICAL_EXTRA_PODS,
        between_steps: Callable[[], object] | None = None,
        gpu_memory_bytes: float | None = None,
        default_zero_stage: int = DEFAULT_ZERO_STAGE,
    ) -> None:
        self.cluster = cluster
        # run after every controller step, outside its timing: what the worker's fabric
        # process does between passes (`app.worker.gc_policy.collect_if_due`)
        self.between_steps = between_steps
        self.max_extra_pods = max_extra_pods  # lightpath's placement (`place_job`)
        self.gpu = gpu or cluster.gpu_model
        # the service's admission settings (LIGHTPATH_GPU_MEMORY_BYTES, _DEFAULT_ZERO_STAGE)
        self.gpu_memory_bytes = gpu_memory_bytes or gpu_profile(self.gpu).memory_bytes
        self.default_zero_stage = default_zero_stage
        self.workload = list(workload)
        self.spec = spec_of(policy)
        self.reconfig_ms = cluster.reconfig_ms if reconfig_ms is None else reconfig_ms
        self.step_by_step = step_by_step
        self.queue_policy = queue_policy
        self.progress = progress
        self.ctx = FabricContext(
            cluster,
            self.spec,
            self.reconfig_ms,
            seed,
            clos_shape(cluster, ecmp_spines, core_capacity(self.spec.name))
            if self.spec.name in ELECTRICAL
            else None,
            self.gpu,
        )
        self.free: set[str] = set(cluster.server_ids)
        self.queue: list[Job] = []
        self.entries: dict[str, WorkloadJob] = {}
        self.running: dict[str, _Run] = {}
        self.order: list[str] = []  # running jobs in placement order (fabric priority)
        self.ledger = AggregatorLedger()
        self.control: ControllerState = new_controller(
            cluster,
            ControllerConfig(self.reconfig_ms, predictor=self.spec.predictor or DEFAULT_ALGORITHM),
        )
        self.results: dict[str, JobResult] = {}
        self.busy: list[tuple[float, float, float]] = []
        self.compute_gpu_s = 0.0
        self.events: list[tuple[float, int, int, str, int]] = []
        self._seq = 0
        self.key_rate: dict[tuple[str, ...], float] = defaultdict(float)
        self.key_users: dict[tuple[str, ...], set[str]] = defaultdict(set)
        self.done = 0
        self.now = 0.0
        self.queue_timeline: list[tuple[float, int]] = []
        self.controller_steps: list[ControllerStep] = []

    # ------------------------------------------------------------------ events

    def _push(self, at: float, kind: int, job_id: str, version: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self.events, (at, kind, self._seq, job_id, version))

    def run(self) -> SimResult:
        started = time.perf_counter()
        for i, entry in enumerate(self.workload):
            job = replace(as_submitted(entry.job, self.spec), submitted_order=i)
            job = with_stated_compute(job, self.cluster.gpus_per_server, self.gpu)
            self.entries[job.job_id] = entry
            self.results[job.job_id] = JobResult(
                job.job_id, job.servers_needed, entry.arrival_s, entry.iterations
            )
            self._push(entry.arrival_s, _ARRIVAL, job.job_id)
            self.entries[job.job_id] = replace(entry, job=job)
        total = len(self.workload)
        while self.events:
            at, kind, _, job_id, version = heapq.heappop(self.events)
            self.now = at
            if kind == _ARRIVAL:
                self._arrive(at, job_id)
                if not self.events and self.running:
                    self._stall_all()
                continue
            run = self.running.get(job_id)
            if run is None or run.version != version:
                if not self.events and self.running:
                    self._stall_all()
                continue  # superseded by a re-rating
            self._iteration_event(at, run)
            if self.progress is not None and job_id not in self.running:
                self.progress(self.done, total)
            if not self.events and self.running:
                self._stall_all()
        return SimResult(
            self.spec.name,
            self.cluster.gpu_count,
            [self.results[e.job.job_id] for e in self.workload],
            self.busy,
            self.compute_gpu_s,
            time.perf_counter() - started,
            self.reconfig_ms,
            self.queue_timeline,
            self.controller_steps,
        )

    def _arrive(self, at: float, job_id: str) -> None:
        job = self.entries[job_id].job
        # the service's admission, as POST /v1/jobs applies it: never fits, or does not
        # fit GPU memory (a 422 there: the job never runs)
        reasons = refusals(self.cluster, job, self.gpu_memory_bytes, self.default_zero_stage)
        if reasons:
            self.results[job_id].refused = "; ".join(reasons)
            self.done += 1
            if self.progress is not None:
                self.progress(self.done, len(self.workload))
            return
        self.queue.append(job)
        self._admit(at, changed=[])
        self._note_queue(at)

    def _note_queue(self, at: float) -> None:
        if not self.queue_timeline or self.queue_timeline[-1][1] != len(self.queue):
            self.queue_timeline.append((at, len(self.queue)))

    def _place_fn(self) -> Callable[..., object]:
        if self.spec.inc_aware and self.spec.optical:
            switches = (*self.cluster.tors_by_id, *self.cluster.pods_by_id)  # ToRs, spines
            agg = {t: self.ledger.free_gbps(self.cluster, t) for t in switches}
            return Placer(agg, free_uplinks(self.control), self.max_extra_pods)
        return place_job

    def _admit(self, at: float, changed: list[str], replan: bool = False) -> None:
        """Serve the queue, re-plan the fabric, profile new jobs, re-rate sharers."""
        placed: list[Placement] = []
        if self.queue:
            admission = admit_queued(
                self.cluster,
                self.free,
                self.queue,
                self.queue_policy,
                backfill=True,
                place=self._place_fn(),  # type: ignore[arg-type]
            )
            placed = list(admission.placements)
        if not placed and not changed and not replan:
            return
        ids = {p.job_id for p in placed}
        jobs = {j.job_id: j for j in self.queue if j.job_id in ids}
        self.queue = [j for j in self.queue if j.job_id not in ids]
        self._note_queue(at)
        for p in placed:
            self.free.difference_update(p.servers)
            self.order.append(p.job_id)
        self._replan(at, placed, jobs)
        touched = set(changed)
        for p in placed:
            self._start(at, jobs[p.job_id], p)
            touched.add(p.job_id)
        if self.spec.optical:
            for job_id in self.order:
                run = self.running.get(job_id)
                if run is not None and job_id not in ids and self._reprofile(run, at):
                    touched.add(job_id)
        self._rerate(at, touched)

    def _replan(self, at: float, placed: list[Placement], jobs: dict[str, Job]) -> None:
        """Optical policies: the fabric controller allocates ports to the placed jobs."""
        if not self.spec.optical:
            return
        for p in placed:
            self._control("arrival", JobPlaced(jobs[p.job_id], p, at))
        self.ledger = self._ledger()

    def _control(self, kind: str, event: JobPlaced | JobCompleted) -> None:
        """Feed the controller one event, as the worker does, and record its CPU time."""
        running = len(self.control.jobs)
        cpu = time.process_time()
        self.control, _ = control(self.control, event)
        self.controller_steps.append(
            ControllerStep(kind, running, (time.process_time() - cpu) * 1000)
        )
        if self.between_steps is not None:
            self.between_steps()

    def _ledger(self) -> AggregatorLedger:
        fabric = self.control.fabric
        return fabric.aggregators if fabric is not None else AggregatorLedger()

    def _profile(self, job: Job, placement: Placement, iterations: int, at: float) -> JobProfile:
        if self.spec.name == IDEAL:
            return profile_ideal(self.ctx, job, placement, iterations)
        if self.spec.name in ELECTRICAL:
            return profile_ecmp(self.ctx, job, placement, iterations)
        return profile_optical(self.ctx, job, placement, self.control, iterations, at)

    def _start(self, at: float, job: Job, placement: Placement) -> None:
        entry = self.entries[job.job_id]
        profile = self._profile(job, placement, entry.iterations, at)
        result = self.results[job.job_id]
        result.start_s = at
        result.pods = len({self.cluster.server(s).pod_id for s in placement.servers})
        result.ideal_iteration_s = profile.ideal_iteration_s
        result.algorithm = profile.algorithm
        result.mode = profile.mode
        result.modes = (profile.mode,)
        result.mlu = profile.mlu
        result.holds_topology = profile.holds_topology
        result.hits = profile.rewiring.hits(entry.iterations)
        result.misses = profile.rewiring.misses(entry.iterations)
        result.held = profile.rewiring.held(entry.iterations)
        result.compute_iteration_s = (
            pipeline_span_s(profile.timing, 0.0) + profile.timing.optimizer_s
        )
        run = _Run(
            entry,
            job,
            placement,
            profile,
            result,
            job.servers_needed * self.cluster.gpus_per_server,
            seg_start=at,
            pp_net=profile.pp_alone_s,
            dp_net=profile.dp_alone_s,
        )
        run.base_s = profile.iteration_s(run.pp_net, run.dp_net)
        if self.spec.optical:
            run.fabric_key = fabric_key(self.control, job.job_id)
        self.running[job.job_id] = run
        for key in profile.shares:
            self.key_users[key].add(job.job_id)
        self._set_rates(run)
        self._schedule(run)

    def _reprofile(self, run: _Run, at: float) -> bool:
        """A job whose allocation may have changed: new phase times, the same rewiring history."""
        assert self.spec.optical
        key = fabric_key(self.control, run.job.job_id)
        if key == run.fabric_key:
            return False
        run.fabric_key = key
        profile = profile_optical(
            self.ctx, run.job, run.placement, self.control, run.entry.iterations, at
        )
        profile = replace(profile, rewiring=run.profile.rewiring)
        for key in run.profile.shares:
            self.key_users[key].discard(run.job.job_id)
        self._clear_rates(run)
        run.profile = profile
        for key in profile.shares:
            self.key_users[key].add(run.job.job_id)
        run.result.mlu = max(run.result.mlu, profile.mlu)
        if run.result.modes[-1:] != (profile.mode,):
            run.result.modes += (profile.mode,)
        return True

    # ------------------------------------------------------------- sharing

    def _clear_rates(self, run: _Run) -> None:
        for key, rate in run.rates.items():
            self.key_rate[key] -= rate
        run.rates = {}

    def _set_rates(self, run: _Run) -> None:
        self._clear_rates(run)
        total = run.iteration_total_s(max(run.iter_done, run.warmup))
        for key, share in run.profile.shares.items():
            rate = (share.pp_amount + share.dp_amount) / total if total > 0 else 0.0
            run.rates[key] = rate
            self.key_rate[key] += rate

    def _net_times(self, run: _Run) -> tuple[float, float]:
        shares = run.profile.shares
        if not shares:
            return run.profile.pp_alone_s, run.profile.dp_alone_s
        pp = dp = 0.0
        for key, share in shares.items():
            users = len(self.key_users[key])
            others = self.key_rate[key] - run.rates.get(key, 0.0)
            cap = max(share.capacity - others, share.capacity / max(1, users))
            pp = max(pp, share.pp_amount / cap)
            dp = max(dp, share.dp_amount / cap)
        return max(pp, run.profile.pp_alone_s), max(dp, run.profile.dp_alone_s)

    def _neighbours(self, job_ids: set[str]) -> set[str]:
        out = set(job_ids)
        for job_id in job_ids:
            run = self.running.get(job_id)
            if run is None:
                continue
            for key in run.profile.shares:
                users = self.key_users.get(key, ())
                if len(users) > 1:
                    out.update(users)
        return {j for j in out if j in self.running}

    def _rerate(self, at: float, touched: set[str]) -> None:
        """Settle iteration times of the touched jobs and those sharing with them."""
        group = [self.running[j] for j in sorted(self._neighbours(touched), key=self.order.index)]
        for run in group:
            self._cut(at, run)
        sharing = [run for run in group if run.profile.shares]
        for _ in range(_FIXED_POINT_ROUNDS if sharing else 0):
            for run in sharing:
                run.pp_net, run.dp_net = self._net_times(run)
                run.base_s = run.profile.iteration_s(run.pp_net, run.dp_net)
            for run in sharing:
                self._set_rates(run)
        for run in group:
            if not run.profile.shares:
                run.pp_net, run.dp_net = run.profile.pp_alone_s, run.profile.dp_alone_s
                run.base_s = run.profile.iteration_s(run.pp_net, run.dp_net)
            fresh = run.iter_done == 0 and run.seg_start == at
            if run.result.stalled is not None:  # a change may let it progress again
                run.seg_start = max(run.seg_start, at)
                self._schedule(run)
            elif fresh or self._is_bulk(run):
                self._schedule(run)
            # else: the iteration in progress keeps its end; the next one uses base_s

    def _is_bulk(self, run: _Run) -> bool:
        return not self.step_by_step and run.iter_done >= run.warmup

    def _cut(self, at: float, run: _Run) -> None:
        """Before a re-rating: close the iterations of a bulk segment ended by `at`.

        The iteration in progress at `at` finishes at the old rate (as it would when
        stepping every iteration); the new rate starts after it.
        """
        if not self._is_bulk(run) or run.seg_start >= at:
            return
        per = run.iteration_total_s(run.iter_done)
        if not math.isfinite(per):
            run.seg_start = at  # stalled: nothing ran
            return
        left = run.entry.iterations - run.iter_done
        ended = math.floor((at - run.seg_start) / per * (1 + _EPS)) if per > 0 else left
        count = min(left, ended + 1)
        if count >= left:
            return  # the last iteration is in progress: the completion stands
        end = run.seg_start + count * per
        self._account(run, run.iter_done, count, run.seg_start, end)
        run.iter_done += count
        run.seg_start = end

    # ------------------------------------------------------------- progress

    def _account(self, run: _Run, first: int, count: int, start: float, end: float) -> None:
        """Close `count` iterations (indices first..) that ran from `start` to `end`."""
        if count <= 0:
            return
        profile = run.profile
        r = run.result
        warm = run.warmup
        comm = profile.comm_s(run.pp_net, run.dp_net)
        for index in range(first, min(first + count, warm)):
            cost = profile.rewiring.cost_of(index)
            r.exposed_s += cost.exposed_s
            r.reconfigurations += cost.reconfigurations
        steady_n = max(0, first + count - max(first, warm))
        steady = profile.rewiring.steady
        r.exposed_s += steady_n * steady.exposed_s
        r.reconfigurations += steady_n * steady.reconfigurations
        r.exposed_after_warmup_s += steady_n * steady.exposed_s
        r.comm_after_warmup_s += steady_n * comm
        r.comm_s += count * comm
        busy = run.gpus * profile.timing.compute_s * count
        self.compute_gpu_s += busy
        if end > start:
            self.busy.append((start, end, busy / (end - start)))

    def _schedule(self, run: _Run) -> None:
        run.version += 1
        n = run.entry.iterations
        if not math.isfinite(run.iteration_total_s(run.iter_done)):
            # its circuits cannot carry a phase: no progress until the fabric changes
            run.result.stalled = "no circuit carries its traffic"
            return
        run.result.stalled = None
        if run.iter_done >= n:
            self._push(run.seg_start, _COMPLETION, run.job.job_id, run.version)
            return
        if self.step_by_step or run.iter_done < run.warmup:
            at = run.seg_start + run.iteration_total_s(run.iter_done)
        else:
            at = run.seg_start + (n - run.iter_done) * run.iteration_total_s(run.iter_done)
        self._push(at, _ITERATION, run.job.job_id, run.version)

    def _iteration_event(self, at: float, run: _Run) -> None:
        """The scheduled iteration end (one, or the rest in bulk) has come."""
        n = run.entry.iterations
        if run.iter_done < n:
            bulk = not self.step_by_step and run.iter_done >= run.warmup
            count = n - run.iter_done if bulk else 1
            self._account(run, run.iter_done, count, run.seg_start, at)
            run.iter_done += count
            run.seg_start = at
        if run.iter_done >= n:
            self._complete(at, run)
        else:
            self._schedule(run)

    def _stall_all(self) -> None:
        """Nothing will ever change the fabric again: jobs that cannot progress leave.

        They are reported (`stalled`) and release their servers and ports, so the
        queue behind them is served instead of the simulation hanging. Jobs that queue
        starts and that cannot progress either leave in the next round (they were left
        running, and the rest of the queue counted as never started).
        """
        while self.running and not self.events:
            at = max(max((r.seg_start for r in self.running.values()), default=0.0), self.now)
            for run in list(self.running.values()):
                if self.events:
                    break  # a leaving job's ports let the others (or a new one) progress
                if run.result.stalled is None:
                    run.result.stalled = "stopped: no progress possible"
                self._leave(at, run, completed=False)

    def _complete(self, at: float, run: _Run) -> None:
        self._leave(at, run, completed=True)

    def _leave(self, at: float, run: _Run, *, completed: bool) -> None:
        job_id = run.job.job_id
        if completed:
            run.result.end_s = at
        del self.running[job_id]
        self.order.remove(job_id)
        self.free.update(run.placement.servers)
        self._clear_rates(run)
        for key in run.profile.shares:
            self.key_users[key].discard(job_id)
        if self.spec.optical:
            self._control("completion", JobCompleted(job_id, at))
            self.ledger = self._ledger()
        else:
            self.ledger = self.ledger.release(job_id)
        self.done += 1
        neighbours: set[str] = set()
        for key in run.profile.shares:
            neighbours.update(self.key_users.get(key, ()))
        self._admit(at, sorted(neighbours & set(self.running)), replan=self.spec.optical)


def simulate(
    cluster: Cluster,
    workload: Sequence[WorkloadJob],
    policy: str,
    *,
    seed: int = 0,
    reconfig_ms: float | None = None,
    step_by_step: bool = False,
    progress: ProgressFn | None = None,
    gpu: str | None = None,
    max_extra_pods: int | None = OPTICAL_EXTRA_PODS,
    between_steps: Callable[[], object] | None = None,
    gpu_memory_bytes: float | None = None,
    default_zero_stage: int = DEFAULT_ZERO_STAGE,
) -> SimResult:
    """Run one policy over a workload; see `Simulation`."""
    return Simulation(
        cluster,
        workload,
        policy,
        seed=seed,
        reconfig_ms=reconfig_ms,
        step_by_step=step_by_step,
        progress=progress,
        gpu=gpu,
        max_extra_pods=max_extra_pods,
        between_steps=between_steps,
        gpu_memory_bytes=gpu_memory_bytes,
        default_zero_stage=default_zero_stage,
    ).run()


__all__ = ["ControllerStep", "JobResult", "SimResult", "Simulation", "simulate"]

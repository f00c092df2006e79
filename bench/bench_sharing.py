"""What sharing circuits among jobs could gain at scarce uplinks: bounds, not a policy.

Issue 13, item 3: at 16 uplinks per pod, lightpath loses to a sprayed Clos
because a job's circuits are its own (its bursts run at its slice's rate while
other jobs' slices idle through their compute). Before building a sharing mode
into the engine, this script measures on the evaluation's workloads
(`bench_evaluation.py`'s comm-heavy family, generation seed 1, jittered seeds)
how much each way of sharing could gain. It runs the real `lightpath` policy
and, on the very same allocations, what-if charges that let jobs share. They
favour sharing: every job takes the better of its own slice and the shared
resource after the fact (an engine would have to choose ahead, on estimates)
and no phase shift is charged. Only the jobs that chose the shared resource
load it. Whose ports are in it is `--lenders`:

- `all`: every isolated job's ports (those on their own slice lend them too):
  the most any sharing of that kind could offer. A model that does not beat
  `lightpath` this way will not in the engine either.
- `pooled`: only the ports of the jobs that chose it. Each job chooses alone,
  one at a time, so the first job into an empty pool finds nothing but its own
  ports; a pool has to be formed by a group at once for it to pay.
- `leave`: the same, but every job starts in the pool and leaves it when its
  own slice is better (a pool formed by the group, each member free to go).
- `lend` (turns models only): every isolated job's ports are in the pool, as
  with `all`, but a job on its own slice takes its pods back for its own
  bursts: the pool is the others' only while it computes (a burst of a lender
  blocks the whole pod's pool here, not just its own ports, and so does the
  reconfiguration that gives a lender its circuits back before each of its
  phases). Lending assumes the controller knows every lender's gaps.
- `fair` (turns models only): as `leave`, but a job joins or leaves only when
  no other sharer's estimated iteration gets longer by it (issue 13's rule:
  never make a job's estimate worse).

- `opportunity`: the share of cross-pod job-time (time-weighted over the run)
  in which a job has a pod pair, or a pod, in common with another running
  cross-pod job: what pair trunks, or pod pools, would have to work with.
- `pair-trunk`: jobs whose pod pairs coincide pool that pair's circuits (a
  trunk of all their circuits there); each job's burst gets the trunk less the
  others' average load on it, never less than a fair 1/n share (the
  simulator's shared-link model, the one the sprayed Clos gets). No
  reconfiguration and no phase-shift cost is charged, and each job takes the
  better of its own slice and the trunk.
- `pod-pool`: jobs on a pod pool all their ports there (circuits and spare);
  each burst gets the pod's pool less the others' average load, and every
  network phase pays one OXC reconfiguration (its circuits are rewired from
  the pool before it): a controller that would re-plan a pod's pooled
  circuits among the jobs bursting at each phase. It ignores that a circuit
  needs a free port of both pods on one OXC.
- `pod-pool-free`: the same without the reconfiguration (the sprayed Clos's
  model on the optical ports).
- `pod-turns`: jobs take turns per pod (a controller that lets jobs on
  disjoint pods hold their pods' pooled ports at once): each phase takes
  seconds of exclusive use of every isolated job's ports on its pods (a
  circuit needs a port of both its pods on one OXC) plus one reconfiguration,
  out of each pod's time left by the others' average use, never less than 1/n.
- `one-pool-turns`: what the controller's turns can do today (one shared pool,
  one job holding it at a time, `controller._turn_for_phase`): each job's
  phases take seconds of exclusive use of the pool (all isolated jobs' ports
  on its pods) plus one reconfiguration each, out of the pool's time left by
  the others' average use, never less than 1/n.

Nothing here is a fabric decision: the engine and the controller are
unchanged, and the simulator's own charges are used for the `lightpath` row.
The what-if charges are this script's (a subclass of the simulation), so no
figure of `bench_evaluation.py` depends on them.

Run: .venv/bin/python bench/bench_sharing.py [--family comm-heavy] [--uplinks 16]
     [--seeds 3] [--latency 25] [--models lightpath,pair-trunk,...] [--jobs 160]
     [--generation-seed 1]
     [--lenders all,pooled,leave,fair,lend]
No bound: the figures are the README's "Where uplinks are scarce" findings.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_evaluation import GENERATION_SEED, LOAD, variant  # noqa: E402

from app.engine.cluster import preset  # noqa: E402
from app.engine.fabric import MODE_ISOLATED  # noqa: E402
from app.engine.job import Job, Placement  # noqa: E402
from app.engine.traffic import PHASE_DP, PHASE_PP, DemandMatrix, job_traffic  # noqa: E402
from app.sim import simulator as sim_module  # noqa: E402
from app.sim.families import FAMILY_GPU, generate, jitter  # noqa: E402
from app.sim.policies import Share, profile_optical  # noqa: E402
from app.sim.report import aggregate, summarize  # noqa: E402
from app.sim.simulator import Simulation, _Run  # noqa: E402

MODELS = ("lightpath", "pair-trunk", "pod-pool", "pod-pool-free", "pod-turns", "one-pool-turns")
POOL = "pool"  # share keys of the what-if charges: (POOL, pod) or (POOL, pod_a, pod_b)


def _pair_bytes(demand: DemandMatrix) -> dict[tuple[str, ...], float]:
    """Bytes per unordered pod pair over its busier direction."""
    ways: dict[tuple[str, str], list[float]] = {}
    for p, q, b in demand.entries():
        if p != q:
            key = (p, q) if p < q else (q, p)
            ways.setdefault(key, [0.0, 0.0])[0 if p < q else 1] += b
    return {(POOL, *k): max(v) for k, v in ways.items()}


def _pod_bytes(demand: DemandMatrix) -> dict[tuple[str, ...], float]:
    """Bytes a pod sends or receives across pods, whichever is more."""
    out: dict[str, float] = defaultdict(float)
    into: dict[str, float] = defaultdict(float)
    for p, q, b in demand.entries():
        if p != q:
            out[p] += b
            into[q] += b
    return {(POOL, pod): max(out[pod], into[pod]) for pod in set(out) | set(into)}


class WhatIf(Simulation):
    """The lightpath simulation with a what-if sharing charge (see the module doc).

    Only jobs that chose the shared resource (`pooled`) load it; a job on its own
    slice loads nothing shared. Whose ports are in it is `lenders` (module doc).
    """

    def __init__(self, *args: object, model: str, lenders: str, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.model = model
        self.lenders = lenders  # "all": every isolated job's ports are in the pool
        self.port_bps = self.cluster.nic_gbps * 1e9 / 8
        self.reconfig_s = self.reconfig_ms / 1000.0
        self.penalty_s: dict[str, float] = {}  # reconfiguration per iteration when pooled
        self.contribution: dict[tuple[str, ...], float] = {}  # (job, *key) -> bytes/s
        self.bytes: dict[str, tuple[DemandMatrix, DemandMatrix]] = {}  # job -> (pp, dp)
        self.pooled: set[str] = set()  # jobs whose shared resource beats their slice now

    def shares_of(self, job_id: str, pp: DemandMatrix, dp: DemandMatrix, n_phases: int) -> dict:
        jf = self.control.job_fabric(job_id)
        if self.model == "lightpath" or jf is None or jf.slice.mode != MODE_ISOLATED:
            return {}
        self.bytes[job_id] = (pp, dp)
        if self.model in ("one-pool-turns", "pod-turns"):
            if self.model == "pod-turns":
                return {(POOL, pod): Share(0.0, 0.0, 0.0) for pod, _ in jf.slice.pod_ports}
            return {(POOL,): Share(0.0, 0.0, 0.0)}  # markers: charged in _turns_times
        if self.model == "pair-trunk":
            pp_b, dp_b = _pair_bytes(pp), _pair_bytes(dp)
            own = {(POOL, a, b): n * self.port_bps for a, b, n in jf.circuits.pairs()}
        else:
            pp_b, dp_b = _pod_bytes(pp), _pod_bytes(dp)
            own = {(POOL, p): n * self.port_bps for p, n in jf.slice.pod_ports}
            if self.model == "pod-pool":
                self.penalty_s[job_id] = n_phases * self.reconfig_s
        for key in set(pp_b) | set(dp_b):
            self.contribution[(job_id, *key)] = own.get(key, 0.0)
        return {k: Share(pp_b.get(k, 0.0), dp_b.get(k, 0.0), 0.0) for k in set(pp_b) | set(dp_b)}

    def _members(self, job_id: str, key: tuple[str, ...], lending: bool = False) -> list[str]:
        """The running jobs on `key` that use it (or, `lending`, lend it their ports)."""
        every = lending and self.lenders == "all"
        return [
            u
            for u in self.key_users[key]
            if u in self.running and (every or u in self.pooled or u == job_id)
        ]

    def _exclusive_s(self, job_id: str, held: Mapping[tuple[str, str], int]) -> tuple[float, ...]:
        """Seconds of exclusive use of `held` ports per phase, a reconfiguration each."""
        oxcs = {o for o, _ in held}
        out = []
        for d in self.bytes[job_id]:
            by_pod, by_pair = _pod_bytes(d), _pair_bytes(d)
            if not by_pod:
                out.append(0.0)
                continue
            need = [(x, sum(held.get((o, k[1]), 0) for o in oxcs)) for k, x in by_pod.items()]
            need += [
                (x, sum(min(held.get((o, k[1]), 0), held.get((o, k[2]), 0)) for o in oxcs))
                for k, x in by_pair.items()
            ]
            t = max(x / (n * self.port_bps) if n else math.inf for x, n in need)
            out.append(t + self.reconfig_s)
        return tuple(out)

    def _turns_times(self, run: _Run, pooled: set[str] | None = None) -> tuple[float, float]:
        """Network times on the turns with `pooled` (default: the pool now) as members."""
        job_id = run.job.job_id
        members = (self.pooled if pooled is None else pooled) | {job_id}
        every = self.lenders in ("all", "lend")
        held: dict[tuple[str, str], int] = defaultdict(int)
        for ja in self.control.allocation.jobs:
            if (every or ja.job_id in members) and ja.mode == MODE_ISOLATED:
                for oxc, pod, n in ja.oxc_ports:
                    held[(oxc, pod)] += n
        pp, dp = self._exclusive_s(job_id, held)
        worst = 1.0
        for key in run.profile.shares:
            others = [
                u for u in self.key_users[key] if u in self.running and u in members and u != job_id
            ]
            busy = 0.0
            for u in others:
                total = self.running[u].iteration_total_s(self.running[u].iter_done)
                busy += sum(self._exclusive_s(u, held)) / total if total > 0 else 0.0
            rest = 1.0  # the pool's time the lenders leave (they come first)
            if self.lenders == "lend":
                # lenders on their own slice take the pod back for their own bursts
                for u in self.key_users[key]:
                    lender = self.running.get(u)
                    if lender is None or u in members:
                        continue
                    total = lender.iteration_total_s(lender.iter_done)
                    p = lender.profile
                    # its bursts, and each phase's rewiring back to its own circuits
                    own = p.pp_alone_s + p.dp_alone_s
                    own += sum(1 for t in (p.pp_alone_s, p.dp_alone_s) if t > 0) * self.reconfig_s
                    rest -= own / total if total > 0 else 0.0
            # the sharers split what is left, each never less than a fair 1/n of it
            cap = max(rest - busy, rest / (len(others) + 1))
            worst = max(worst, 1.0 / cap if cap > 0 else math.inf)
        return pp * worst, dp * worst

    def _turns_iteration_s(self, job_id: str, pooled: set[str]) -> float:
        """A job's iteration (network part as estimated) with `pooled` as the pool."""
        run = self.running[job_id]
        if job_id not in pooled:
            return run.profile.iteration_s(run.profile.pp_alone_s, run.profile.dp_alone_s)
        return run.profile.iteration_s(*self._turns_times(run, pooled))

    def _nobody_worse(self, job_id: str, after: set[str]) -> bool:
        """`fair`: a job joins or leaves only if no other sharer's estimate gets worse."""
        keys = set(self.running[job_id].profile.shares)
        for u in self.pooled - {job_id}:
            if u in self.running and keys & set(self.running[u].profile.shares):
                before = self._turns_iteration_s(u, self.pooled)
                if self._turns_iteration_s(u, after) > before * (1 + 1e-9):
                    return False
        return True

    def _net_times(self, run: _Run) -> tuple[float, float]:
        shares = run.profile.shares
        alone = run.profile.pp_alone_s, run.profile.dp_alone_s
        if not shares:
            return alone
        job_id = run.job.job_id
        pen = self.penalty_s.get(job_id, 0.0)
        if self.model in ("one-pool-turns", "pod-turns"):
            pp, dp = self._turns_times(run)
        else:
            pp = dp = 0.0
            for key, share in shares.items():
                users = self._members(job_id, key)
                capacity = sum(
                    self.contribution.get((u, *key), 0.0)
                    for u in self._members(job_id, key, lending=True)
                )
                if capacity <= 0:
                    pp = dp = math.inf
                    break
                others = self.key_rate[key] - run.rates.get(key, 0.0)
                cap = max(capacity - others, capacity / max(1, len(users)))
                pp = max(pp, share.pp_amount / cap)
                dp = max(dp, share.dp_amount / cap)
        # the better of its own slice and the shared resource, after the fact
        pooled_better = run.profile.iteration_s(pp, dp) + pen < run.profile.iteration_s(*alone)
        turns = self.model in ("one-pool-turns", "pod-turns")
        if turns and self.lenders == "fair" and (job_id in self.pooled) != pooled_better:
            after = self.pooled | {job_id} if pooled_better else self.pooled - {job_id}
            if not self._nobody_worse(job_id, after):
                pooled_better = not pooled_better  # the move would slow another sharer
        if pooled_better:
            self.pooled.add(job_id)
            return pp, dp
        self.pooled.discard(job_id)
        return alone

    def _set_rates(self, run: _Run) -> None:
        super()._set_rates(run)
        if run.job.job_id not in self.pooled:
            self._clear_rates(run)  # on its own slice it loads nothing shared

    def _start(self, at: float, job: Job, placement: Placement) -> None:
        if self.lenders in ("leave", "fair"):
            self.pooled.add(job.job_id)  # every job starts in the pool and leaves if alone pays
        super()._start(at, job, placement)

    def _leave(self, at: float, run: _Run, *, completed: bool) -> None:
        self.pooled.discard(run.job.job_id)
        super()._leave(at, run, completed=completed)

    def _rerate(self, at: float, touched: set[str]) -> None:
        super()._rerate(at, touched)
        # the reconfiguration each pooled phase pays (its circuits rewired from the pool)
        for job_id in self._neighbours(touched):
            run = self.running[job_id]
            pen = self.penalty_s.get(job_id, 0.0)
            if pen and job_id in self.pooled and run.profile.shares:
                run.base_s = run.profile.iteration_s(run.pp_net, run.dp_net) + pen
                if self._is_bulk(run) or run.iter_done == 0:
                    self._schedule(run)


def _profile_with_shares(sim: WhatIf):  # type: ignore[no-untyped-def]
    def profile(ctx, job, placement, state, iterations, start_s):  # type: ignore[no-untyped-def]
        prof = profile_optical(ctx, job, placement, state, iterations, start_s)
        jf = state.job_fabric(job.job_id)
        if jf is None or sim.model == "lightpath":
            return prof
        traffic = {
            t.phase: t.pod_demand
            for t in job_traffic(
                ctx.cluster, job, placement, prof.algorithm, dict(jf.collective.root_tors)
            )
        }
        phases = sum(1 for d in (job.parallelism.pp, job.parallelism.dp) if d > 1)
        shares = sim.shares_of(job.job_id, traffic[PHASE_PP], traffic[PHASE_DP], phases)
        return replace(prof, shares=shares) if shares else prof

    return profile


def opportunity(sim: Simulation) -> dict[str, float]:
    """Time-weighted shares of cross-pod job-time with a pair / a pod in common."""
    acc: dict[str, float] = defaultdict(float)
    last = {"t": 0.0, "snap": {}}
    admit = sim._admit

    def wrapped(at: float, changed: list[str], replan: bool = False) -> None:
        for k, v in last["snap"].items():  # type: ignore[union-attr]
            acc[k] += v * (at - last["t"])  # type: ignore[operator]
        last["t"] = at
        admit(at, changed, replan)
        pairs: dict[tuple[str, str], set[str]] = defaultdict(set)
        pods: dict[str, set[str]] = defaultdict(set)
        cross = 0
        for ja in sim.control.allocation.jobs:
            if ja.mode == "none":
                continue
            cross += 1
            for pair in ja.pair_circuits():
                pairs[pair].add(ja.job_id)
            for pod, _ in ja.pod_ports:
                pods[pod].add(ja.job_id)
        last["snap"] = {
            "cross": cross,
            "pair": len({j for v in pairs.values() if len(v) > 1 for j in v}),
            "pod": len({j for v in pods.values() if len(v) > 1 for j in v}),
        }

    sim._admit = wrapped  # type: ignore[method-assign]
    sim.run()
    return {k: acc[k] / acc["cross"] for k in ("pair", "pod")} if acc["cross"] else {}


def run_model(model: str, lenders: str, cluster, copies, gpu, latency) -> list[dict]:  # type: ignore[no-untyped-def]
    out = []
    for k, w in enumerate(copies):
        sim = WhatIf(
            cluster,
            w,
            "lightpath",
            seed=k,
            reconfig_ms=latency,
            gpu=gpu,
            model=model,
            lenders=lenders,
        )
        original = sim_module.profile_optical
        sim_module.profile_optical = _profile_with_shares(sim)  # type: ignore[assignment]
        try:
            result = sim.run()
        finally:
            sim_module.profile_optical = original
        out.append(summarize(result))
    return out


def _fmt(agg: Mapping[str, Mapping[str, float]], key: str, scale: float, digits: int) -> str:
    v = agg[key]
    if not v.get("values"):
        return "-"
    return f"{v['mean'] * scale:.{digits}f} ± {v['ci95'] * scale:.{digits}f}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--family", default="comm-heavy")
    ap.add_argument("--uplinks", type=int, default=16)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--latency", type=float, default=25.0)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--lenders", default="all,pooled,leave,fair,lend")
    ap.add_argument("--jobs", type=int, default=160)
    ap.add_argument("--generation-seed", type=int, default=GENERATION_SEED)
    args = ap.parse_args()
    gpu = FAMILY_GPU.get(args.family)
    workload = generate(
        args.family, preset("seed-15k"), load=LOAD, jobs=args.jobs, seed=args.generation_seed
    )
    copies = [jitter(workload, k) for k in range(args.seeds)]
    cluster = variant(args.latency, args.uplinks)
    print(
        f"{args.family} ({args.jobs} jobs, generation seed {args.generation_seed}), "
        f"{args.uplinks} uplinks/pod, {args.latency:g} ms, {args.seeds} seeds "
        f"(load average {os.getloadavg()[0]:.1f})"
    )
    shares = [
        opportunity(Simulation(cluster, w, "lightpath", seed=k, reconfig_ms=args.latency, gpu=gpu))
        for k, w in enumerate(copies)
    ]
    for what in ("pair", "pod"):
        values = [s[what] for s in shares if s]
        print(
            f"cross-pod job-time with a {what} in common with another job: "
            f"{statistics.mean(values) * 100:.1f}% (per seed "
            + ", ".join(f"{v * 100:.1f}" for v in values)
            + ")"
        )
    print("| model | lenders | steady util % | mean slowdown | wall s |")
    print("| --- | --- | --- | --- | --- |")
    for model in args.models.split(","):
        for lenders in args.lenders.split(",") if model != "lightpath" else ["-"]:
            if lenders in ("fair", "lend") and not model.endswith("turns"):
                continue  # the rule is estimated on the turns models only
            t0 = time.perf_counter()
            agg = aggregate(run_model(model, lenders, cluster, copies, gpu, args.latency))
            print(
                f"| {model} | {lenders} | {_fmt(agg, 'steady_utilization', 100, 2)} | "
                f"{_fmt(agg, 'mean_iteration_slowdown', 1, 4)} | {time.perf_counter() - t0:.0f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Traffic of a placed job per communication phase, and pod-to-pod demand matrices.

Pure functions over `Cluster`, `Job` and `Placement`; must not import anything that
does I/O (no FastAPI, SQLAlchemy, Redis, pydantic) or read a clock.

One GPipe iteration has these network phases:

- `pp`: every pipeline (one per (dp_rank, ep_rank)) sends each micro-batch's
  boundary activation forward from stage s to s+1 and its gradient backward from
  s+1 to s: activation_bytes * microbatches bytes each way per adjacent pair.
- `dp`: each DP group (one per (stage, ep_rank), dp members) AllReduces its
  gradient shard S = parameters * bytes_per_parameter / (pp * ep) bytes. Its
  flows depend on the collective algorithm (see `dp_flows`).
- `ep`: MoE AllToAll inside each EP group (same stage and DP rank), which
  placement keeps under one ToR, so it never reaches the optical layer.

Defaults when the launcher did not say (recorded in `TrafficFacts.defaulted`):
parameters 7e9 (a 7B model), 2 bytes per parameter (bf16 gradients),
activation_bytes = hidden_size * seq_len * microbatch_size * bytes_per_parameter
when those are known, else 16 MiB (4096 hidden x 2048 tokens x 2 bytes),
micro-batches 4 * pp (the GPipe rule of thumb m >= 4p).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from .cluster import Cluster
from .job import MAX_ACTIVATION_BYTES, Collective, Job, Placement, Unit
from .memo import IdentityMemo

PHASE_PP = "pp"
PHASE_DP = "dp"
PHASE_EP = "ep"

DEFAULT_PARAMETERS = 7e9
DEFAULT_BYTES_PER_PARAMETER = 2.0
DEFAULT_ACTIVATION_BYTES = 4096 * 2048 * 2.0  # 16 MiB
MICROBATCHES_PER_STAGE = 4  # default microbatches = 4 * pp

# the algorithm names are the one enum the job body uses too
ALGO_RING = Collective.RING
ALGO_TREE = Collective.TREE
ALGO_HIERARCHICAL_RING = Collective.HIERARCHICAL_RING
ALGO_INC = Collective.INC


@dataclass(frozen=True, slots=True)
class Flow:
    """Bytes one endpoint sends another in a phase; endpoints are server or ToR ids."""

    src: str
    dst: str
    size_bytes: float


@dataclass(frozen=True, slots=True)
class TrafficFacts:
    """The model facts traffic is computed from, with the names of defaulted ones."""

    parameters: float
    bytes_per_parameter: float
    activation_bytes: float
    microbatches: int
    defaulted: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class DemandMatrix:
    """Directed pod-to-pod bytes of one phase: `bytes[i][j]` from pod_ids[i] to pod_ids[j]."""

    pod_ids: tuple[str, ...]
    bytes: tuple[tuple[float, ...], ...]

    def __post_init__(self) -> None:
        n = len(self.pod_ids)
        if len(self.bytes) != n or any(len(row) != n for row in self.bytes):
            raise ValueError("demand matrix must be square over pod_ids")

    @staticmethod
    def from_entries(
        pod_ids: Sequence[str], entries: Iterable[tuple[str, str, float]]
    ) -> DemandMatrix:
        """Sum (src_pod, dst_pod, bytes) entries into a matrix; same-pod entries are dropped."""
        index = {p: i for i, p in enumerate(pod_ids)}
        rows = [[0.0] * len(pod_ids) for _ in pod_ids]
        for src, dst, size in entries:
            if src != dst and size > 0:
                rows[index[src]][index[dst]] += size
        return DemandMatrix(tuple(pod_ids), tuple(map(tuple, rows)))

    def get(self, src: str, dst: str) -> float:
        """Bytes from pod `src` to pod `dst` (0 for unknown pods)."""
        if src not in self.pod_ids or dst not in self.pod_ids:
            return 0.0
        return self.bytes[self.pod_ids.index(src)][self.pod_ids.index(dst)]

    @property
    def total_bytes(self) -> float:
        return sum(map(sum, self.bytes))

    def entries(self) -> tuple[tuple[str, str, float], ...]:
        """Non-zero (src_pod, dst_pod, bytes) entries in matrix order."""
        ids = self.pod_ids
        out: list[tuple[str, str, float]] = []
        for p, row in zip(ids, self.bytes, strict=True):
            if any(row):  # most rows of a cluster-wide matrix are all zero: skip them in C
                out.extend((p, q, b) for q, b in zip(ids, row, strict=True) if b > 0)
        return tuple(out)

    @staticmethod
    def from_pairs(pairs: Iterable[tuple[str, str, float]]) -> DemandMatrix:
        """A symmetric matrix: each (pod_a, pod_b, bytes) in both directions."""
        pairs = tuple(pairs)
        pods = sorted({p for a, b, _ in pairs for p in (a, b)})
        return DemandMatrix.from_entries(
            pods, [e for a, b, size in pairs for e in ((a, b, size), (b, a, size))]
        )

    def pairs(self) -> tuple[tuple[str, str, float], ...]:
        """Each pod pair once, (pod_a, pod_b, bytes of its larger direction), pod_a < pod_b,
        sorted: the form plan signatures compare."""
        larger: dict[tuple[str, str], float] = {}
        ids = self.pod_ids
        for i, row in enumerate(self.bytes):
            for j, size in enumerate(row):
                if size > 0:
                    key = (ids[i], ids[j]) if ids[i] < ids[j] else (ids[j], ids[i])
                    if size > larger.get(key, 0.0):
                        larger[key] = size
        return tuple(sorted((a, b, size) for (a, b), size in larger.items()))

    @property
    def is_empty(self) -> bool:
        return not any(any(row) for row in self.bytes)

    def plus(self, other: DemandMatrix) -> DemandMatrix:
        """Element-wise sum over the union of both pod sets."""
        pods = tuple(dict.fromkeys(self.pod_ids + other.pod_ids))
        return DemandMatrix.from_entries(pods, self.entries() + other.entries())


@dataclass(frozen=True, slots=True)
class PhaseTraffic:
    """One phase of a job: its flows and the pod-to-pod demand they make."""

    job_id: str
    phase: str
    flows: tuple[Flow, ...]
    pod_demand: DemandMatrix


def resolve_facts(job: Job) -> TrafficFacts:
    """The job's model facts with documented defaults for the missing ones."""
    return _FACTS.get((job,), lambda: _resolve_facts(job))


def _resolve_facts(job: Job) -> TrafficFacts:
    m = job.model
    defaulted: list[str] = []
    params = m.parameters if m and m.parameters else None
    if params is None:
        params = DEFAULT_PARAMETERS
        defaulted.append("parameters")
    bpp = m.bytes_per_parameter if m and m.bytes_per_parameter else None
    if bpp is None:
        bpp = DEFAULT_BYTES_PER_PARAMETER
        defaulted.append("bytes_per_parameter")
    act = m.activation_bytes if m and m.activation_bytes else None
    if act is None:
        defaulted.append("activation_bytes")
        if m and m.hidden_size and m.seq_len:
            # activation = hidden * tokens * micro-batch size * bytes per value (in
            # floats, bounded like a stated one: the API refuses more, and a job stored
            # before it did must not stop every pass)
            act = float(m.hidden_size) * m.seq_len * (m.microbatch_size or 1) * bpp
            act = min(act, MAX_ACTIVATION_BYTES)
        else:
            act = DEFAULT_ACTIVATION_BYTES
    mbs = m.microbatches if m and m.microbatches else None
    if mbs is None:
        mbs = MICROBATCHES_PER_STAGE * job.parallelism.pp
        defaulted.append("microbatches")
    return TrafficFacts(float(params), float(bpp), float(act), int(mbs), tuple(defaulted))


_FACTS: IdentityMemo[TrafficFacts] = IdentityMemo(4096)


def gradient_bytes(job: Job) -> float:
    """S of one DP group: parameters * bytes_per_parameter / (pp * ep) bytes per server."""
    facts = resolve_facts(job)
    par = job.parallelism
    return facts.parameters * facts.bytes_per_parameter / (par.pp * par.ep)


def pod_of(cluster: Cluster, endpoint: str) -> str | None:
    """The pod of a server, ToR or pod id, or None when the fabric does not know it."""
    if cluster.has_server(endpoint):
        return cluster.server(endpoint).pod_id
    tor = cluster.tors_by_id.get(endpoint)
    if tor is not None:
        return tor.pod_id
    return endpoint if endpoint in cluster.pods_by_id else None


def dp_groups(cluster: Cluster, placement: Placement) -> tuple[tuple[str, ...], ...]:
    """Servers of each DP group (same stage and EP rank), sorted by fabric position."""
    order = cluster.server_position
    groups: dict[tuple[int, int], list[str]] = defaultdict(list)
    for u in placement.units:
        groups[(u.stage, u.ep_rank)].append(u.server)
    return tuple(tuple(sorted(groups[k], key=order.__getitem__)) for k in sorted(groups))


def pp_flows(job: Job, placement: Placement) -> tuple[Flow, ...]:
    """Send/recv between adjacent stages: activation_bytes * microbatches each way."""
    facts = resolve_facts(job)
    size = facts.activation_bytes * facts.microbatches
    by_key: dict[tuple[int, int, int], Unit] = {
        (u.stage, u.dp_rank, u.ep_rank): u for u in placement.units
    }
    flows = []
    for (stage, dp, ep), unit in sorted(by_key.items()):
        nxt = by_key.get((stage + 1, dp, ep))
        if nxt is not None and nxt.server != unit.server:
            flows.append(Flow(unit.server, nxt.server, size))  # forward activations
            flows.append(Flow(nxt.server, unit.server, size))  # backward gradients
    return tuple(flows)


def ep_flows(job: Job, placement: Placement) -> tuple[Flow, ...]:
    """AllToAll inside each EP group: 4 * activation * microbatches / ep per ordered pair.

    Dispatch and combine, forward and backward (4 transfers) of each rank's 1/ep
    token share; uneven in reality, uniform here.
    """
    if job.parallelism.ep <= 1:
        return ()
    facts = resolve_facts(job)
    size = 4 * facts.activation_bytes * facts.microbatches / job.parallelism.ep
    groups: dict[tuple[int, int], list[str]] = defaultdict(list)
    for u in placement.units:
        groups[(u.stage, u.dp_rank)].append(u.server)
    return tuple(
        Flow(a, b, size)
        for key in sorted(groups)
        for a in groups[key]
        for b in groups[key]
        if a != b
    )


def _ring_flows(members: Sequence[str], size_bytes: float) -> list[Flow]:
    """Ring AllReduce: each member sends 2*(N-1)/N*S to its successor."""
    n = len(members)
    if n <= 1:
        return []
    per_edge = 2 * (n - 1) / n * size_bytes
    return [Flow(members[i], members[(i + 1) % n], per_edge) for i in range(n)]


def _split_by(cluster: Cluster, members: Sequence[str], level: str) -> list[list[str]]:
    """Members grouped by pod (level "pod") or ToR (level "tor"), in member order."""
    groups: dict[str, list[str]] = {}
    for s in members:
        server = cluster.server(s)
        groups.setdefault(server.pod_id if level == "pod" else server.tor_id, []).append(s)
    return list(groups.values())


def group_flows(
    cluster: Cluster, members: Sequence[str], size_bytes: float, algorithm: str, root_tor: str = ""
) -> tuple[Flow, ...]:
    """Flows of one DP group's AllReduce of `size_bytes` under `algorithm`.

    ring and tree: ring order over fabric position (a double binary tree moves about
    2*S per node too, so its pod demand is modelled as the ring's). hierarchical
    ring: a ring inside each pod, then n_min rings across pods on S/n_min shards.
    inc (two levels): each member sends S to its ToR aggregator and gets S back;
    with several ToRs each ToR's partial goes to its pod's spine (inside the
    pod), and each other pod's spine sends one partial S to the root pod (the
    pod of `root_tor`) and gets S back: one flow per pod each way crosses the
    optical layer, written between the pod's first ToR and `root_tor`.
    """
    if len(members) <= 1:
        return ()
    if algorithm == ALGO_INC:
        flows: list[Flow] = []
        tors = _split_by(cluster, members, "tor")
        for group in tors:
            tor_id = cluster.server(group[0]).tor_id
            for s in group:
                flows += [Flow(s, tor_id, size_bytes), Flow(tor_id, s, size_bytes)]
        if len(tors) > 1 and root_tor in cluster.tors_by_id:
            root_pod = cluster.tors_by_id[root_tor].pod_id
            for pod_group in _split_by(cluster, members, "pod"):
                first = cluster.server(pod_group[0])
                if first.pod_id != root_pod:
                    flows += [
                        Flow(first.tor_id, root_tor, size_bytes),
                        Flow(root_tor, first.tor_id, size_bytes),
                    ]
        return tuple(flows)
    if algorithm == ALGO_HIERARCHICAL_RING:
        pods = _split_by(cluster, members, "pod")
        if len(pods) == 1:
            pods = _split_by(cluster, members, "tor")
        flows = [f for g in pods for f in _ring_flows(g, size_bytes)]
        shards = min(len(g) for g in pods)
        for k in range(shards):
            flows += _ring_flows([g[k] for g in pods], size_bytes / shards)
        return tuple(flows)
    return tuple(_ring_flows(members, size_bytes))


def dp_flows(
    cluster: Cluster,
    job: Job,
    placement: Placement,
    algorithm: str = ALGO_RING,
    root_tors: Mapping[int, str] | None = None,
) -> tuple[Flow, ...]:
    """DP AllReduce flows of every group; `root_tors` gives INC's pod-level root per group."""
    size = gradient_bytes(job)
    flows: list[Flow] = []
    for i, members in enumerate(dp_groups(cluster, placement)):
        root = (root_tors or {}).get(i, cluster.server(members[0]).tor_id)
        flows += group_flows(cluster, members, size, algorithm, root)
    return tuple(flows)


def pod_demand_from_flows(cluster: Cluster, flows: Iterable[Flow]) -> DemandMatrix:
    """Pod-to-pod bytes of flows over all the cluster's pods; unknown endpoints are skipped."""
    entries = []
    for f in flows:
        src, dst = pod_of(cluster, f.src), pod_of(cluster, f.dst)
        if src is not None and dst is not None:
            entries.append((src, dst, f.size_bytes))
    return DemandMatrix.from_entries(tuple(p.id for p in cluster.pods), entries)


def job_traffic(
    cluster: Cluster,
    job: Job,
    placement: Placement,
    dp_algorithm: str = ALGO_RING,
    root_tors: Mapping[int, str] | None = None,
) -> tuple[PhaseTraffic, ...]:
    """The job's phases (pp, dp, and ep when ep > 1) with flows and pod demand.

    Remembered per (job, placement, algorithm, roots): every arrival re-plans the jobs
    whose ports changed, and their traffic is the same as the last time.
    """
    roots = tuple(sorted(root_tors.items())) if root_tors else ()
    return _TRAFFIC.get(
        (job, placement, cluster),
        lambda: _job_traffic(cluster, job, placement, dp_algorithm, root_tors),
        (dp_algorithm, roots),
    )


_TRAFFIC: IdentityMemo[tuple[PhaseTraffic, ...]] = IdentityMemo(4096, transient=True)


def _job_traffic(
    cluster: Cluster,
    job: Job,
    placement: Placement,
    dp_algorithm: str,
    root_tors: Mapping[int, str] | None,
) -> tuple[PhaseTraffic, ...]:
    phases = [
        (PHASE_PP, pp_flows(job, placement)),
        (PHASE_DP, dp_flows(cluster, job, placement, dp_algorithm, root_tors)),
    ]
    if job.parallelism.ep > 1:
        phases.append((PHASE_EP, ep_flows(job, placement)))
    return tuple(
        PhaseTraffic(job.job_id, name, flows, pod_demand_from_flows(cluster, flows))
        for name, flows in phases
    )


def attribute_flows(
    placements: Iterable[Placement], demands: Iterable[tuple[str, str, float]]
) -> dict[str | None, tuple[Flow, ...]]:
    """Observed (src_server, dst_server, bytes) grouped by the job whose placement holds them.

    A flow belongs to the job holding both ends, else the job holding its source,
    else its destination; flows no placement explains go under None.
    """
    owner: dict[str, str] = {}
    for p in placements:
        for s in p.servers:
            owner[s] = p.job_id
    out: dict[str | None, list[Flow]] = defaultdict(list)
    for src, dst, size in demands:
        job = owner.get(src) if owner.get(src) == owner.get(dst) else None
        job = job or owner.get(src) or owner.get(dst)
        out[job].append(Flow(src, dst, float(size)))
    return {k: tuple(v) for k, v in out.items()}


def observed_pod_demand(
    cluster: Cluster,
    demands: Iterable[tuple[str, str, float]],
    placements: Iterable[Placement] = (),
    job_id: str | None = None,
) -> DemandMatrix:
    """Pod demand of observed server-to-server bytes; with `job_id`, only that job's flows."""
    flows: Iterable[Flow] = (Flow(s, d, float(b)) for s, d, b in demands)
    if job_id is not None:
        flows = attribute_flows(placements, ((f.src, f.dst, f.size_bytes) for f in flows)).get(
            job_id, ()
        )
    return pod_demand_from_flows(cluster, flows)

"""Plan signatures: a stable id for the topology one communication phase wants.

A traffic report is one phase as the network saw it: server-to-server bytes. The
cycle predictor needs the same phase of different iterations to get the same id,
although bytes vary by several percent (stragglers, partial measurement windows)
and the report may not say which job it belongs to. The path is:

1. `attribute_demands`: split a report's demands by job using our own placement.
2. `aggregate_pod_demand`: sum to pod pairs. Intra-pod bytes never touch the
   optics and are dropped; a pair's load is the larger direction, because a
   circuit is full duplex and the busier direction sets how many it needs.
3. `quantise_pod_demand`: a memoryless canonical form, each pair's share of the
   busiest pair on a log2 grid (pairs under 1/64 of it get no circuit and are
   left out). Equal structure gives an equal signature, but a share sitting on a
   grid boundary can flip under noise, so ids come from step 4.
4. `classify_plan`: tolerant matching against the job's catalogue of plans seen
   before (total-variation distance of the normalised demand), so a phase reuses
   the id of the first phase it resembles and a new id is made only for a
   genuinely new shape. Ids are short hashes of the quantised form ("plan-9f2c").

Pure module: no I/O, no clock, no FastAPI/SQLAlchemy/Redis/pydantic imports.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from .cluster import Cluster
from .traffic import DemandMatrix

EMPTY_PLAN_ID = "plan-idle"  # a phase with no inter-pod traffic: no circuits needed
# Pairs below this fraction of the busiest pair get no circuit (their bytes ride a
# two-hop path or the electrical layer), so they stay out of the signature: a
# trickle that comes and goes must not split one plan into two.
DEFAULT_FLOOR = 1.0 / 64.0
# Maximum total-variation distance between two normalised pod demands that still
# count as the same plan. The PAI iteration-jitter traces move shares by TV 0.01-0.06,
# up to 0.19 when a 5x straggler's flows are cut short (job 4; measured in
# tests/engine/test_plan_signature.py); a job's PP and DP phases differ by TV >= 0.5.
DEFAULT_TOLERANCE = 0.25
# Plans a job's catalogue remembers (least recently seen dropped first). A GPipe
# job reported per pipeline phase has up to a few hundred (Llama 3 405B at PP 16:
# ~100); the cap bounds jobs whose MoE phases never repeat exactly.
DEFAULT_CATALOG_SIZE = 512


@dataclass(frozen=True, slots=True)
class Demand:
    """Bytes one server sends another during one communication phase."""

    src: str
    dst: str
    size_bytes: float


@dataclass(frozen=True, slots=True)
class PlanSignature:
    """A plan's id, its quantised form and the normalised demand it was first seen with."""

    plan_id: str
    levels: tuple[tuple[str, str, int], ...]  # (pod_a, pod_b, log2 step below the busiest)
    shares: tuple[tuple[str, str, float], ...]  # each pair's fraction of the phase's bytes


@dataclass(frozen=True, slots=True)
class PlanCatalog:
    """The plans one job has shown so far, oldest first, with when each was last seen.

    Order is insertion order, never reordered, so that a phase equally close to two
    known plans always gets the older one: ids must not depend on recent history.
    """

    entries: tuple[PlanSignature, ...] = ()
    last_seen: tuple[int, ...] = ()  # per entry, the value of `clock` when last matched
    clock: int = 0  # phases classified so far
    tolerance: float = DEFAULT_TOLERANCE
    max_entries: int = DEFAULT_CATALOG_SIZE
    floor: float = DEFAULT_FLOOR


def attribute_demands(
    placements_by_server: Mapping[str, str], demands: Iterable[Demand]
) -> dict[str, tuple[Demand, ...]]:
    """Group demands by the job placed on their source server (else destination server).

    Demands whose both ends hold no job are left out: no job's plan can use them.
    """
    grouped: dict[str, list[Demand]] = {}
    for d in demands:
        job_id = placements_by_server.get(d.src) or placements_by_server.get(d.dst)
        if job_id is not None:
            grouped.setdefault(job_id, []).append(d)
    return {job_id: tuple(ds) for job_id, ds in grouped.items()}


def aggregate_pod_demand(cluster: Cluster, demands: Iterable[Demand]) -> DemandMatrix:
    """Sum server demands to directed pod-to-pod bytes; same-pod and unknown servers skipped."""
    index = cluster.server
    has = cluster.has_server
    directed: dict[tuple[str, str], float] = {}
    for d in demands:
        if d.size_bytes <= 0.0 or not (has(d.src) and has(d.dst)):
            continue
        a, b = index(d.src).pod_id, index(d.dst).pod_id
        if a != b:
            directed[(a, b)] = directed.get((a, b), 0.0) + d.size_bytes
    return pod_demand_from_directed(directed)


def pod_demand_from_directed(directed: Mapping[tuple[str, str], float]) -> DemandMatrix:
    """The demand matrix of directed pod-to-pod bytes (same-pod and empty entries dropped)."""
    entries = [(a, b, size) for (a, b), size in directed.items() if a != b and size > 0.0]
    pods = sorted({p for a, b, _ in entries for p in (a, b)})
    return DemandMatrix.from_entries(pods, entries)


def _significant(pod_demand: DemandMatrix, floor: float) -> tuple[tuple[str, str, float], ...]:
    """The pairs that would get a circuit: at least `floor` of the busiest pair."""
    pairs = pod_demand.pairs()
    if not pairs:
        return ()
    peak = max(b for _, _, b in pairs)
    return tuple(p for p in pairs if p[2] >= floor * peak)


def quantise_pod_demand(
    pod_demand: DemandMatrix, floor: float = DEFAULT_FLOOR
) -> tuple[tuple[str, str, int], ...]:
    """Each significant pair's load as whole log2 steps below the busiest pair.

    Shares that are powers of two of each other (ring neighbours, pipeline
    boundaries, their halves) sit at grid centres, +-41% away from a boundary.
    """
    pairs = _significant(pod_demand, floor)
    if not pairs:
        return ()
    peak = max(b for _, _, b in pairs)
    return tuple((a, b, round(-math.log2(size / peak))) for a, b, size in pairs)


def signature_id(levels: tuple[tuple[str, str, int], ...], digits: int = 4) -> str:
    """A short display id for a quantised plan: stable across processes (blake2b, not hash())."""
    if not levels:
        return EMPTY_PLAN_ID
    text = ";".join(f"{a},{b},{lv}" for a, b, lv in levels)
    return "plan-" + hashlib.blake2b(text.encode(), digest_size=8).hexdigest()[:digits]


def plan_signature(pod_demand: DemandMatrix, floor: float = DEFAULT_FLOOR) -> PlanSignature:
    """The memoryless signature of one phase (no catalogue: ids may flip at grid edges)."""
    levels = quantise_pod_demand(pod_demand, floor)
    pairs = _significant(pod_demand, floor)
    total = sum(b for _, _, b in pairs)
    shares = tuple((a, b, size / total) for a, b, size in pairs) if total > 0 else ()
    return PlanSignature(signature_id(levels), levels, shares)


def demand_distance(
    a: tuple[tuple[str, str, float], ...], b: tuple[tuple[str, str, float], ...]
) -> float:
    """Total-variation distance between two normalised pod demands (0 same, 1 disjoint)."""
    shares = {(x, y): s for x, y, s in a}
    distance = 0.0
    for x, y, s in b:
        distance += abs(s - shares.pop((x, y), 0.0))
    distance += sum(shares.values())
    return 0.5 * distance


def classify_plan(catalog: PlanCatalog, pod_demand: DemandMatrix) -> tuple[PlanCatalog, str]:
    """The plan id for one phase: the closest known plan within tolerance, else a new one."""
    signature = plan_signature(pod_demand, catalog.floor)
    if not signature.levels:
        return catalog, EMPTY_PLAN_ID
    best_index, best_distance = -1, catalog.tolerance
    for i, known in enumerate(catalog.entries):
        if known.levels == signature.levels:  # exact structural match: no need to measure
            best_index = i
            break
        distance = demand_distance(known.shares, signature.shares)
        if distance < best_distance or (best_index < 0 and distance == best_distance):
            best_index, best_distance = i, distance
    clock = catalog.clock + 1
    if best_index >= 0 and catalog.entries[best_index].levels == signature.levels:
        seen = list(catalog.last_seen)
        seen[best_index] = clock
        return replace(catalog, last_seen=tuple(seen), clock=clock), catalog.entries[
            best_index
        ].plan_id
    if best_index >= 0:
        # A close match with another quantised form: remember that form as an alias
        # of the plan, so the next time it matches exactly, whatever plans arrive in
        # between (a later, closer plan must not capture it).
        plan_id = catalog.entries[best_index].plan_id
    else:
        # A new plan. Lengthen its id while it collides with a different known plan.
        taken = {e.plan_id for e in catalog.entries}
        plan_id, digits = signature.plan_id, 4
        while plan_id in taken and digits < 16:
            digits += 2
            plan_id = signature_id(signature.levels, digits)
    entries = catalog.entries + (PlanSignature(plan_id, signature.levels, signature.shares),)
    seen_t = catalog.last_seen + (clock,)
    if len(entries) > catalog.max_entries:  # forget the least recently seen plan
        drop = seen_t.index(min(seen_t))
        entries = entries[:drop] + entries[drop + 1 :]
        seen_t = seen_t[:drop] + seen_t[drop + 1 :]
    return replace(catalog, entries=entries, last_seen=seen_t, clock=clock), plan_id

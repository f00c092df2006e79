"""Traffic per phase and pod demand matrices."""

from __future__ import annotations

import math

from app.engine.cluster import preset
from app.engine.job import MAX_ACTIVATION_BYTES, Job, ModelFacts, Parallelism, Placement, Unit
from app.engine.traffic import (
    DEFAULT_ACTIVATION_BYTES,
    DemandMatrix,
    attribute_flows,
    gradient_bytes,
    job_traffic,
    observed_pod_demand,
    resolve_facts,
)

SMALL = preset("small")


def _two_pod_job() -> tuple[Job, Placement]:
    job = Job("j", Parallelism(dp=2, pp=2), ModelFacts(4e9, 2.0, 1e6, 8))
    s0 = SMALL.pods[0].tors[0].servers
    s1 = SMALL.pods[1].tors[0].servers
    units = (
        Unit(s0[0].id, 0, 0, 0),
        Unit(s0[1].id, 0, 1, 0),
        Unit(s1[0].id, 1, 0, 0),
        Unit(s1[1].id, 1, 1, 0),
    )
    return job, Placement("j", units)


def test_defaults_are_recorded() -> None:
    facts = resolve_facts(Job("x", Parallelism(dp=2, pp=3)))
    assert facts.activation_bytes == DEFAULT_ACTIVATION_BYTES
    assert facts.microbatches == 12
    assert set(facts.defaulted) == {
        "parameters",
        "bytes_per_parameter",
        "activation_bytes",
        "microbatches",
    }


def test_pp_crosses_pods_and_dp_stays_inside() -> None:
    job, placement = _two_pod_job()
    phases = {p.phase: p for p in job_traffic(SMALL, job, placement)}
    pp = phases["pp"].pod_demand
    assert pp.get("pod-0", "pod-1") == 2 * 1e6 * 8  # two pipelines, 8 micro-batches
    assert pp.get("pod-1", "pod-0") == 2 * 1e6 * 8
    assert phases["dp"].pod_demand.total_bytes == 0
    assert gradient_bytes(job) == 4e9 * 2 / 2
    # two stages, each a ring of 2: each member sends 2*(N-1)/N*S = S to the other
    assert math.isclose(sum(f.size_bytes for f in phases["dp"].flows), 2 * 2 * gradient_bytes(job))


def test_observed_demand_attributed_by_placement() -> None:
    job, placement = _two_pod_job()
    a, b = placement.units[0].server, placement.units[2].server
    stranger = SMALL.pods[3].tors[0].servers[0].id
    demands = [(a, b, 5.0), (stranger, SMALL.pods[2].tors[0].servers[0].id, 7.0)]
    by_job = attribute_flows([placement], demands)
    assert [f.size_bytes for f in by_job["j"]] == [5.0]
    assert [f.size_bytes for f in by_job[None]] == [7.0]
    only = observed_pod_demand(SMALL, demands, [placement], job_id="j")
    assert only.total_bytes == 5.0 and only.get("pod-0", "pod-1") == 5.0
    everything = observed_pod_demand(SMALL, demands)
    assert everything.total_bytes == 12.0


def test_demand_matrix_plus_and_entries() -> None:
    a = DemandMatrix.from_entries(("p", "q"), [("p", "q", 1.0), ("p", "p", 9.0)])
    b = DemandMatrix.from_entries(("q", "r"), [("q", "r", 2.0)])
    total = a.plus(b)
    assert total.total_bytes == 3.0 and total.get("q", "r") == 2.0


def test_a_stored_shape_past_the_bounds_gives_a_finite_bounded_activation() -> None:
    """A job stored before the API bounded the shape facts must not make the traffic
    model raise (it stopped every scheduling pass)."""
    job = Job("old", Parallelism(dp=1, pp=2), ModelFacts(hidden_size=10**160, seq_len=10**160))
    facts = resolve_facts(job)
    assert facts.activation_bytes == MAX_ACTIVATION_BYTES

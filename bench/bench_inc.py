"""When in-network aggregation wins on seed-15k: INC against ring/tree per DP layout.

No randomness. For DP groups of several shapes (one ToR; several ToRs of one
pod; two and four pods) and gradient shards of 7B/70B/405B-parameter models
(bf16, split over pp=4 stages), it prints the collective engine's estimated
AllReduce time for INC (two levels: ToR, then pod spine) and for the best
non-INC algorithm, with the circuits between the pods given (scarce: 2 per
pod pair; plentiful: servers x NICs), and whether `choose_collective` picks
INC. Then the same with the ToR aggregators held by other jobs (INC goes
through the spine) and with ToR and spine aggregators full (INC falls back).

Usage: .venv/bin/python bench/bench_inc.py
"""

from __future__ import annotations

import os
import sys

from app.engine.cluster import Cluster, preset
from app.engine.collective import AggregatorGrant, AggregatorLedger, choose_collective
from app.engine.job import Job, ModelFacts, Parallelism, Placement, Unit


def _layout(cluster: Cluster, pods: int, tors: int, per_tor: int) -> list[str]:
    out = []
    for p in range(pods):
        for t in range(tors):
            out += [s.id for s in cluster.pods[p].tors[t].servers[:per_tor]]
    return out


def _circuits(cluster: Cluster, servers: list[str], per_pair: int | None) -> dict:
    pods = sorted({cluster.server(s).pod_id for s in servers})
    out = {}
    for i, p in enumerate(pods):
        for q in pods[i + 1 :]:
            n = per_pair
            if n is None:
                n = 8 * sum(1 for s in servers if cluster.server(s).pod_id == p)
            out[(p, q)] = n * cluster.nic_gbps
    return out


def main() -> int:
    cluster = preset("seed-15k")
    shapes = [
        ("1 ToR x 4", 1, 1, 4),
        ("1 ToR x 8", 1, 1, 8),
        ("1 pod, 4 ToRs x 4", 1, 4, 4),
        ("2 pods x 1 ToR x 2", 2, 1, 2),
        ("2 pods x 1 ToR x 8", 2, 1, 8),
        ("4 pods x 2 ToRs x 4", 4, 2, 4),
    ]
    print(
        f"seed-15k: ToR aggregator {cluster.pods[0].tors[0].aggregator_gbps:g} Gb/s, "
        f"pod spine {cluster.pods[0].aggregator_gbps:g} Gb/s, server {cluster.server_gbps:g} Gb/s"
    )
    print(
        f"{'DP group':<22} {'model':>5} {'circuits':>10} {'inc s':>9} {'best other':>18} "
        f"{'picked':>8}"
    )
    for label, pods, tors, per in shapes:
        servers = _layout(cluster, pods, tors, per)
        placement = Placement("j", tuple(Unit(s, 0, i, 0) for i, s in enumerate(servers)))
        for params in (7e9, 70e9, 405e9):
            # S = params x 2 bytes / pp per DP group
            job = Job("j", Parallelism(dp=len(servers), pp=4), ModelFacts(params, 2.0))
            for name, per_pair in (("scarce", 2), ("plentiful", None)):
                if pods == 1 and name == "scarce":
                    continue
                gbps = _circuits(cluster, servers, per_pair) if pods > 1 else None
                c = choose_collective(cluster, job, placement, AggregatorLedger(), gbps)
                costs = dict(c.costs)
                other = min((a for a in costs if a != "inc"), key=costs.__getitem__)
                circ = name if pods > 1 else "-"
                print(
                    f"{label:<22} {params / 1e9:4.0f}B {circ:>10} {costs['inc']:9.4f} "
                    f"{other + ' ' + format(costs[other], '.4f'):>18} {c.algorithm:>8}"
                )
    # aggregators held by others: ToRs full (spine carries INC), then spines full too
    servers = _layout(cluster, 2, 1, 2)
    placement = Placement("j", tuple(Unit(s, 0, i, 0) for i, s in enumerate(servers)))
    job = Job("j", Parallelism(dp=4, pp=4), ModelFacts(70e9, 2.0))
    gbps = _circuits(cluster, servers, 2)
    tors = [cluster.tors_by_id[f"pod-{p}/tor-0"] for p in (0, 1)]
    full_tors = tuple(AggregatorGrant(t.id, "others", t.aggregator_gbps) for t in tors)
    full_spines = tuple(
        AggregatorGrant(f"pod-{p}", "others", cluster.pods[p].aggregator_gbps) for p in (0, 1)
    )
    print()
    for label, ledger in (
        ("aggregators free", AggregatorLedger()),
        ("ToR aggregators full", AggregatorLedger(full_tors)),
        ("ToRs and spines full", AggregatorLedger(full_tors + full_spines)),
    ):
        c = choose_collective(cluster, job, placement, ledger, gbps)
        print(f"2 pods x 1 ToR x 2, 70B, scarce circuits, {label}: {c.algorithm} {c.aggregators}")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

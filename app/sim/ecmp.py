"""The electrical baseline: a 3-tier Clos whose inter-pod paths are chosen by ECMP hashing.

Each pod has `spines` aggregation switches; the pod's uplinks (as many as its
optical ports, at the NIC rate, so both fabrics have the same core bandwidth)
are split evenly over them. A flow from a server under ToR t in pod P to pod Q
is hashed three times, at the three tiers the design notes name
(seeds/000: "three hash stages in a 3-tier Clos make it worse"):

1. ToR t picks spine k = h mod S (ToR-to-spine links are 1:1: the ToR's servers'
   NIC bandwidth over S links);
2. spine k picks its uplink j = h mod L (L = uplinks / S) to the core;
3. the core picks the downlink into Q among Q's U uplinks, i = h mod U, which
   lands on Q's spine i // L and then the destination ToR.

Every switch hashes the same 5-tuple with the same function (`correlated=True`,
the default and the case the notes describe), so the stages are correlated:
flows that reached spine k all have h = k (mod S), and when S and L share a
factor g, spine k only ever uses L/g of its uplinks (hash polarisation); the
core stage is likewise confined. LLM training has few flows (each server pair
of a ring or a pipeline edge is one flow per NIC, 8 per server pair), so the
loss is not averaged away. `correlated=False` draws an independent hash per
stage (what randomised per-switch seeds would give).

Flows are the engine's (`traffic.job_traffic`); a phase's network time on the
Clos is max over links of bytes / capacity (the `links_time_s` of the
simulator's sharing model adds other jobs' load).

Pure functions; no I/O. Hashes are blake2b of the flow's 5-tuple and a seed.
"""

from __future__ import annotations

import hashlib
import struct
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from app.engine.cluster import Cluster, Server
from app.engine.traffic import Flow

DEFAULT_SPINES = 8  # aggregation switches per pod
ROCE_PORT = 4791  # RoCEv2 destination UDP port: every flow shares it


@dataclass(frozen=True, slots=True)
class ClosShape:
    """Tier sizes of the electrical Clos built over `cluster`."""

    spines: int
    uplinks: dict[str, int]  # per pod: links to the core, each at nic_gbps

    def per_spine(self, pod: str) -> int:
        return max(1, self.uplinks[pod] // self.spines)


# What an electrical Clos costs next to the optical layer of the same uplink capacity.
# Google's move from a spine-based Clos to OCS direct connect cut the fabric's capex
# by 30% (Poutievski et al., "Jupiter Evolving", SIGCOMM 2022): the money of an
# optical layer buys an electrical core with 0.7 of its uplinks.
SAME_COST_CAPACITY = 0.7


def clos_shape(cluster: Cluster, spines: int = DEFAULT_SPINES, capacity: float = 1.0) -> ClosShape:
    """The Clos with the cluster's pod uplinks (times `capacity`) over `spines` spines per pod
    (fewer where a pod has fewer core links than that: every spine has one).

    A pod's core links are its optical uplinks plus its electrical core, if any, in
    links at NIC rate: the optical policies use both, so the Clos gets both (a pod of
    no uplinks beside a 3.2 Tb/s core had one 400G link). A pod with neither keeps
    one link, so that cross-pod traffic is slow rather than never sent."""
    uplinks = {
        p.id: max(1, round((p.uplink_ports + p.electrical_gbps / cluster.nic_gbps) * capacity))
        for p in cluster.pods
    }
    return ClosShape(max(1, min(spines, *uplinks.values())), uplinks)


def _hash(seed: int, stage: int, src: str, dst: str, sport: int, correlated: bool) -> int:
    key = f"{src}|{dst}|{sport}|{ROCE_PORT}|17".encode()
    salt = struct.pack("<qq", seed, 0 if correlated else stage)
    return int.from_bytes(hashlib.blake2b(key, digest_size=8, salt=salt[:16]).digest(), "little")


def link_capacity_bps(cluster: Cluster, shape: ClosShape, link: tuple[str, ...]) -> float:
    """Capacity of one link key: ToR<->spine links 1:1 with the ToR's NICs, core links NIC rate.

    Sprayed traffic is kept per link group: all of a ToR's spine links
    (`tor-up-all`, `tor-down-all`) or all of a pod's core links (`pod-up`, `pod-down`).
    """
    if link[0] in ("tor-up", "tor-down"):
        tor = cluster.tors_by_id[link[1]]
        return len(tor.servers) * cluster.server_gbps / shape.spines * 1e9 / 8
    if link[0] in ("tor-up-all", "tor-down-all"):
        tor = cluster.tors_by_id[link[1]]
        return len(tor.servers) * cluster.server_gbps * 1e9 / 8
    if link[0] in ("pod-up", "pod-down"):
        return shape.uplinks[link[1]] * cluster.nic_gbps * 1e9 / 8
    return cluster.nic_gbps * 1e9 / 8


def spray_flows(
    cluster: Cluster, shape: ClosShape, flows: Iterable[Flow]
) -> dict[tuple[str, ...], float]:
    """Bytes per link group when every packet is sprayed over all paths (adaptive routing).

    The best an electrical Clos of the same uplink capacity can do: a phase is
    limited only by each ToR's and each pod's total uplink capacity.
    """
    load: dict[tuple[str, ...], float] = defaultdict(float)
    for f, a, b in _inter_pod(cluster, flows):
        load[("tor-up-all", a.tor_id)] += f.size_bytes
        load[("pod-up", a.pod_id)] += f.size_bytes
        load[("pod-down", b.pod_id)] += f.size_bytes
        load[("tor-down-all", b.tor_id)] += f.size_bytes
    return dict(load)


def _inter_pod(cluster: Cluster, flows: Iterable[Flow]) -> Iterator[tuple[Flow, Server, Server]]:
    """Flows between servers of different pods, with their two servers (others skipped)."""
    for f in flows:
        if not (cluster.has_server(f.src) and cluster.has_server(f.dst)):
            continue
        a, b = cluster.server(f.src), cluster.server(f.dst)
        if a.pod_id != b.pod_id:
            yield f, a, b


def hash_flows(
    cluster: Cluster,
    shape: ClosShape,
    flows: Iterable[Flow],
    seed: int,
    *,
    correlated: bool = True,
    subflows: int | None = None,
) -> dict[tuple[str, ...], float]:
    """Bytes per link of the inter-pod `flows`, one subflow per NIC (source port = rail).

    Intra-pod flows stay in the pod's non-blocking fabric and load no link here;
    endpoints that are not servers (INC ToRs) are skipped (the Clos has no INC).
    """
    rails = subflows or cluster.gpus_per_server
    load: dict[tuple[str, ...], float] = defaultdict(float)
    s_count = shape.spines
    for f, a, b in _inter_pod(cluster, flows):
        per = f.size_bytes / rails
        l_src = shape.per_spine(a.pod_id)
        u_dst = shape.uplinks[b.pod_id]
        l_dst = shape.per_spine(b.pod_id)
        for rail in range(rails):
            sport = 49152 + rail
            h1 = _hash(seed, 1, f.src, f.dst, sport, correlated)
            h2 = h1 if correlated else _hash(seed, 2, f.src, f.dst, sport, correlated)
            h3 = h1 if correlated else _hash(seed, 3, f.src, f.dst, sport, correlated)
            k = h1 % s_count
            j = h2 % l_src
            i = h3 % u_dst
            k_dst = min(s_count - 1, i // l_dst)
            load[("tor-up", a.tor_id, str(k))] += per
            load[("core-up", a.pod_id, str(k), str(j))] += per
            load[("core-down", b.pod_id, str(i))] += per
            load[("tor-down", b.tor_id, str(k_dst))] += per
    return dict(load)


def links_time_s(cluster: Cluster, shape: ClosShape, load: dict[tuple[str, ...], float]) -> float:
    """Completion time of one phase's link loads alone: max bytes / capacity."""
    return max(
        (b / link_capacity_bps(cluster, shape, link) for link, b in load.items()), default=0.0
    )

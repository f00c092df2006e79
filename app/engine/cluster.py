"""The fabric: pods, ToRs, servers, pod uplink ports and the OXCs they plug into.

Pure values only. This module must not import anything that does I/O
(no FastAPI, SQLAlchemy, Redis, pydantic); the store and the CLI read cluster
files and turn them into these values with `cluster_from_dict`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

GPUS_PER_SERVER = 8
NIC_GBPS = 400.0
# an OXC reconfiguration past an hour is a unit mistake, not a switch (MEMS switches take
# 10-100 ms, robotic patch panels minutes); simulated times near 1e18 ms lose the
# sub-second resolution every phase's timing needs
MAX_RECONFIG_MS = 3_600_000.0


@dataclass(frozen=True, slots=True)
class Server:
    """The smallest schedulable unit: one host with its GPUs (TP stays inside it)."""

    id: str
    tor_id: str
    pod_id: str


@dataclass(frozen=True, slots=True)
class Tor:
    """A leaf switch, the servers under it, and its in-network aggregation capacity."""

    id: str
    pod_id: str
    servers: tuple[Server, ...]
    aggregator_gbps: float


@dataclass(frozen=True, slots=True)
class Pod:
    """ToRs behind a non-blocking electrical Clos, with uplink ports into the OXC layer.

    `aggregator_gbps` is the in-network aggregation of the pod's spine: the second
    INC level, which combines ToR partials (and, for groups spanning pods, other
    pods' partials arriving over circuits).

    `electrical_gbps` is the pod's capacity into an electrical packet-switched
    core beside the OXC layer (each way; 0: none). Jobs that get no circuits may
    send their cross-pod traffic there (`network.mode` "electrical").
    """

    id: str
    tors: tuple[Tor, ...]
    uplink_ports: int
    aggregator_gbps: float = 0.0
    electrical_gbps: float = 0.0
    # the pod's servers, gathered once (asked per pod by every admission and arrival)
    _servers: tuple[Server, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_servers", tuple(s for t in self.tors for s in t.servers))

    @property
    def servers(self) -> tuple[Server, ...]:
        return self._servers


@dataclass(frozen=True, slots=True)
class Oxc:
    """An optical cross-connect switch: `ports` ports, some of them wired to pods."""

    id: str
    ports: int
    reconfig_ms: float
    pod_ports: Mapping[str, tuple[int, ...]]

    def pod_of_port(self, port: int) -> str | None:
        """The pod whose uplink is wired to `port`, or None for an unwired port."""
        for pod_id, ports in self.pod_ports.items():
            if port in ports:
                return pod_id
        return None


@dataclass(frozen=True)
class Cluster:
    """The whole fabric. Immutable; free/used state lives in `Occupancy`, not here."""

    name: str
    gpus_per_server: int
    nic_gbps: float
    pods: tuple[Pod, ...]
    oxcs: tuple[Oxc, ...]
    gpu_model: str = "a100"  # the GPU profile compute times come from (gpu_profiles.py)
    _index: dict[str, Server] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        index: dict[str, Server] = {}
        for pod in self.pods:
            for tor in pod.tors:
                for server in tor.servers:
                    if server.id in index:
                        raise ValueError(f"duplicate server id {server.id}")
                    index[server.id] = server
        object.__setattr__(self, "_index", index)

    def server(self, server_id: str) -> Server:
        return self._index[server_id]

    def has_server(self, server_id: str) -> bool:
        return server_id in self._index

    @property
    def server_count(self) -> int:
        return len(self._index)

    @property
    def gpu_count(self) -> int:
        return self.server_count * self.gpus_per_server

    @cached_property
    def server_ids(self) -> tuple[str, ...]:
        """Every server id in fabric order (pod, then ToR, then server)."""
        return tuple(s.id for p in self.pods for t in p.tors for s in t.servers)

    @cached_property
    def server_position(self) -> dict[str, int]:
        """Server id -> its place in fabric order (the order of `server_ids`)."""
        return {s: i for i, s in enumerate(self.server_ids)}

    @cached_property
    def oxc_joined_pods(self) -> frozenset[tuple[str, str]]:
        """Pod pairs (a < b) some OXC has uplinks of both: a circuit can join them."""
        out: set[tuple[str, str]] = set()
        for oxc in self.oxcs:
            wired = sorted(p for p, ports in oxc.pod_ports.items() if ports)
            out.update((a, b) for i, a in enumerate(wired) for b in wired[i + 1 :])
        return frozenset(out)

    def can_join(self, a: str, b: str) -> bool:
        """Can traffic between pods a and b cross: a circuit on some OXC, or both pods'
        electrical cores."""
        pair = (a, b) if a < b else (b, a)
        if pair in self.oxc_joined_pods:
            return True
        pods = self.pods_by_id
        return pods[a].electrical_gbps > 0 and pods[b].electrical_gbps > 0

    @cached_property
    def joined_pod_sets(self) -> tuple[frozenset[str], ...]:
        """Sets of pods every two of which `can_join` joins directly (one set, every pod,
        on a fabric whose OXCs are each wired to every pod). A job spans only pods of
        one set: the allocation builds a circuit between two pods only on an OXC wired
        to both, never one relayed through a third pod that the job is not on.

        Grown greedily from each pod (the largest pods joined to all chosen so far
        first), not every maximal clique: their number grows exponentially with odd
        wirings (a review's 100 pods each on 5 of 24 OXCs had 242,513; listing them
        took 9 s), so on such a fabric a set that a search would find may be missed.
        Polynomial: at most one set per pod."""
        ids = [p.id for p in self.pods]
        near = {a: {b for b in ids if b != a and self.can_join(a, b)} for a in ids}
        if all(len(near[a]) == len(ids) - 1 for a in ids):
            return (frozenset(ids),)  # every pod joins every other (the presets)
        size = {p.id: len(p.servers) for p in self.pods}
        order = {p: i for i, p in enumerate(ids)}
        found: set[frozenset[str]] = set()
        for seed in ids:
            chosen = {seed}
            for p in sorted(near[seed], key=lambda q: (-size[q], order[q])):
                if chosen <= near[p]:
                    chosen.add(p)
            found.add(frozenset(chosen))
        kept = [s for s in found if not any(s < other for other in found)]
        return tuple(sorted(kept, key=lambda s: sorted(order[p] for p in s)))

    @cached_property
    def tors_by_id(self) -> dict[str, Tor]:
        return {t.id: t for p in self.pods for t in p.tors}

    @cached_property
    def pods_by_id(self) -> dict[str, Pod]:
        return {p.id: p for p in self.pods}

    @property
    def server_gbps(self) -> float:
        """Bandwidth of one server into its ToR: one NIC per GPU."""
        return self.gpus_per_server * self.nic_gbps

    @property
    def reconfig_ms(self) -> float:
        """The slowest OXC's reconfiguration latency (a plan change waits for all)."""
        return max((o.reconfig_ms for o in self.oxcs), default=0.0)


def build_cluster(
    name: str,
    *,
    pods: int,
    tors_per_pod: int,
    servers_per_tor: int,
    uplink_ports_per_pod: int,
    oxcs: int,
    oxc_ports: int,
    reconfig_ms: float = 25.0,
    aggregator_gbps: float = 800.0,
    pod_aggregator_gbps: float = 0.0,
    pod_electrical_gbps: float = 0.0,
    gpus_per_server: int = GPUS_PER_SERVER,
    nic_gbps: float = NIC_GBPS,
) -> Cluster:
    """A regular fabric: every pod's uplinks spread evenly over the OXCs.

    Pod p's k-th port on an OXC is port p*ports_per_oxc + k there, so every OXC
    sees every pod (any pod pair can get a circuit on any OXC).
    """
    if uplink_ports_per_pod % oxcs:
        raise ValueError("uplink ports per pod must divide evenly over the OXCs")
    per_oxc = uplink_ports_per_pod // oxcs
    if per_oxc * pods > oxc_ports:
        raise ValueError(f"{pods} pods x {per_oxc} ports exceed an OXC's {oxc_ports} ports")
    pod_values = []
    for p in range(pods):
        pod_id = f"pod-{p}"
        tors = []
        for t in range(tors_per_pod):
            tor_id = f"{pod_id}/tor-{t}"
            servers = tuple(
                Server(f"{tor_id}/srv-{s}", tor_id, pod_id) for s in range(servers_per_tor)
            )
            tors.append(Tor(tor_id, pod_id, servers, aggregator_gbps))
        pod_values.append(
            Pod(pod_id, tuple(tors), uplink_ports_per_pod, pod_aggregator_gbps, pod_electrical_gbps)
        )
    oxc_values = tuple(
        Oxc(
            f"oxc-{o}",
            oxc_ports,
            reconfig_ms,
            {f"pod-{p}": tuple(range(p * per_oxc, (p + 1) * per_oxc)) for p in range(pods)},
        )
        for o in range(oxcs)
    )
    return Cluster(name, gpus_per_server, nic_gbps, tuple(pod_values), oxc_values)


def preset(name: str, *, reconfig_ms: float | None = None) -> Cluster:
    """The clusters the service ships.

    `small`: 4 pods x 2 ToRs x 4 servers (32 servers, 256 GPUs), 16 uplinks per
    pod over 2 OXCs of 64 ports. For tests and demos.

    `seed-15k`: the design notes' scale, 1,875 servers, 15,000 GPUs, 400 Gb/s
    NICs. 25 pods of 75 servers (600 GPUs), each pod 5 ToRs of 15 servers
    (120 x 400G server ports: a 51.2 Tb/s, 128 x 400G leaf). Each pod has 192
    x 400G uplinks into the optical layer (76.8 Tb/s, 3.1:1 below the pod's
    240 Tb/s of NICs: inter-pod traffic is DP/PP, TP and EP stay inside), spread
    12 per OXC over 16 OXCs of 320 ports (a Polatis Series 7000-class
    384-port MEMS switch holds 25 x 12 = 300 used ports). ToR aggregators
    take 3.2 Tb/s of INC input (a SHARP-class switch aggregates at a
    fraction of line rate); each pod's spine layer aggregates 12.8 Tb/s (four
    spine switches' worth), the second INC level. `small` has 800 Gb/s per ToR
    and 1.6 Tb/s per pod spine.
    """
    presets = {
        "small": dict(
            pods=4,
            tors_per_pod=2,
            servers_per_tor=4,
            uplink_ports_per_pod=16,
            oxcs=2,
            oxc_ports=64,
            aggregator_gbps=800.0,
            pod_aggregator_gbps=1600.0,
        ),
        "seed-15k": dict(
            pods=25,
            tors_per_pod=5,
            servers_per_tor=15,
            uplink_ports_per_pod=192,
            oxcs=16,
            oxc_ports=320,
            aggregator_gbps=3200.0,
            pod_aggregator_gbps=12800.0,
        ),
    }
    if name not in presets:
        raise KeyError(f"unknown cluster preset {name!r}; known: {', '.join(presets)}")
    kwargs: dict[str, Any] = dict(presets[name])
    if reconfig_ms is not None:
        kwargs["reconfig_ms"] = reconfig_ms
    return build_cluster(name, **kwargs)


PRESETS = ("small", "seed-15k")


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what} must be an integer, got {value!r}")
    return value


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{what} must be a number, got {value!r}")
    return float(value)


def _id(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string, got {value!r}")
    return value


def _list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise ValueError(f"{what} must be a list, got {type(value).__name__}")
    return value


def _mapping(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"{what} must be an object, got {type(value).__name__}")
    return value


def cluster_from_dict(data: Mapping[str, Any], name: str = "custom") -> Cluster:
    """Build a cluster from the shape of `GET /v1/cluster` (free flags are ignored).

    Raises ValueError with a readable reason when the description is inconsistent.
    """
    _known_keys(data)
    try:
        gpus = _int(data.get("gpus_per_server", GPUS_PER_SERVER), "gpus_per_server")
        nic = _number(data.get("nic_gbps", NIC_GBPS), "nic_gbps")
        pods = []
        for p in _list(data["pods"], "pods"):
            pod_id = _id(p["id"], "pod id")
            tors = []
            for t in _list(p["tors"], f"{pod_id} tors"):
                tor_id = _id(t["id"], "ToR id")
                servers = tuple(
                    Server(_id(x["id"], "server id"), tor_id, pod_id)
                    for x in _list(t["servers"], f"{tor_id} servers")
                )
                agg = _number(t.get("aggregator_gbps", 0.0), f"{tor_id} aggregator_gbps")
                tors.append(Tor(tor_id, pod_id, servers, agg))
            pods.append(
                Pod(
                    pod_id,
                    tuple(tors),
                    _int(p.get("uplink_ports", 0), f"{pod_id} uplink_ports"),
                    _number(p.get("aggregator_gbps", 0.0), f"{pod_id} aggregator_gbps"),
                    _number(p.get("electrical_gbps", 0.0), f"{pod_id} electrical_gbps"),
                )
            )
        oxcs = tuple(
            Oxc(
                _id(o["id"], "OXC id"),
                _int(o["ports"], "OXC ports"),
                _number(o.get("reconfig_ms", 25.0), "reconfig_ms"),
                {
                    _id(k, "pod id"): tuple(
                        _int(x, f"{o['id']} port") for x in _list(v, f"{o['id']} pod_ports")
                    )
                    for k, v in _mapping(o.get("pod_ports", {}), "pod_ports").items()
                },
            )
            for o in _list(data.get("oxcs", []), "oxcs")
        )
    except (KeyError, TypeError) as exc:
        raise ValueError(f"cluster description is missing or mistypes a field: {exc}") from exc
    for kind, ids in (
        ("pod", [p.id for p in pods]),
        ("ToR", [t.id for p in pods for t in p.tors]),
        ("server", [x.id for p in pods for t in p.tors for x in t.servers]),
        ("OXC", [o.id for o in oxcs]),
    ):
        twice = sorted(i for i, n in Counter(ids).items() if n > 1)
        if twice:
            raise ValueError(f"{kind} id {twice[0]} appears more than once")
    if gpus <= 0 or not 0 < nic < math.inf:  # NaN fails too
        raise ValueError("gpus_per_server and nic_gbps must be finite numbers above 0")
    if any(not 0 <= o.reconfig_ms <= MAX_RECONFIG_MS for o in oxcs):
        raise ValueError(f"an OXC's reconfig_ms must be a number from 0 to {MAX_RECONFIG_MS:,.0f}")
    for p in pods:  # NaN fails these too
        if not (0 <= p.electrical_gbps < math.inf and 0 <= p.aggregator_gbps < math.inf):
            raise ValueError(
                f"{p.id}: aggregator_gbps and electrical_gbps must be finite numbers >= 0"
            )
        if p.uplink_ports < 0:
            raise ValueError(f"{p.id}: uplink_ports must not be negative")
        for t in p.tors:
            if not 0 <= t.aggregator_gbps < math.inf:
                raise ValueError(f"{t.id}: aggregator_gbps must be a finite number >= 0")
    for o in oxcs:
        if o.ports < 0:
            raise ValueError(f"{o.id}: ports must not be negative")
    gpu_model = str(data.get("gpu_model", "a100")).lower()
    if gpu_model not in ("a100", "h100", "b200"):
        raise ValueError(f"gpu_model must be a100, h100 or b200, got {gpu_model!r}")
    cluster = Cluster(str(data.get("name", name)), gpus, nic, tuple(pods), oxcs, gpu_model)
    pod_ids = {p.id for p in pods}
    for oxc in oxcs:
        seen: set[int] = set()
        for pod_id, ports in oxc.pod_ports.items():
            if pod_id not in pod_ids:
                raise ValueError(f"{oxc.id} wires unknown pod {pod_id}")
            for port in ports:
                if not 0 <= port < oxc.ports or port in seen:
                    raise ValueError(f"{oxc.id} port {port} is out of range or wired twice")
                seen.add(port)
    for pod in pods:
        wired = sum(len(o.pod_ports.get(pod.id, ())) for o in oxcs)
        if oxcs and wired != pod.uplink_ports:
            raise ValueError(f"{pod.id} declares {pod.uplink_ports} uplinks, {wired} are wired")
    if cluster.server_count == 0:
        raise ValueError("the cluster has no servers")
    return cluster


# the fields a cluster file may have at each level: those of `GET /v1/cluster` (its
# live ones, free flags, use and summaries, are read back and ignored) and
# `gpu_model`; anything else is a typo (`electrical_gbs: 800` meant no core at all)
CLUSTER_FILE_KEYS: Mapping[str, frozenset[str]] = {
    "cluster": frozenset(
        {"name", "gpus_per_server", "nic_gbps", "gpu_model", "pods", "oxcs"}
        | {"fragmentation", "summary"}
    ),
    "pod": frozenset({"id", "uplink_ports", "aggregator_gbps", "electrical_gbps", "tors"}),
    "tor": frozenset({"id", "aggregator_gbps", "servers", "aggregator_used_gbps"}),
    "server": frozenset({"id", "free", "job_id"}),
    "oxc": frozenset({"id", "ports", "reconfig_ms", "pod_ports"}),
}


def _known_keys(data: Mapping[str, Any]) -> None:
    """ValueError naming the first field of the description no level knows."""

    def check(level: str, item: object, where: str) -> None:
        if not isinstance(item, Mapping):
            return  # the builder says what is mistyped
        unknown = sorted(str(k) for k in item if k not in CLUSTER_FILE_KEYS[level])
        if unknown:
            allowed = ", ".join(sorted(CLUSTER_FILE_KEYS[level]))
            raise ValueError(f"{where} has an unknown field {unknown[0]!r} (known: {allowed})")

    def items(value: object) -> list[object]:
        return list(value) if isinstance(value, list) else []

    check("cluster", data, "the cluster")
    for p in items(data.get("pods")):
        pod = p.get("id", "?") if isinstance(p, Mapping) else "?"
        check("pod", p, f"pod {pod}")
        for t in items(p.get("tors") if isinstance(p, Mapping) else None):
            tor = t.get("id", "?") if isinstance(t, Mapping) else "?"
            check("tor", t, f"ToR {tor}")
            for x in items(t.get("servers") if isinstance(t, Mapping) else None):
                check("server", x, f"a server of {tor}")
    for o in items(data.get("oxcs")):
        check("oxc", o, f"OXC {o.get('id', '?') if isinstance(o, Mapping) else '?'}")


def without_failed_ports(cluster: Cluster, failed: Mapping[str, frozenset[int]]) -> Cluster:
    """The cluster as the planner may use it: failed OXC ports unwired, uplinks reduced.

    A circuit on a failed port (loss of light) carries nothing, so the planner
    must place it elsewhere; pods lose the failed uplinks from their budgets.
    """
    if not any(failed.values()):
        return cluster
    lost: dict[str, int] = {}
    oxcs = []
    for oxc in cluster.oxcs:
        dead = failed.get(oxc.id, frozenset())
        pod_ports = {}
        for pod_id, ports in oxc.pod_ports.items():
            healthy = tuple(p for p in ports if p not in dead)
            lost[pod_id] = lost.get(pod_id, 0) + len(ports) - len(healthy)
            pod_ports[pod_id] = healthy
        oxcs.append(Oxc(oxc.id, oxc.ports, oxc.reconfig_ms, pod_ports))
    pods = tuple(
        replace(p, uplink_ports=max(0, p.uplink_ports - lost.get(p.id, 0))) for p in cluster.pods
    )
    return Cluster(
        cluster.name,
        cluster.gpus_per_server,
        cluster.nic_gbps,
        pods,
        tuple(oxcs),
        cluster.gpu_model,
    )


def cluster_to_dict(cluster: Cluster, used: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The `GET /v1/cluster` shape; `used` maps server id to the job holding it."""
    used = used or {}
    return {
        "name": cluster.name,
        "gpus_per_server": cluster.gpus_per_server,
        "nic_gbps": cluster.nic_gbps,
        "pods": [
            {
                "id": p.id,
                "uplink_ports": p.uplink_ports,
                "aggregator_gbps": p.aggregator_gbps,
                "electrical_gbps": p.electrical_gbps,
                "tors": [
                    {
                        "id": t.id,
                        "aggregator_gbps": t.aggregator_gbps,
                        "servers": [
                            {"id": s.id, "free": s.id not in used, "job_id": used.get(s.id)}
                            for s in t.servers
                        ],
                    }
                    for t in p.tors
                ],
            }
            for p in cluster.pods
        ],
        "oxcs": [
            {
                "id": o.id,
                "ports": o.ports,
                "reconfig_ms": o.reconfig_ms,
                "pod_ports": {k: list(v) for k, v in o.pod_ports.items()},
            }
            for o in cluster.oxcs
        ],
    }

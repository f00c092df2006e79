"""A queued job's `queue_reason` names what holds it, in the cluster's own terms."""

from __future__ import annotations

from typing import Any

from app.engine.cluster import Cluster, cluster_from_dict
from app.engine.job import Job, Parallelism
from app.engine.queue import QueuePolicy, admit_queued
from app.store import Snapshot
from app.worker.scheduler import queue_reasons


def _chain() -> Cluster:
    """Pods 0 and 1 on one OXC, pods 1 and 2 on another: no OXC joins pods 0 and 2."""
    pods = [
        {
            "id": f"pod-{p}",
            "uplink_ports": 16 if p == 1 else 8,
            "tors": [
                {
                    "id": f"pod-{p}/tor-0",
                    "servers": [{"id": f"pod-{p}/tor-0/srv-{s}"} for s in range(4)],
                }
            ],
        }
        for p in range(3)
    ]

    def oxc(name: str, a: str, b: str) -> dict[str, Any]:
        return {"id": name, "ports": 16, "pod_ports": {a: list(range(8)), b: list(range(8, 16))}}

    oxcs = [oxc("oxc-a", "pod-0", "pod-1"), oxc("oxc-b", "pod-1", "pod-2")]
    return cluster_from_dict({"name": "chain", "pods": pods, "oxcs": oxcs})


def _reasons(cluster: Cluster, used: dict[str, str], queued: list[Job]) -> dict[str, str]:
    snapshot = Snapshot(tuple(queued), used, {})
    free = set(cluster.server_ids) - set(used)
    admission = admit_queued(cluster, free, queued, QueuePolicy.FIFO)
    return queue_reasons(cluster, snapshot, admission)


def test_free_servers_on_pods_no_oxc_joins_are_named_as_such() -> None:
    """A helper's chain of two switches: the middle pod full, 8 servers free on the two
    ends. A 5-server job waits, and its reason said the free servers would spread it
    over more than 3 pods whose uplinks are taken (the cluster has 3, all uplinks
    free); what holds it is that no OXC joins the two ends."""
    cluster = _chain()
    used = {s: "mid" for s in [x.id for x in cluster.pods_by_id["pod-1"].servers]}
    job = Job("w5", Parallelism(dp=5, pp=1))
    why = _reasons(cluster, used, [job])["w5"]
    assert "no OXC joins the pods the free servers are on" in why, why
    assert "at most 4 of them" in why and "uplinks are taken" not in why, why


def test_a_job_larger_than_the_cluster_says_it_can_never_be_placed() -> None:
    """A job accepted on a larger cluster (the service restarted on a smaller file)
    waited for ever as "needs 1875 servers, 12 free"."""
    cluster = _chain()
    big = Job("big", Parallelism(dp=1875, pp=1))
    small = Job("small", Parallelism(dp=2, pp=1))
    used = {s: "x" for s in [x.id for x in cluster.pods_by_id["pod-0"].servers][:3]}
    reasons = _reasons(cluster, used, [big, small])
    assert reasons["big"].startswith("can never be placed on this cluster ("), reasons
    assert "1875 > 12" in reasons["big"] and "cluster changed" in reasons["big"]
    assert "small" not in reasons  # the queue behind it goes on

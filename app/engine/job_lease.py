"""Heartbeat leases of placed jobs: when a launcher that stopped calling is presumed dead.

Pure functions; no I/O. A job submitted with `lease_s` must be heard from
(placement counts, then each heartbeat) at least every `lease_s` seconds while
it is placed; past that its servers are taken back and it is failed with
reason `lease_expired`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

LEASE_EXPIRED = "lease_expired"


@dataclass(frozen=True, slots=True)
class JobLease:
    """What the rule needs of one placed job; times are epoch seconds."""

    job_id: str
    lease_s: float
    placed_at: float
    heartbeat_at: float | None = None


def lease_deadline(lease: JobLease) -> float:
    """When the lease runs out: lease_s after the later of placement and the last heartbeat."""
    last = (
        lease.placed_at if lease.heartbeat_at is None else max(lease.placed_at, lease.heartbeat_at)
    )
    return last + lease.lease_s


def expired_leases(
    leases: Iterable[JobLease], now: float, listening_since: float = 0.0
) -> list[JobLease]:
    """The leases that ran out strictly before `now`, earliest deadline first.

    `listening_since`: when this scheduler started leading. Silence from before it
    does not count: a launcher whose heartbeats were refused while the control plane
    was down (or before a failover) gets a full `lease_s` from then. A job used to
    be failed the moment the service came back from an outage longer than its lease.
    """

    def deadline(x: JobLease) -> float:
        return max(lease_deadline(x), listening_since + x.lease_s)

    return sorted((x for x in leases if deadline(x) < now), key=deadline)

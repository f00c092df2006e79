"""Typed results of the Lightpath API: frozen dataclasses built from its JSON.

Every result keeps the server's whole answer in `raw`, so fields added by a
newer server are never lost to an older client.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

ENDED = frozenset({"completed", "failed", "cancelled"})
_RANK = {"queued": 0, "placed": 1, "completed": 2, "failed": 2, "cancelled": 2}


def state_reached(state: str, target: str) -> bool:
    """`state` is `target` or later (any ended state is later than placed)."""
    return _RANK.get(state, 0) >= _RANK[target]


def _time(value: str | None) -> dt.datetime | None:
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None


@dataclass(frozen=True, slots=True)
class Unit:
    """One parallel unit of a job on one server."""

    server: str
    stage: int
    dp_rank: int
    ep_rank: int


@dataclass(frozen=True, slots=True)
class Job:
    """A job as the server sees it now."""

    job_id: str
    state: str
    dp: int
    pp: int
    ep: int
    submitted_at: dt.datetime | None
    placed_at: dt.datetime | None
    completed_at: dt.datetime | None
    units: tuple[Unit, ...]
    queue_reason: str | None
    exit_code: int | None
    end_reason: str | None
    lease_s: float | None
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_dict(cls, body: dict[str, Any]) -> Job:
        par = body.get("parallelism") or {}
        placement = body.get("placement") or {}
        return cls(
            job_id=body["job_id"],
            state=body["state"],
            dp=int(par.get("dp", 1)),
            pp=int(par.get("pp", 1)),
            ep=int(par.get("ep", 1)),
            submitted_at=_time(body.get("submitted_at")),
            placed_at=_time(body.get("placed_at")),
            completed_at=_time(body.get("completed_at")),
            units=tuple(
                Unit(u["server"], u["stage"], u["dp_rank"], u["ep_rank"])
                for u in placement.get("units", ())
            ),
            queue_reason=body.get("queue_reason"),
            exit_code=body.get("exit_code"),
            end_reason=body.get("end_reason"),
            lease_s=body.get("lease_s"),
            raw=body,
        )

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    @property
    def servers_needed(self) -> int:
        return self.dp * self.pp * self.ep


@dataclass(frozen=True, slots=True)
class JobPage:
    jobs: tuple[Job, ...]
    next: int | None  # pass as `after` for the next page; None on the last page

    @classmethod
    def from_dict(cls, body: dict[str, Any]) -> JobPage:
        return cls(tuple(Job.from_dict(j) for j in body["jobs"]), body.get("next"))


@dataclass(frozen=True, slots=True)
class Decision:
    seq: int
    at: dt.datetime | None
    kind: str
    job_id: str | None
    reason: str
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_dict(cls, body: dict[str, Any]) -> Decision:
        return cls(
            body["seq"],
            _time(body.get("at")),
            body["kind"],
            body.get("job_id"),
            body["reason"],
            body,
        )


@dataclass(frozen=True, slots=True)
class DecisionPage:
    decisions: tuple[Decision, ...]
    next: int  # pass as `after` for the next page

    @classmethod
    def from_dict(cls, body: dict[str, Any]) -> DecisionPage:
        return cls(tuple(Decision.from_dict(d) for d in body["decisions"]), int(body["next"]))


@dataclass(frozen=True, slots=True)
class PodUsage:
    """One pod's servers, like a line of `sinfo`."""

    pod: str
    servers: int
    free: int
    tors: int

    @property
    def used(self) -> int:
        return self.servers - self.free


@dataclass(frozen=True, slots=True)
class ClusterState:
    servers: int
    free_servers: int
    gpus_per_server: int
    queued_jobs: int
    placed_jobs: int
    pods: tuple[PodUsage, ...]
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_dict(cls, body: dict[str, Any]) -> ClusterState:
        pods = tuple(
            PodUsage(
                p["id"],
                sum(len(t["servers"]) for t in p["tors"]),
                sum(1 for t in p["tors"] for s in t["servers"] if s.get("free")),
                len(p["tors"]),
            )
            for p in body["pods"]
        )
        summary = body.get("summary") or {}
        servers = sum(p.servers for p in pods)
        return cls(
            servers=int(summary.get("servers", servers)),
            free_servers=int(summary.get("free_servers", sum(p.free for p in pods))),
            gpus_per_server=int(body.get("gpus_per_server", 8)),
            queued_jobs=int(summary.get("queued_jobs", 0)),
            placed_jobs=int(summary.get("placed_jobs", 0)),
            pods=pods,
            raw=body,
        )


@dataclass(frozen=True, slots=True)
class TrafficAccepted:
    accepted: int
    last_seq: int

    @classmethod
    def from_dict(cls, body: dict[str, Any]) -> TrafficAccepted:
        return cls(int(body["accepted"]), int(body["last_seq"]))


@dataclass(frozen=True, slots=True)
class Advice:
    max_microbatch: int
    fits: bool
    memory_bytes: dict[str, float]

    @classmethod
    def from_dict(cls, body: dict[str, Any]) -> Advice:
        return cls(int(body["max_microbatch"]), bool(body["fits"]), dict(body["memory_bytes"]))


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A traffic report the worker set aside, and why."""

    ord: int
    job_id: str | None
    reason: str
    report: dict[str, Any]
    at: dt.datetime | None

    @classmethod
    def from_dict(cls, body: dict[str, Any]) -> DeadLetter:
        return cls(
            int(body["ord"]),
            body.get("job_id"),
            str(body["reason"]),
            dict(body.get("report") or {}),
            _time(body.get("at")),
        )


@dataclass(frozen=True, slots=True)
class DeadLetterPage:
    dead_letters: tuple[DeadLetter, ...]
    next: int | None  # pass as `after` for the next page; None on the last page

    @classmethod
    def from_dict(cls, body: dict[str, Any]) -> DeadLetterPage:
        return cls(tuple(DeadLetter.from_dict(d) for d in body["dead_letters"]), body.get("next"))


@dataclass(frozen=True, slots=True)
class Prediction:
    job_id: str
    period: int | None
    next_plan: str | None
    hits: int
    misses: int
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_dict(cls, body: dict[str, Any]) -> Prediction:
        return cls(
            body["job_id"],
            body.get("period"),
            body.get("next_plan"),
            body["hits"],
            body["misses"],
            body,
        )

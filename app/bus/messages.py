"""Messages on the event bus: commands in, facts out. Serialisation is here too."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class AdmitJob:
    """A job was submitted: run admission."""

    job_id: str


@dataclass(frozen=True, slots=True)
class CompleteJob:
    """A job finished: free what it held and admit what now fits."""

    job_id: str


@dataclass(frozen=True, slots=True)
class ReportTraffic:
    """Traffic reports up to `last_seq` were stored: feed them to the predictor."""

    last_seq: int


@dataclass(frozen=True, slots=True)
class JobsChanged:
    """The worker changed these jobs' state (API waiters wake up and re-read)."""

    job_ids: tuple[str, ...]


Message = AdmitJob | CompleteJob | ReportTraffic | JobsChanged


@dataclass(frozen=True, slots=True)
class Delivery:
    """A consumed message and the bus's id for it (acknowledge once handled)."""

    id: str
    message: Message


_TYPES: dict[str, type] = {
    cls.__name__: cls for cls in (AdmitJob, CompleteJob, ReportTraffic, JobsChanged)
}


def encode(message: Message) -> str:
    data = asdict(message)
    data["type"] = type(message).__name__
    return json.dumps(data, separators=(",", ":"))


def decode(raw: str | bytes) -> Message:
    data: dict[str, Any] = json.loads(raw)
    cls = _TYPES[data.pop("type")]
    if "job_ids" in data:
        data["job_ids"] = tuple(data["job_ids"])
    return cls(**data)  # type: ignore[no-any-return]


def from_outbox(payload: dict[str, Any]) -> Message:
    """An outbox row's payload (`{"type": ..., ...}`) as a message."""
    return decode(json.dumps(payload))

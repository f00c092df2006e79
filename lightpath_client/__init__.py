"""A client for Lightpath's REST API that installs with nothing but httpx.

from lightpath_client import Client
with Client("http://lightpath:8080", token="...") as lp:
    job = lp.submit_job("gpt-7", dp=8, pp=4, lease_s=60)
    job = lp.wait_for("gpt-7", "placed", timeout_s=3600)
"""

from __future__ import annotations

from ._client import AsyncClient, Call, Client, job_body
from ._exceptions import (
    BadRequest,
    Conflict,
    Forbidden,
    InvalidJobId,
    LightpathError,
    NotFound,
    PayloadTooLarge,
    ProblemError,
    ServerError,
    ServiceUnavailable,
    TransportError,
    Unauthorized,
    UnexpectedAnswer,
    ValidationFailed,
    WaitTimeout,
)
from ._models import (
    Advice,
    ClusterState,
    DeadLetter,
    DeadLetterPage,
    Decision,
    DecisionPage,
    Job,
    JobPage,
    PodUsage,
    Prediction,
    TrafficAccepted,
    Unit,
)
from ._version import version
from .phases import PhaseReporter, ring_allreduce_demands

__version__ = version()
__all__ = [
    "Advice",
    "AsyncClient",
    "BadRequest",
    "Call",
    "Client",
    "ClusterState",
    "Conflict",
    "DeadLetter",
    "DeadLetterPage",
    "Decision",
    "DecisionPage",
    "Forbidden",
    "InvalidJobId",
    "Job",
    "JobPage",
    "LightpathError",
    "NotFound",
    "PayloadTooLarge",
    "PhaseReporter",
    "PodUsage",
    "Prediction",
    "ProblemError",
    "ServerError",
    "ServiceUnavailable",
    "TrafficAccepted",
    "TransportError",
    "UnexpectedAnswer",
    "Unauthorized",
    "Unit",
    "ValidationFailed",
    "WaitTimeout",
    "job_body",
    "ring_allreduce_demands",
]

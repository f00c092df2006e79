"""The event bus: in-process for the embedded default, Redis Streams when configured."""

from .inprocess import InProcessBus
from .messages import AdmitJob, CompleteJob, Delivery, JobsChanged, Message, ReportTraffic

__all__ = [
    "AdmitJob",
    "CompleteJob",
    "Delivery",
    "InProcessBus",
    "JobsChanged",
    "Message",
    "ReportTraffic",
]

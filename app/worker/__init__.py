"""The worker: consumes events, runs the engine, records decisions."""

from .loop import Worker
from .scheduler import schedule

__all__ = ["Worker", "schedule"]

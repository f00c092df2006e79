"""Persistence: tables, migrations glue, and the repositories over them."""

from .database import create_db_engine
from .repository import (
    ConcurrentChange,
    DatabaseNotReady,
    DecisionRecord,
    JobRecord,
    NewDecision,
    PlacedCache,
    Snapshot,
    Store,
    StoreError,
)

__all__ = [
    "ConcurrentChange",
    "DatabaseNotReady",
    "DecisionRecord",
    "JobRecord",
    "NewDecision",
    "PlacedCache",
    "Snapshot",
    "Store",
    "StoreError",
    "create_db_engine",
]

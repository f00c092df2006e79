"""Persistence: tables, migrations glue, and the repositories over them."""

from .database import create_db_engine
from .repository import (
    ConcurrentChange,
    DecisionRecord,
    JobRecord,
    NewDecision,
    PlacedCache,
    SchemaNotCurrent,
    Snapshot,
    Store,
    StoreError,
)

__all__ = [
    "ConcurrentChange",
    "DecisionRecord",
    "JobRecord",
    "NewDecision",
    "PlacedCache",
    "SchemaNotCurrent",
    "Snapshot",
    "Store",
    "StoreError",
    "create_db_engine",
]

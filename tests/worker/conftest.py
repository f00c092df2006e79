"""Fixtures shared by the worker tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from app.settings import Settings
from app.store import Store
from app.store.migrate import upgrade_to_head
from app.wiring import build_store


@pytest.fixture()
def store(tmp_path: Path) -> Iterator[Store]:
    """A migrated SQLite store of its own per test (the `small` cluster's settings)."""
    s = Settings(database_url=f"sqlite:///{tmp_path}/worker.db", cluster="small")
    upgrade_to_head(s)
    store = build_store(s)
    yield store
    store.dispose()

"""Readiness compares the database's schema revision with this build's."""

from __future__ import annotations

from alembic.script import ScriptDirectory

from app.store.migrate import MIGRATIONS_DIR
from app.store.tables import SCHEMA_REVISION


def test_the_schema_revision_readiness_expects_is_the_migrations_head() -> None:
    """A new migration without SCHEMA_REVISION moved would make every migrated
    database look stale to /readyz."""
    assert ScriptDirectory(str(MIGRATIONS_DIR)).get_heads() == [SCHEMA_REVISION]

"""Apply Alembic migrations programmatically (`lightpath migrate`, `serve` at start-up)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

from app.settings import Settings

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"


def alembic_config(settings: Settings) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["database_url"] = settings.database_url
    return config


def upgrade_to_head(settings: Settings) -> None:
    """Bring the configured database to the newest schema; safe to run repeatedly."""
    if settings.sqlite_path is not None:
        settings.sqlite_path.parent.mkdir(parents=True, exist_ok=True)
    command.upgrade(alembic_config(settings), "head")

"""Apply Alembic migrations programmatically (`lightpath migrate`, `serve` at start-up)."""

from __future__ import annotations

import sys
from pathlib import Path

# alembic imports mako, whose HTML error pages load pygments when it is installed
# (~50-90 ms of every `serve` start); a migration never renders one, and mako falls
# back to plain text when the plugin cannot be imported
sys.modules.setdefault("mako.ext.pygmentplugin", None)  # type: ignore[arg-type]

from alembic import command  # noqa: E402
from alembic.config import Config  # noqa: E402

from app.settings import Settings  # noqa: E402

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"


def alembic_config(settings: Settings) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["settings"] = settings
    return config


def upgrade_to_head(settings: Settings) -> None:
    """Bring the configured database to the newest schema; safe to run repeatedly."""
    if settings.sqlite_path is not None:
        settings.sqlite_path.parent.mkdir(parents=True, exist_ok=True)
    command.upgrade(alembic_config(settings), "head")

"""Alembic environment: the URL comes from Lightpath's settings, never from alembic.ini."""

from __future__ import annotations

from alembic import context

from app.settings import Settings
from app.store.database import create_db_engine
from app.store.tables import metadata

config = context.config


def run_migrations_online() -> None:
    # the settings `lightpath migrate` checked, not the environment read again
    settings = config.attributes.get("settings") or Settings()
    url = settings.database_url
    engine = create_db_engine(settings)
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=metadata,
            render_as_batch=url.startswith("sqlite"),
        )
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline migrations are not supported; run `lightpath migrate`")
run_migrations_online()

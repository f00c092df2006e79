"""PostgreSQL pooled connections: tested only after sitting idle, and replaced when dead."""

from __future__ import annotations

import time

import psycopg
import pytest
from sqlalchemy import event, text

from app.settings import Settings
from app.store import database


def test_a_connection_killed_while_idle_is_replaced_before_use(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(database, "IDLE_PING_S", 0.05)
    engine = database.create_db_engine(Settings(database_url=postgres_url))
    pings: list[str] = []
    event.listen(
        engine,
        "before_cursor_execute",
        lambda conn, cur, statement, *a: pings.append(statement),
    )
    try:
        with engine.connect() as conn:
            pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
        with engine.connect() as conn:  # busy: no test of the connection first
            assert conn.execute(text("SELECT pg_backend_pid()")).scalar_one() == pid
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        time.sleep(0.2)
        with engine.connect() as conn:  # idle long enough: tested, found dead, replaced
            assert conn.execute(text("SELECT pg_backend_pid()")).scalar_one() != pid
        assert len(pings) == 3  # the ping is on the raw connection, not a statement here
    finally:
        engine.dispose()

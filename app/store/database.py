"""Database engine construction for SQLite (embedded default) and PostgreSQL."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, create_engine, event

from app.settings import Settings


def create_db_engine(
    settings: Settings, *, for_writes: bool = True, pre_ping: bool = True
) -> Engine:
    """An engine for the configured URL.

    SQLite gets WAL; a write engine takes the write lock at BEGIN (so concurrent
    writers queue instead of failing to upgrade), a read engine does not, so
    readers never wait for writers. `pre_ping=False` (PostgreSQL) skips the
    round trip that tests a pooled connection at every checkout: for a caller
    that retries a failed pass anyway (the worker), a connection lost to a
    database restart costs one failed pass instead of a ping on every query.
    """
    url = settings.database_url
    if settings.is_sqlite:
        path = settings.sqlite_path
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": 30},
            pool_size=8,
            max_overflow=8,
        )
        _configure_sqlite(engine, immediate=for_writes)
        return engine
    return create_engine(url, pool_size=10, max_overflow=10, pool_pre_ping=pre_ping)


def relaxed_commit(conn: Any) -> None:
    """Let this transaction's commit return before its WAL is flushed (PostgreSQL only).

    Only for writes that are safe to lose in a crash because they are redone:
    the relay's published marks (a row is published again, consumers are
    idempotent) and the switches' read-back (read again on the next pass).
    Other sessions see the rows at once either way.
    """
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql("SET LOCAL synchronous_commit = off")


def _configure_sqlite(engine: Engine, *, immediate: bool) -> None:
    """WAL, foreign keys, a long busy timeout, and explicit BEGIN statements."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

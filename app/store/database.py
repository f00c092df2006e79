"""Database engine construction for SQLite (embedded default) and PostgreSQL."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, create_engine, event

from app.settings import Settings


def create_db_engine(settings: Settings, *, for_writes: bool = True) -> Engine:
    """An engine for the configured URL.

    SQLite gets WAL; a write engine takes the write lock at BEGIN (so concurrent
    writers queue instead of failing to upgrade), a read engine does not, so
    readers never wait for writers.
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
    return create_engine(
        url,
        pool_size=settings.db_pool_size,
        max_overflow=settings.db_pool_size,
        pool_timeout=settings.db_pool_timeout_s,
        pool_pre_ping=True,
        connect_args={"options": postgres_options(settings)},
    )


def postgres_options(settings: Settings) -> str:
    """Session settings: no statement waits on a lock, and no transaction stays open, for long.

    A process stopped inside a transaction (SIGSTOP, a GC pause, a debugger)
    would otherwise hold its row locks and block the API and a new leader
    indefinitely; Postgres ends such a session after the idle timeout.
    """
    return (
        f"-c lock_timeout={settings.db_lock_timeout_ms} "
        f"-c idle_in_transaction_session_timeout={settings.db_idle_in_transaction_ms}"
    )


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

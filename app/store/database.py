"""Database engine construction for SQLite (embedded default) and PostgreSQL."""

from __future__ import annotations

import time
import weakref
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.exc import DisconnectionError

from app.settings import Settings

# a pooled PostgreSQL connection idle longer than this is tested before use
IDLE_PING_S = 1.0

# what each PostgreSQL engine made here was created with, for `sibling_engine`
_MADE_WITH: weakref.WeakKeyDictionary[Engine, dict[str, Any]] = weakref.WeakKeyDictionary()


def create_db_engine(settings: Settings, *, for_writes: bool = True) -> Engine:
    """An engine for the configured URL.

    SQLite gets WAL; a write engine takes the write lock at BEGIN (so concurrent
    writers queue instead of failing to upgrade), a read engine does not, so
    readers never wait for writers. PostgreSQL connections are tested only
    after `IDLE_PING_S` idle in the pool (a restart is noticed before use),
    not on every checkout: a busy path makes no extra round trip per query.
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
    made_with = {
        "pool_timeout": settings.db_pool_timeout_s,
        "connect_args": {"options": postgres_options(settings)},
    }
    engine = create_engine(
        url, pool_size=settings.db_pool_size, max_overflow=settings.db_pool_size, **made_with
    )
    _MADE_WITH[engine] = made_with
    _ping_when_idle(engine, IDLE_PING_S)
    return engine


def sibling_engine(engine: Engine, **pool: Any) -> Engine:
    """A PostgreSQL engine with a pool of its own (`pool`: its size and checks) and the
    session settings of `engine`'s connections (lock and idle timeouts), and its pool
    timeout: a statement on it waits for a lock no longer than one on `engine`."""
    made_with = _MADE_WITH.get(engine, {})
    return create_engine(engine.url, **{**made_with, **pool})


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


def _ping_when_idle(engine: Engine, idle_s: float) -> None:
    """Test a connection at checkout only when it sat idle `idle_s` or longer."""

    @event.listens_for(engine, "checkin")
    def _on_checkin(dbapi_conn: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_conn: Any, record: Any, proxy: Any) -> None:
        since = record.info.get("idle_since")
        if since is None or time.monotonic() - since < idle_s:
            return
        try:
            engine.dialect.do_ping(dbapi_conn)
        except Exception as exc:  # the pool drops it and connects afresh
            raise DisconnectionError("stale pooled connection") from exc


def relaxed_commit(conn: Any) -> None:
    """Let this transaction's commit return before its WAL is flushed (PostgreSQL only).

    Only for writes that are safe to lose in a crash because they are redone:
    the relay's published marks (a row is published again, consumers are
    idempotent) and the switches' read-back (read again on the next pass).
    Other sessions see the rows at once either way.
    """
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql("SET LOCAL synchronous_commit = off")


SQLITE_BUSY_TIMEOUT_MS = 10_000


def _configure_sqlite(engine: Engine, *, immediate: bool) -> None:
    """WAL, foreign keys, a long busy timeout, and explicit BEGIN statements."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA foreign_keys=ON")
        # a write waits this long for the lock, then is a 503 with Retry-After: well
        # inside a client's usual 30 s timeout (at 30 s the client gave up first and
        # never saw the 503)
        cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

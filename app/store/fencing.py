"""Fenced writes: a deposed leader's transactions are refused by the database.

The worker's lease (Redis) hands out a fencing token that only grows. A
`Fence` hooks the store's engine: every transaction begun on a thread bound to
the fence (the worker loop, the switch controller) first reads the `fencing`
row of the lease FOR SHARE and compares it with the lease's current token:

- no token (the lease lapsed by local time) or one the row does not hold: the
  transaction is refused with `Fenced` before it reads or writes anything.

Reads are not fenced: a deposed leader reading changes nothing. The store's
read engine marks its connections `UNFENCED` (on PostgreSQL it shares the
write pool), so a read makes no extra round trip and takes no row lock.

A new leader first raises the row to its token, once, in a short transaction of
its own (on Postgres; SQLite has one writer and raises in place). The shared
row locks are held until each transaction ends, so the raise waits for any
transaction of the old leader still open (Postgres ends a stalled one after
`idle_in_transaction_session_timeout`) but never for the new leader's own
threads, which hold no lock while they raise (an upgrade of their shared locks
would deadlock). Once raised, every later transaction of the old leader is
refused. Its pass fails, it forgets its memory
and, its lease gone, stands by: a deposed leader stops within one pass.

The token that opened the transaction is kept in `conn.info["fence_token"]` so
the decision log can record which leader wrote each decision.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, event, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from . import tables as t
from .repository import StoreError

log = logging.getLogger("lightpath.fencing")

TOKEN_KEY = "fence_token"
# an execution option marking an engine's connections as reads: the fence guards writes, so
# a read (on PostgreSQL, the store's read engine shares the write pool) skips its round trip
# and the row lock it would take
UNFENCED = "lightpath_unfenced"


class Fenced(StoreError):
    """This process no longer holds the lease (or a newer leader wrote): nothing was written."""


class Fence:
    """Checks the lease token at the start of every transaction of the bound threads."""

    def __init__(
        self,
        engine: Engine,
        token: Callable[[], int | None],
        name: str = "worker",
        advance: Callable[[int], int | None] | None = None,
    ) -> None:
        self.engine = engine
        self.token = token
        # called with the stored token when ours is below it: a lease that still holds
        # (its token counter lost, e.g. Redis restarted empty) takes a larger one
        self.advance = advance
        self.name = name
        self._threads: set[int] = set()
        self._lock = threading.Lock()
        self._local = threading.local()
        self._raised = 0  # the highest token this process raised the row to
        self.refused = 0
        event.listen(engine, "begin", self._on_begin)

    def bind_current_thread(self) -> None:
        """Fence every transaction this thread begins on the engine from now on."""
        with self._lock:
            self._threads.add(threading.get_ident())

    def unbind_current_thread(self) -> None:
        with self._lock:
            self._threads.discard(threading.get_ident())

    @contextmanager
    def bound(self) -> Iterator[None]:
        """Fence this thread's transactions inside the block (a worker pool's thread that
        writes: a deposed leader's switch pass marked live switches stale from one)."""
        ident = threading.get_ident()
        with self._lock:
            already = ident in self._threads
            self._threads.add(ident)
        try:
            yield
        finally:
            if not already:
                with self._lock:
                    self._threads.discard(ident)

    def close(self) -> None:
        event.remove(self.engine, "begin", self._on_begin)

    def _on_begin(self, conn: Any) -> None:
        if (
            threading.get_ident() not in self._threads
            or getattr(self._local, "raising", False)
            or conn.get_execution_options().get(UNFENCED)
        ):
            conn.info.pop(TOKEN_KEY, None)
            return
        mine = self.token()
        if mine is None:
            self.refused += 1
            raise Fenced("the worker lease is not held: refusing to write")
        if mine > self._raised:
            if conn.dialect.name == "sqlite":  # one writer at a time: raise in place
                self._raise_in(conn, mine)
            else:
                self._raise(mine)
        f = t.fencing
        stored = conn.execute(
            select(f.c.token).where(f.c.name == self.name).with_for_update(read=True)
        ).scalar()
        if stored is None or int(stored) != mine:
            self.refused += 1
            if stored is not None and int(stored) > mine and self.advance is not None:
                self.advance(int(stored))  # no-op unless we still hold the lease
            raise Fenced(f"the fencing row holds {stored} (ours {mine}): refusing to write")
        conn.info[TOKEN_KEY] = mine

    def stored_token(self) -> int | None:
        """The newest token the fencing row holds (None: no leader has written yet)."""
        f = t.fencing
        with self.engine.connect().execution_options(**{UNFENCED: True}) as conn:
            value = conn.execute(select(f.c.token).where(f.c.name == self.name)).scalar()
        return None if value is None else int(value)

    def _raise(self, mine: int) -> None:
        """A new leader's first transaction: raise the row to our token, in a transaction of
        its own (it waits for the old leader's open transactions, never for our own threads,
        which hold no lock on the row while they raise)."""
        self._local.raising = True
        try:
            with self.engine.begin() as conn:
                self._raise_in(conn, mine)
        finally:
            self._local.raising = False

    def _raise_in(self, conn: Any, mine: int) -> None:
        f = t.fencing
        dialect = pg_insert if conn.dialect.name == "postgresql" else sqlite_insert
        conn.execute(dialect(f).values(name=self.name, token=0).on_conflict_do_nothing())
        moved = conn.execute(
            update(f).where(f.c.name == self.name, f.c.token < mine).values(token=mine)
        ).rowcount
        with self._lock:
            self._raised = max(self._raised, mine)
        if moved:
            log.info("fencing token raised", extra={"token": mine})

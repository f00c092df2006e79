"""Fenced writes: a deposed leader's transactions are refused by the database.

The worker's lease (Redis) hands out a fencing token that only grows. A
`Fence` hooks the store's engine: every transaction begun on a thread bound to
the fence (the worker loop, the switch controller) first reads the `fencing`
row of the lease FOR SHARE and compares it with the lease's current token:

- no token (the lease lapsed by local time) or a smaller one than stored: the
  transaction is refused with `Fenced` before it reads or writes anything;
- a larger one (a new leader's first transaction): the row is raised to it.

The shared row lock is held until the transaction ends, so raising the row
waits for any transaction of the old leader still open (Postgres ends a stalled
one after `idle_in_transaction_session_timeout`), and once raised, every later
transaction of the old leader is refused. Its pass fails, it forgets its memory
and, its lease gone, stands by: a deposed leader stops within one pass.

The token that opened the transaction is kept in `conn.info["fence_token"]` so
the decision log can record which leader wrote each decision.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine, event, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from . import tables as t
from .repository import StoreError

log = logging.getLogger("lightpath.fencing")

TOKEN_KEY = "fence_token"


class Fenced(StoreError):
    """This process no longer holds the lease (or a newer leader wrote): nothing was written."""


class Fence:
    """Checks the lease token at the start of every transaction of the bound threads."""

    def __init__(
        self, engine: Engine, token: Callable[[], int | None], name: str = "worker"
    ) -> None:
        self.engine = engine
        self.token = token
        self.name = name
        self._threads: set[int] = set()
        self._lock = threading.Lock()
        self.refused = 0
        event.listen(engine, "begin", self._on_begin)

    def bind_current_thread(self) -> None:
        """Fence every transaction this thread begins on the engine from now on."""
        with self._lock:
            self._threads.add(threading.get_ident())

    def unbind_current_thread(self) -> None:
        with self._lock:
            self._threads.discard(threading.get_ident())

    def close(self) -> None:
        event.remove(self.engine, "begin", self._on_begin)

    def _on_begin(self, conn: Any) -> None:
        if threading.get_ident() not in self._threads:
            conn.info.pop(TOKEN_KEY, None)
            return
        mine = self.token()
        if mine is None:
            self.refused += 1
            raise Fenced("the worker lease is not held: refusing to write")
        f = t.fencing
        stored = conn.execute(
            select(f.c.token).where(f.c.name == self.name).with_for_update(read=True)
        ).scalar()
        if stored is None:  # the migration seeds the row; a truncated table has none
            dialect = pg_insert if conn.dialect.name == "postgresql" else sqlite_insert
            conn.execute(dialect(f).values(name=self.name, token=0).on_conflict_do_nothing())
            stored = conn.execute(
                select(f.c.token).where(f.c.name == self.name).with_for_update(read=True)
            ).scalar()
        if stored is not None and int(stored) > mine:
            self.refused += 1
            raise Fenced(f"a newer leader holds token {stored} (ours {mine}): refusing to write")
        if stored is not None and int(stored) < mine:
            conn.execute(update(f).where(f.c.name == self.name).values(token=mine))
            log.info("fencing token raised", extra={"token": mine, "previous": int(stored)})
        conn.info[TOKEN_KEY] = mine

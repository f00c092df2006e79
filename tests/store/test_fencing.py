"""Fenced writes: a deposed leader's transactions are refused by the database itself."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import select

from app.settings import Settings
from app.store import NewDecision, Store
from app.store import tables as t
from app.store.fencing import Fence, Fenced
from app.store.repository import append_decisions
from app.wiring import build_store


@pytest.fixture
def stores(database_url: str) -> Iterator[tuple[Store, Store]]:
    """Two processes' stores on one database: the old leader's and the new one's."""
    a = build_store(Settings(database_url=database_url))
    b = build_store(Settings(database_url=database_url))
    yield a, b
    a.dispose()
    b.dispose()


def _in_thread(fn: Any) -> Any:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:
            out["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    if "error" in out:
        raise out["error"]
    return out.get("value")


def _write(store: Store, fence: Fence, what: str) -> list[int]:
    def body() -> list[int]:
        fence.bind_current_thread()
        with store.write_engine.begin() as conn:
            return append_decisions(conn, [NewDecision("fabric", None, what, {})])

    return list(_in_thread(body))


def _tokens(store: Store) -> list[tuple[int, str, int | None]]:
    with store.read_engine.connect() as conn:
        rows = conn.execute(
            select(t.decisions.c.seq, t.decisions.c.reason, t.decisions.c.token).order_by(
                t.decisions.c.seq
            )
        ).all()
    return [(r.seq, r.reason, r.token) for r in rows]


def test_a_deposed_leader_cannot_write_after_the_new_one_did(stores: tuple[Store, Store]) -> None:
    old_store, new_store = stores
    old = Fence(old_store.write_engine, lambda: 3)
    new = Fence(new_store.write_engine, lambda: 4)
    assert _write(old_store, old, "old") == [1]
    assert _write(new_store, new, "new") == [2]
    with pytest.raises(Fenced):
        _write(old_store, old, "late")
    assert old.refused == 1
    assert _tokens(new_store) == [(1, "old", 3), (2, "new", 4)]


def test_the_stored_token_is_what_the_last_leader_raised_the_row_to(
    stores: tuple[Store, Store],
) -> None:
    store, other = stores
    fence = Fence(store.write_engine, lambda: 7)
    # a fresh database may hold no row yet (or one left by an earlier test's leader)
    before = Fence(other.write_engine, lambda: None).stored_token()
    assert before is None or before < 7
    _write(store, fence, "first")
    assert fence.stored_token() == 7
    assert Fence(other.write_engine, lambda: None).stored_token() == 7  # any process reads it


def test_a_lapsed_lease_writes_nothing(stores: tuple[Store, Store]) -> None:
    store, _ = stores
    fence = Fence(store.write_engine, lambda: None)
    with pytest.raises(Fenced):
        _write(store, fence, "lapsed")
    assert _tokens(store) == []


def test_unbound_threads_are_not_fenced(stores: tuple[Store, Store]) -> None:
    store, _ = stores
    Fence(store.write_engine, lambda: None)
    with store.write_engine.begin() as conn:  # this (test) thread is not bound
        append_decisions(conn, [NewDecision("fabric", None, "api", {})])
    assert _tokens(store) == [(1, "api", None)]


@pytest.mark.postgres
def test_the_new_leader_waits_for_a_transaction_the_old_one_left_open(postgres_url: str) -> None:
    """The old leader stalls inside a transaction: Postgres ends it, then the new leader writes."""
    from tests.conftest import _truncate

    _truncate(postgres_url)
    settings = Settings(
        database_url=postgres_url, db_idle_in_transaction_ms=500, db_lock_timeout_ms=5000
    )
    old_store, new_store = build_store(settings), build_store(settings)
    old = Fence(old_store.write_engine, lambda: 1)
    new = Fence(new_store.write_engine, lambda: 2)
    stalled = threading.Event()

    def stall() -> None:
        old.bind_current_thread()
        with pytest.raises(Exception), old_store.write_engine.begin() as conn:  # noqa: B017
            append_decisions(conn, [NewDecision("fabric", None, "stalled", {})])
            stalled.set()
            time.sleep(1.5)  # past the idle timeout: the server ends the session

    thread = threading.Thread(target=stall)
    thread.start()
    stalled.wait(5)
    start = time.monotonic()
    assert _write(new_store, new, "new") == [1]
    assert time.monotonic() - start < 1.5
    thread.join(10)
    assert _tokens(new_store) == [(1, "new", 2)]
    old_store.dispose()
    new_store.dispose()


def test_a_new_leaders_threads_raise_the_row_together_without_deadlock(
    stores: tuple[Store, Store],
) -> None:
    old_store, new_store = stores
    _write(old_store, Fence(old_store.write_engine, lambda: 4), "old")
    new = Fence(new_store.write_engine, lambda: 5)
    start = threading.Barrier(4)
    errors: list[BaseException] = []

    def first_transaction(k: int) -> None:
        new.bind_current_thread()
        start.wait()
        try:
            with new_store.write_engine.begin() as conn:
                append_decisions(conn, [NewDecision("fabric", None, f"t{k}", {})])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=first_transaction, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    assert not errors, errors
    assert sorted(tok for _, _, tok in _tokens(new_store)) == [4, 5, 5, 5, 5]


def test_a_leader_whose_token_fell_behind_advances_and_writes_on_its_next_pass(
    stores: tuple[Store, Store],
) -> None:
    old_store, new_store = stores
    _write(old_store, Fence(old_store.write_engine, lambda: 7), "before the reset")
    token = {"value": 1}  # Redis came back empty: the new holder got token 1

    def advance(floor: int) -> int:
        token["value"] = floor + 1
        return token["value"]

    fence = Fence(new_store.write_engine, lambda: token["value"], advance=advance)
    with pytest.raises(Fenced):
        _write(new_store, fence, "refused")
    assert _write(new_store, fence, "after") == [2]
    assert _tokens(new_store) == [(1, "before the reset", 7), (2, "after", 8)]


def test_reads_are_not_fenced_writes_are(stores: tuple[Store, Store]) -> None:
    """A deposed leader may still read (it changes nothing); its writes are refused. On
    PostgreSQL reads share the write pool, marked so the fence makes no round trip for them."""
    store, _ = stores
    fence = Fence(store.write_engine, lambda: None)  # the lease lapsed

    def read() -> int:
        fence.bind_current_thread()
        with store.read_engine.connect() as conn:
            return int(conn.execute(select(t.decisions.c.seq).limit(1)).all() == [])

    assert _in_thread(read) == 1
    with pytest.raises(Fenced):
        _write(store, fence, "lapsed")
    assert fence.refused == 1


def test_decision_times_never_go_back_as_seqs_go_up(stores: tuple[Store, Store]) -> None:
    """A fault sweep read 33 decisions stamped before the one logged ahead of them (up
    to 104 ms): each writer stamped the time its pass began, not the time it took the
    seq. Writers that meet at the counter now stamp in the counter's order."""
    store, other = stores
    start = threading.Barrier(6)

    def writer(s: Store, k: int) -> None:
        start.wait()
        for i in range(15):
            with s.write_engine.begin() as conn:
                append_decisions(conn, [NewDecision("fabric", None, f"w{k}-{i}", {})])

    threads = [
        threading.Thread(target=writer, args=(store if k % 2 else other, k)) for k in range(6)
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    with store.read_engine.connect() as conn:
        d = t.decisions
        ats = [r.at for r in conn.execute(select(d.c.at).order_by(d.c.seq))]
    assert len(ats) == 90
    assert ats == sorted(ats)

"""Traffic ingest without a lock: sequence values, worker-side numbering, group commit."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future

import psycopg
import pytest
from sqlalchemy import create_engine, event, func, insert, select, text
from sqlalchemy.exc import OperationalError

from app.settings import Settings
from app.store import tables as t
from app.store.repository import utcnow
from app.store.traffic_repository import (
    GroupCommit,
    PredictionRow,
    TrafficRepository,
    _Pending,
    with_reconnect,
)
from app.wiring import build_store

DEMAND = [["pod-0/tor-0/srv-0", "pod-1/tor-0/srv-0", 1e9]]


def _report(at: float) -> dict[str, object]:
    return {"job_id": None, "phase_started_at": at, "demands": DEMAND}


@pytest.fixture
def repo(database_url: str) -> Iterator[TrafficRepository]:
    store = build_store(Settings(database_url=database_url))
    yield TrafficRepository(store)
    store.dispose()


def _raw_report(conn, seq: int | None, at: float) -> int:
    values = {"phase_started_at": at, "demands": DEMAND, "received_at": utcnow()}
    if seq is not None:
        values["seq"] = seq
    return conn.execute(
        insert(t.traffic_reports).values(**values).returning(t.traffic_reports.c.seq)
    ).scalar_one()


def test_a_report_committed_behind_a_higher_seq_is_still_consumed(
    repo: TrafficRepository,
) -> None:
    """The worker's cursor counts `ord`, given at read time: a late commit is not skipped."""
    with repo.store.write_engine.begin() as conn:
        _raw_report(conn, 10, 1.0)
    first = repo.reports_after(0)
    assert [(r.seq, r.phase_started_at) for r in first] == [(1, 1.0)]
    with repo.store.write_engine.begin() as conn:
        _raw_report(conn, 5, 2.0)  # a lower sequence value that committed later
    later = repo.reports_after(first[-1].seq)
    assert [(r.seq, r.phase_started_at) for r in later] == [(2, 2.0)]
    assert repo.reports_after(2) == []


def test_reports_numbered_but_not_consumed_are_read_again_with_the_new_ones(
    repo: TrafficRepository,
) -> None:
    """A pass that died after numbering: the next read returns those, then the new ones."""
    with repo.store.write_engine.begin() as conn:
        for at in (1.0, 2.0, 3.0):
            _raw_report(conn, None, at)
    first = repo.reports_after(0, limit=2)
    assert [(r.seq, r.phase_started_at) for r in first] == [(1, 1.0), (2, 2.0)]
    with repo.store.write_engine.begin() as conn:
        _raw_report(conn, None, 4.0)
    again = repo.reports_after(0, limit=10)  # the cursor did not move
    assert [(r.seq, r.phase_started_at) for r in again] == [
        (1, 1.0),
        (2, 2.0),
        (3, 3.0),
        (4, 4.0),
    ]
    assert repo.reports_after(4) == []


def test_concurrent_transactions_commit_out_of_order_on_postgres(postgres_url: str) -> None:
    store = build_store(Settings(database_url=postgres_url))
    with store.write_engine.begin() as conn:
        conn.execute(text("TRUNCATE traffic_reports RESTART IDENTITY"))
        conn.execute(text("DELETE FROM counters"))
    repo = TrafficRepository(store)
    try:
        slow = store.write_engine.connect()
        tx = slow.begin()
        low = _raw_report(slow, None, 1.0)  # takes a sequence value, not yet committed
        count, high = repo.ingest([_report(2.0)])  # does not wait for the open transaction
        assert (count, high) == (1, low + 1)
        assert [r.phase_started_at for r in repo.reports_after(0)] == [2.0]
        tx.commit()
        slow.close()
        assert [(r.seq, r.phase_started_at) for r in repo.reports_after(1)] == [(2, 1.0)]
    finally:
        repo.close()
        store.dispose()


def test_one_group_is_one_transaction_and_writes_no_outbox_event(
    repo: TrafficRepository,
) -> None:
    """The reports are their own outbox (the worker reads them after its cursor)."""
    repo._group()  # the ingest engine
    commits: list[int] = []
    assert repo._ingest_engine is not None
    event.listen(repo._ingest_engine, "commit", lambda conn: commits.append(1))
    group = [
        _Pending([_report(1.0), _report(2.0)], None, None),
        _Pending([_report(3.0)], "key-a", None),
        _Pending([_report(4.0)], "key-a", None),  # the same batch retried at once
        _Pending([_report(5.0)], None, None),
    ]
    answers = repo._write_group(group)
    assert answers[1] == answers[2] and answers[1][0] == 1
    assert answers[0][0] == 2 and answers[3][0] == 1
    assert len({answers[0][1], answers[1][1], answers[3][1]}) == 3
    assert repo.count_reports() == 4, "the retried batch was stored once"
    assert len(commits) == 1
    with repo.store.read_engine.connect() as conn:
        assert conn.execute(select(t.outbox.c.payload)).scalars().all() == []
    again = repo.ingest([_report(6.0)], "key-a")
    assert again == answers[1]
    repo.close()


def _first_group_waits(
    release: threading.Event, groups: list[int]
) -> Callable[[list[_Pending]], list[tuple[int, int]]]:
    """A group writer whose first group blocks until `release`; records group sizes."""

    def write(group: list[_Pending]) -> list[tuple[int, int]]:
        if not groups:
            release.wait(5)
        groups.append(len(group))
        return [(len(p.reports), i) for i, p in enumerate(group)]

    return write


def test_group_commit_takes_everything_queued_and_kicks_once() -> None:
    release = threading.Event()
    groups: list[int] = []
    write = _first_group_waits(release, groups)

    kicks: list[int] = []

    def kick(last_seq: int) -> None:
        kicks.append(last_seq)

    committer = GroupCommit(write)
    first = committer.submit(_Pending([_report(0.0)], None, kick))
    while committer._items.qsize():  # the writer took the first and is blocked
        threading.Event().wait(0.001)
    rest: list[Future[tuple[int, int]]] = [
        committer.submit(_Pending([_report(1.0)] * 2, None, kick)) for _ in range(5)
    ]
    release.set()
    assert first.result(5) == (1, 0)
    assert [f.result(5) for f in rest] == [(2, i) for i in range(5)]
    committer.close()
    assert groups == [1, 5], "the five batches queued meanwhile shared one transaction"
    assert kicks == [0, 4], "one wake-up per transaction, with its newest seq"


def test_after_a_shared_commit_the_writer_lingers_for_batches_in_flight() -> None:
    release = threading.Event()
    groups: list[int] = []
    write = _first_group_waits(release, groups)

    committer = GroupCommit(write, linger_s=0.5)
    start = time.monotonic()
    alone = committer.submit(_Pending([_report(0.0)], None, None))
    while committer._items.qsize():
        threading.Event().wait(0.001)
    together = [committer.submit(_Pending([_report(1.0)], None, None)) for _ in range(2)]
    release.set()
    assert alone.result(5) == (1, 0)
    assert time.monotonic() - start < 0.4, "a lone batch is written at once"
    assert [f.result(5)[0] for f in together] == [1, 1]
    # clients sent together last time: a batch arriving shortly after the first waits
    first = committer.submit(_Pending([_report(2.0)], None, None))
    time.sleep(0.05)
    second = committer.submit(_Pending([_report(3.0)], None, None))
    assert first.result(5)[0] == second.result(5)[0] == 1
    committer.close()
    assert groups == [1, 2, 2]


def test_a_failed_group_fails_each_of_its_batches() -> None:
    def write(group: list[_Pending]) -> list[tuple[int, int]]:
        raise RuntimeError("database down")

    committer = GroupCommit(write)
    future = committer.submit(_Pending([_report(0.0)], None, None))
    with pytest.raises(RuntimeError, match="database down"):
        future.result(5)
    committer.close()


def test_a_dead_pooled_connection_is_retried_once_without_pre_ping(postgres_url: str) -> None:
    engine = create_engine(
        Settings(database_url=postgres_url).database_url, pool_size=1, pool_pre_ping=False
    )
    with engine.connect() as conn:
        pid = conn.execute(select(func.pg_backend_pid())).scalar_one()
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    calls = []

    def body(conn) -> int:
        calls.append(1)
        return int(conn.execute(text("SELECT 41 + 1")).scalar_one())

    assert with_reconnect(engine, body) == 42
    assert len(calls) == 2, "the first attempt met the dead connection"
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        with engine.connect() as conn:
            pid = conn.execute(select(func.pg_backend_pid())).scalar_one()
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))

    def always_fails(conn) -> int:
        raise OperationalError("SELECT 1", {}, Exception("boom"))

    with pytest.raises(OperationalError):
        with_reconnect(engine, always_fails)
    engine.dispose()


def test_the_relay_sends_only_the_newest_traffic_event_of_a_drain(repo: TrafficRepository) -> None:
    """Traffic events an older version left in the outbox: one wake-up for all of them."""
    with repo.store.write_engine.begin() as conn:
        for i in range(3):
            conn.execute(
                insert(t.outbox).values(
                    topic="traffic",
                    payload={"type": "ReportTraffic", "last_seq": i + 1},
                    created_at=utcnow(),
                )
            )
        conn.execute(
            insert(t.outbox).values(
                topic="jobs", payload={"type": "AdmitJob", "job_id": "j"}, created_at=utcnow()
            )
        )
    sent: list[dict[str, object]] = []
    assert repo.store.relay_outbox(sent.append) == 4
    assert sent == [{"type": "ReportTraffic", "last_seq": 3}, {"type": "AdmitJob", "job_id": "j"}]
    repo.close()


def test_stored_predictions_are_read_for_many_jobs_at_once(repo: TrafficRepository) -> None:
    rows = [PredictionRow(f"j{i}", "ring", {"held": i}, i, 2 * i, 0.5 * i) for i in range(3)]
    repo.commit_predictions(1, rows, [])
    found = repo.predictions(["j0", "j2", "unknown"])
    assert found == {"j0": rows[0], "j2": rows[2]}
    assert repo.prediction("j1") == rows[1]
    assert repo.prediction("unknown") is None


@pytest.mark.postgres
def test_a_locked_report_table_fails_the_ingest_after_the_lock_timeout(postgres_url: str) -> None:
    """The ingest's own connections carry the store's lock timeout: with the reports
    table locked by another session, a batch fails after it (the API's 503) instead of
    waiting for as long as the lock is held (a fault sweep's POST took 19 s)."""
    from tests.conftest import _truncate

    _truncate(postgres_url)
    store = build_store(Settings(database_url=postgres_url, db_lock_timeout_ms=300))
    repo = TrafficRepository(store)
    with psycopg.connect(postgres_url) as holder:
        holder.execute("LOCK TABLE traffic_reports IN ACCESS EXCLUSIVE MODE")
        start = time.monotonic()
        waiting = repo.submit([_report(1.0)])
        with pytest.raises(OperationalError, match="lock timeout"):
            waiting.result(timeout=5)  # without the timeout: a TimeoutError here
        assert time.monotonic() - start < 3.0
        holder.rollback()
    accepted, last_seq = repo.ingest([_report(2.0)])  # the lock gone, the next one is stored
    assert accepted == 1 and last_seq >= 1
    repo.close()
    store.dispose()

"""Retention deletes what is past its window and keeps what replay and audit need."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import pytest
from sqlalchemy import insert, select

from app.settings import Settings
from app.store import Store
from app.store import tables as t
from app.store.repository import utcnow
from app.store.retention import Retention, RetentionPolicy, table_sizes
from app.wiring import build_store


@pytest.fixture
def store(database_url: str) -> Iterator[Store]:
    s = build_store(Settings(database_url=database_url))
    yield s
    s.dispose()


def test_old_rows_go_and_unconsumed_or_unpublished_ones_stay(store: Store) -> None:
    now = utcnow()
    old = now - dt.timedelta(days=30)
    with store.write_engine.begin() as conn:
        conn.execute(
            insert(t.decisions),
            [
                {
                    "seq": i,
                    "at": old if i <= 3 else now,
                    "kind": "fabric",
                    "reason": "x",
                    "payload": {},
                }
                for i in range(1, 6)
            ],
        )
        conn.execute(
            insert(t.traffic_reports),
            [
                # consumed and old: deleted; numbered but after the cursor, or unnumbered: kept
                {"seq": 1, "ord": 1, "phase_started_at": 1.0, "demands": [], "received_at": old},
                {"seq": 2, "ord": 2, "phase_started_at": 1.0, "demands": [], "received_at": old},
                {"seq": 3, "ord": 3, "phase_started_at": 1.0, "demands": [], "received_at": old},
                {"seq": 4, "ord": None, "phase_started_at": 1.0, "demands": [], "received_at": old},
                {"seq": 5, "ord": 4, "phase_started_at": 1.0, "demands": [], "received_at": now},
            ],
        )
        conn.execute(insert(t.counters).values(name="traffic_cursor", value=2))
        conn.execute(
            insert(t.traffic_batches),
            [
                {"key": "old", "accepted": 1, "last_seq": 1, "received_at": old},
                {"key": "new", "accepted": 1, "last_seq": 5, "received_at": now},
            ],
        )
        conn.execute(
            insert(t.outbox),
            [
                {"topic": "jobs", "payload": {}, "created_at": old, "published_at": old},
                {"topic": "jobs", "payload": {}, "created_at": old, "published_at": None},
            ],
        )
        conn.execute(
            insert(t.dead_letters),
            [{"ord": 9, "job_id": None, "reason": "r", "report": {}, "at": old}],
        )
    deleted = Retention(store, RetentionPolicy(batch=2)).run()
    assert deleted == {
        "decisions": 3,
        "traffic_reports": 2,
        "traffic_batches": 1,
        "outbox": 1,
        "dead_letters": 1,
        "jobs": 0,
        "predictions": 0,
    }
    with store.read_engine.connect() as conn:
        assert list(
            conn.execute(select(t.decisions.c.seq).order_by(t.decisions.c.seq)).scalars()
        ) == [4, 5]
        assert sorted(conn.execute(select(t.traffic_reports.c.seq)).scalars()) == [3, 4, 5]
        assert list(conn.execute(select(t.traffic_batches.c.key)).scalars()) == ["new"]
        assert list(conn.execute(select(t.outbox.c.published_at)).scalars()) == [None]
    assert table_sizes(store)["dead_letters"] == 0
    assert Retention(store, RetentionPolicy()).run() == dict.fromkeys(deleted, 0)


def _job(job_id: str, order: int, state: str, ended: dt.datetime | None) -> dict[str, object]:
    return {
        "job_id": job_id,
        "submitted_order": order,
        "body": {"job_id": job_id},
        "body_hash": "h",
        "state": state,
        "servers_needed": 1,
        "submitted_at": ended or utcnow(),
        "completed_at": ended,
    }


def test_ended_jobs_go_with_their_prediction_rows_after_the_jobs_window(store: Store) -> None:
    now = utcnow()
    old = now - dt.timedelta(days=40)
    recent = now - dt.timedelta(days=1)
    rows = [
        _job("old-completed", 1, "completed", old),
        _job("old-failed", 2, "failed", old),
        _job("old-cancelled", 3, "cancelled", old),
        _job("recent-completed", 4, "completed", recent),
        # never deleted while queued or placed, whatever the age
        {**_job("old-queued", 5, "queued", None), "submitted_at": old},
        {**_job("old-placed", 6, "placed", None), "submitted_at": old},
    ]
    prediction = {"algorithm": "lightpath", "state": {}, "updated_at": old}
    with store.write_engine.begin() as conn:
        conn.execute(insert(t.jobs), rows)
        conn.execute(
            insert(t.predictions),
            [
                {"job_id": j, **prediction}
                for j in ("old-completed", "recent-completed", "old-placed", "vanished")
            ],
        )
        conn.execute(insert(t.server_assignments).values(server_id="s0", job_id="old-placed"))
    deleted = Retention(store, RetentionPolicy(batch=2)).run()
    assert deleted["jobs"] == 3
    assert deleted["predictions"] == 1  # the orphan; old-completed's went with its job
    with store.read_engine.connect() as conn:
        assert sorted(conn.execute(select(t.jobs.c.job_id)).scalars()) == [
            "old-placed",
            "old-queued",
            "recent-completed",
        ]
        assert sorted(conn.execute(select(t.predictions.c.job_id)).scalars()) == [
            "old-placed",
            "recent-completed",
        ]
        assert list(conn.execute(select(t.server_assignments.c.job_id)).scalars()) == ["old-placed"]
    sizes = table_sizes(store)
    assert sizes["jobs"] == 3 and sizes["predictions"] == 2
    # a shorter window takes the recent one too
    assert Retention(store, RetentionPolicy(jobs_s=3600.0)).run()["jobs"] == 1


def test_an_idempotency_key_is_forgotten_after_its_window(store: Store) -> None:
    from sqlalchemy import update

    from app.store.traffic_repository import TrafficRepository

    traffic = TrafficRepository(store)
    try:
        batch = [{"phase_started_at": 1.0, "demands": [["a", "b", 1.0]]}]
        first = traffic.ingest(batch, "key-1")
        assert traffic.ingest(batch, "key-1") == first  # a retry within the window
        window = RetentionPolicy(idempotency_s=3600.0)
        assert Retention(store, window).run()["traffic_batches"] == 0
        with store.write_engine.begin() as conn:  # the key's batch is now two hours old
            conn.execute(
                update(t.traffic_batches).values(received_at=utcnow() - dt.timedelta(hours=2))
            )
        assert Retention(store, window).run()["traffic_batches"] == 1
        again = traffic.ingest(batch, "key-1")  # after the window: stored as a new batch
        assert again[0] == 1 and again[1] > first[1]
    finally:
        traffic.close()


def test_ended_jobs_are_found_for_retention_by_an_index(store: Store) -> None:
    """Retention takes ended jobs oldest first by `completed_at`: an index serves that
    order, so a pass does not read every ended job of the window."""
    from sqlalchemy import inspect, text

    with store.write_engine.connect() as conn:
        indexes = {i["name"]: i["column_names"] for i in inspect(conn).get_indexes("jobs")}
        assert indexes.get("ix_jobs_completed_at") == ["completed_at"]
        if conn.dialect.name == "postgresql":
            conn.exec_driver_sql("SET enable_seqscan = off")
            conn.exec_driver_sql("SET enable_sort = off")  # the index must give the order
            plan = conn.execute(
                text(
                    "EXPLAIN SELECT job_id FROM jobs WHERE state IN ('completed', 'failed') "
                    "AND completed_at < now() ORDER BY completed_at LIMIT 500"
                )
            ).scalars()
            assert "ix_jobs_completed_at" in "\n".join(plan)

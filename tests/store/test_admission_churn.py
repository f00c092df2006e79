"""Admission under churn: a job that leaves the queue mid-pass does not undo the others."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from app.engine.job import JobState, Placement, Unit
from app.settings import Settings
from app.store import Store
from app.wiring import build_store


@pytest.fixture
def store(database_url: str) -> Iterator[Store]:
    s = build_store(Settings(database_url=database_url))
    yield s
    s.dispose()


def _submit(store: Store, job_id: str) -> None:
    body = {"job_id": job_id, "parallelism": {"dp": 2, "pp": 1}}
    store.submit_job(job_id, body, job_id, servers_needed=2, priority=0, deadline=None)


def _placement(job_id: str, servers: list[str]) -> Placement:
    return Placement(job_id, tuple(Unit(s, 0, i, 0) for i, s in enumerate(servers)))


def test_a_job_cancelled_during_the_pass_is_left_out_and_the_rest_placed(store: Store) -> None:
    for job_id in ("a", "b", "c"):
        _submit(store, job_id)
    snapshot = store.load_snapshot()
    assert [j.job_id for j in snapshot.queued] == ["a", "b", "c"]
    store.end_job("b", JobState.CANCELLED)  # the launcher cancels while the worker decides
    written = store.record_admission(
        [
            _placement("a", ["s0", "s1"]),
            _placement("b", ["s2", "s3"]),
            _placement("c", ["s4", "s5"]),
        ],
        examined=snapshot.unexamined,
        queue_reasons={},
        reason="arrival",
    )
    assert written.placed == ("a", "c")
    assert written.left == ("b",)
    assert len(written.seqs) == 2
    states = {j: store.get_job(j).state for j in ("a", "b", "c")}  # type: ignore[union-attr]
    assert states == {"a": "placed", "b": "cancelled", "c": "placed"}
    assert store.count_free_servers(6) == 2  # b's servers were never taken
    assert [d.job_id for d in store.decisions_after(0, 10)] == ["a", "c"]


def test_queue_reasons_and_examined_are_written_for_every_queued_job(store: Store) -> None:
    for k in range(50):
        _submit(store, f"q{k}")
    snapshot = store.load_snapshot()
    reasons = {f"q{k}": f"needs 2 servers, {k} free" for k in range(50)}
    store.record_admission(
        [], examined=snapshot.unexamined, queue_reasons=reasons, reason="arrival"
    )
    jobs = store.list_jobs("queued", limit=100)
    assert all(j.examined for j in jobs)
    assert {j.job_id: j.queue_reason for j in jobs} == reasons

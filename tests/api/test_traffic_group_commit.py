"""Concurrent POST /v1/traffic through the group commit: every acknowledged report is
stored exactly once, survives a restart and is consumed once, in a gap-free order."""

from __future__ import annotations

import threading
import time
from typing import Any

from sqlalchemy import select

from app.settings import Settings
from app.store import tables as t
from tests.support import LiveServer

CLIENTS = 8
POSTS = 30
A, B = "pod-0/tor-0/srv-0", "pod-1/tor-0/srv-0"


def _batch(at: float) -> dict[str, Any]:
    return {"reports": [{"phase_started_at": at, "demands": [{"src": A, "dst": B, "bytes": 1e9}]}]}


def test_concurrent_reports_are_each_stored_once_and_survive_a_restart(
    settings: Settings,
) -> None:
    first = LiveServer(settings)
    first.start()
    answers: dict[float, dict[str, Any]] = {}
    keyed: list[dict[str, Any]] = []
    failures: list[str] = []
    lock = threading.Lock()
    go = threading.Event()

    def plain(k: int) -> None:
        with first.client() as c:
            go.wait()
            for i in range(POSTS):
                at = float(k * POSTS + i)
                r = c.post("/v1/traffic", json=_batch(at))
                with lock:
                    if r.status_code != 202:
                        failures.append(r.text)
                    answers[at] = r.json()

    def retried(k: int) -> None:
        # two clients send the same ten keyed batches at once: each is stored once
        with first.client() as c:
            go.wait()
            for i in range(10):
                r = c.post(
                    "/v1/traffic", json=_batch(1e6 + i), headers={"Idempotency-Key": f"key-{i}"}
                )
                with lock:
                    if r.status_code != 202:
                        failures.append(r.text)
                    keyed.append({"key": i, **r.json()})

    threads = [threading.Thread(target=plain, args=(k,)) for k in range(CLIENTS)]
    threads += [threading.Thread(target=retried, args=(k,)) for k in range(2)]
    for th in threads:
        th.start()
    go.set()
    for th in threads:
        th.join(60)
    first.stop()  # the acknowledged reports are committed: nothing may depend on this one
    assert not failures
    assert len(answers) == CLIENTS * POSTS
    assert all(a["accepted"] == 1 for a in answers.values())
    assert len({a["last_seq"] for a in answers.values()}) == CLIENTS * POSTS
    by_key: dict[int, set[int]] = {}
    for a in keyed:
        by_key.setdefault(a["key"], set()).add(a["last_seq"])
    assert all(len(seqs) == 1 for seqs in by_key.values()), "a retry gets the first answer"

    second = LiveServer(settings)
    second.start()
    try:
        assert second.runtime is not None
        store = second.runtime.services.store
        traffic = second.runtime.services.traffic
        expected = CLIENTS * POSTS + 10
        deadline = time.monotonic() + 30
        while traffic.cursor() < expected and time.monotonic() < deadline:
            time.sleep(0.05)
        assert traffic.cursor() == expected, "every stored report was consumed"
        r = t.traffic_reports
        with store.read_engine.connect() as conn:
            rows = conn.execute(select(r.c.seq, r.c.ord, r.c.phase_started_at)).all()
        assert len(rows) == expected, "stored exactly once"
        assert sorted(row.ord for row in rows) == list(range(1, expected + 1)), "gap-free"
        stored = {row.phase_started_at: row.seq for row in rows}
        assert {at: a["last_seq"] for at, a in answers.items()} == {
            at: stored[at] for at in answers
        }, "each answer names its own report"
        assert {at for at in stored if at >= 1e6} == {1e6 + i for i in range(10)}
    finally:
        second.stop()

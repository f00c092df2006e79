"""A submitted job's AdmitJob goes out from the API itself, and falls back to the relay."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.exc import OperationalError

from app.bus import InProcessBus
from app.bus.errors import BusUnavailable
from app.bus.messages import AdmitJob
from app.bus.relay import OutboxRelay
from app.settings import Settings
from app.store import Store
from app.store import tables as t
from app.wiring import build_store


@pytest.fixture
def store(database_url: str) -> Iterator[Store]:
    store = build_store(Settings(database_url=database_url))
    yield store
    store.dispose()


def _submit(store: Store, job_id: str, publish: Any) -> None:
    body = {"job_id": job_id, "parallelism": {"dp": 1, "pp": 1, "ep": 1}}
    store.submit_job(
        job_id, body, job_id, servers_needed=1, priority=0, deadline=None, publish=publish
    )


def _unpublished(store: Store) -> list[dict[str, Any]]:
    o = t.outbox
    with store.read_engine.connect() as conn:
        return [r.payload for r in conn.execute(select(o).where(o.c.published_at.is_(None)))]


def test_the_writer_sends_its_event_and_the_relay_does_not_send_it_again(store: Store) -> None:
    bus = InProcessBus()
    relay = OutboxRelay(store, bus.publish)
    sender = relay.direct_sender()
    assert sender is not None
    _submit(store, "j1", sender)
    assert [d.message for d in bus.consume(0.1)] == [AdmitJob("j1")]
    with store.read_engine.connect() as conn:  # a sent event leaves no row behind
        assert conn.execute(select(t.outbox)).all() == []
    assert relay.drain() == 0


def test_a_failed_send_leaves_the_event_to_the_relay_and_pauses_direct_sends(
    store: Store,
) -> None:
    bus = _SwitchableBus()
    relay = OutboxRelay(store, bus.publish)
    sender = relay.direct_sender()
    assert sender is not None
    _submit(store, "j2", sender)  # committed all the same
    assert store.get_job("j2") is not None
    assert _unpublished(store) == [{"type": "AdmitJob", "job_id": "j2"}]
    assert relay.direct_sender() is None  # the next writers go through the relay
    bus.down = False
    assert relay.drain() == 1
    assert [d.message for d in bus.inner.consume(0.1)] == [AdmitJob("j2")]
    assert _unpublished(store) == []


def test_the_relay_says_once_that_the_bus_is_down_and_once_that_it_is_back(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """An outage used to log a traceback every second from the relay's thread."""
    import time

    bus = _SwitchableBus()
    relay = OutboxRelay(store, bus.publish, interval_s=0.02)
    _submit(store, "j3", None)  # left to the relay
    with caplog.at_level("DEBUG", logger="lightpath.relay"):
        relay.start()
        try:
            time.sleep(2.5)  # two or three failed passes (each waits 1 s after failing)
            bus.down = False
            deadline = time.monotonic() + 5
            while _unpublished(store) and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            relay.stop()
    assert _unpublished(store) == []
    relay_said = [r for r in caplog.records if r.name == "lightpath.relay"]
    said = [r.getMessage() for r in relay_said if r.levelname == "WARNING"]
    assert said == [
        "event bus unavailable; events wait in the outbox",
        "event bus reachable again; outbox relayed",
    ]
    assert all(r.exc_info is None for r in caplog.records if r.name == "lightpath.relay")


def test_the_relay_says_the_bus_is_back_only_once_it_answers(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """A fault sweep read "event bus reachable again; outbox relayed" (sent=0) while
    Redis was still down: another process had sent what was waiting, and an empty
    outbox touched no bus. With nothing to send after an outage the relay asks the bus."""
    import time

    bus = _SwitchableBus()
    relay = OutboxRelay(store, bus.publish, interval_s=0.02, ping=bus.ping)
    _submit(store, "j4", None)
    with caplog.at_level("DEBUG", logger="lightpath.relay"):
        relay.start()
        try:
            time.sleep(1.2)  # a failed pass
            store.relay_outbox(lambda payload: None)  # another replica sent it
            time.sleep(2.5)  # passes with nothing to send, the bus still down
            warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
            assert warned == ["event bus unavailable; events wait in the outbox"]
            bus.down = False
            deadline = time.monotonic() + 5
            while len(warned) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
                warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        finally:
            relay.stop()
    assert warned[1:] == ["event bus reachable again; outbox relayed"]


def test_a_dropped_connection_after_a_failed_send_still_answers_the_stored_job(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job is committed before the send: when the outbox row for the relay cannot
    be written either (the database went away), the submit raised and the API
    answered 503 "nothing was done" for a stored job. Only the wake-up is lost: the
    worker's tick reads queued rows."""

    def bus_down(_message: Any) -> None:
        raise ConnectionError("bus down")

    def database_gone(*_args: Any) -> None:
        raise OperationalError("INSERT", {}, Exception("server closed the connection"))

    monkeypatch.setattr("app.store.repository.add_outbox", database_gone)
    _submit(store, "j3", bus_down)
    job = store.get_job("j3")
    assert job is not None and job.state == "queued"


class _SwitchableBus:
    """An in-process bus that refuses every call while `down`."""

    def __init__(self) -> None:
        self.inner = InProcessBus()
        self.down = True

    def publish(self, message: Any) -> None:
        self.ping()
        self.inner.publish(message)

    def ping(self) -> None:
        if self.down:
            raise BusUnavailable("redis unavailable: connection refused")

"""RedisStreamsBus against the real Redis: delivery, redelivery, poison entries, notices, errors."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from app.bus.errors import BusError, BusUnavailable
from app.bus.messages import AdmitJob, CompleteJob, Delivery, JobsChanged, ReportTraffic
from app.bus.redis_streams import RedisStreamsBus
from tests.bus.tcp_proxy import TcpProxy

pytestmark = [pytest.mark.redis, pytest.mark.timeout(30)]

REPO = Path(__file__).resolve().parents[2]
CLOSED_PORT_URL = "redis://127.0.0.1:1/15"


@pytest.fixture
def proxy(redis_url: str) -> Iterator[TcpProxy]:
    """A link to the real Redis that a test can cut and restore."""
    host_port = redis_url.split("//", 1)[1].split("/", 1)[0]
    host, _, port = host_port.partition(":")
    link = TcpProxy((host, int(port or 6379)))
    link.start()
    yield link
    link.cut()


def via(proxy: TcpProxy, redis_url: str) -> str:
    """`redis_url` routed through the proxy (same database)."""
    return f"redis://127.0.0.1:{proxy.port}/{redis_url.rsplit('/', 1)[1]}"


@pytest.fixture
def make_bus(redis_url: str, prefix: str) -> Iterator[Callable[..., RedisStreamsBus]]:
    """Buses on this test's stream and channel, closed at the end."""
    made: list[RedisStreamsBus] = []

    def make(**kwargs: object) -> RedisStreamsBus:
        options: dict[str, object] = {
            "stream": f"{prefix}:commands",
            "changes_channel": f"{prefix}:changes",
            "claim_idle_ms": 200,
        }
        options.update(kwargs)
        url = str(options.pop("redis_url", redis_url))
        bus = RedisStreamsBus(url, **options)  # type: ignore[arg-type]
        made.append(bus)
        return bus

    yield make
    for bus in made:
        bus.close()


def consume_until(bus: RedisStreamsBus, count: int, deadline_s: float = 5.0) -> list[Delivery]:
    """Consume until `count` deliveries arrived or the deadline passed."""
    got: list[Delivery] = []
    deadline = time.monotonic() + deadline_s
    while len(got) < count and time.monotonic() < deadline:
        got.extend(bus.consume(0.1))
    return got


def wait_until(condition: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def pending_count(admin: redis.Redis, bus: RedisStreamsBus) -> int:
    return int(admin.xpending(bus.stream, bus.group)["pending"])


def test_published_commands_are_consumed_in_order_and_gone_once_acked(
    make_bus: Callable[..., RedisStreamsBus], admin: redis.Redis
) -> None:
    bus = make_bus()
    sent = [AdmitJob("job-1"), CompleteJob("job-1"), ReportTraffic(last_seq=42)]
    for message in sent:  # published before any consumer group exists
        bus.publish(message)

    deliveries = bus.consume(1.0)

    assert [d.message for d in deliveries] == sent
    assert len({d.id for d in deliveries}) == 3
    assert all(admin.xrange(bus.stream, d.id, d.id) for d in deliveries)  # ids are entry ids
    assert pending_count(admin, bus) == 3
    bus.ack(deliveries)
    assert pending_count(admin, bus) == 0
    assert admin.xlen(bus.stream) == 0  # acked entries are deleted
    assert bus.consume(0.05) == []


def test_consume_blocks_up_to_the_timeout_and_wakes_on_publish(
    make_bus: Callable[..., RedisStreamsBus],
) -> None:
    consumer, producer = make_bus(), make_bus()
    start = time.monotonic()
    assert consumer.consume(0.3) == []
    assert 0.25 <= time.monotonic() - start < 2.0

    timer = threading.Timer(0.2, producer.publish, args=(AdmitJob("late"),))
    timer.start()
    start = time.monotonic()
    deliveries = consumer.consume(3.0)
    timer.join()
    assert [d.message for d in deliveries] == [AdmitJob("late")]
    assert time.monotonic() - start < 2.0


def test_two_consumers_in_one_group_split_the_entries(
    make_bus: Callable[..., RedisStreamsBus],
) -> None:
    first, second = make_bus(consumer="first"), make_bus(consumer="second")
    first.publish(AdmitJob("a"))
    got_first = first.consume(0.5)
    first.publish(AdmitJob("b"))
    got_second = second.consume(0.5)
    assert [d.message for d in got_first] == [AdmitJob("a")]
    assert [d.message for d in got_second] == [AdmitJob("b")]


def test_unacked_entries_of_a_dead_consumer_are_claimed_after_the_idle_time(
    make_bus: Callable[..., RedisStreamsBus], admin: redis.Redis
) -> None:
    doomed = make_bus(consumer="doomed", claim_idle_ms=200)
    survivor = make_bus(consumer="survivor", claim_idle_ms=200)
    doomed.publish(AdmitJob("job-7"))
    taken = doomed.consume(1.0)
    assert [d.message for d in taken] == [AdmitJob("job-7")]
    # `doomed` never acks. Before the idle time nobody else may take the entry.
    assert survivor.consume(0.05) == []

    time.sleep(0.25)
    claimed = survivor.consume(0.05)

    assert [(d.id, d.message) for d in claimed] == [(taken[0].id, AdmitJob("job-7"))]
    owner = admin.xpending_range(survivor.stream, survivor.group, "-", "+", 10)
    assert [p["consumer"] for p in owner] == [b"survivor"]
    survivor.ack(claimed)
    assert pending_count(admin, survivor) == 0
    assert survivor.consume(0.3) == []  # claimed once, not again


def test_a_pass_that_failed_is_redelivered_to_the_same_consumer(
    make_bus: Callable[..., RedisStreamsBus],
) -> None:
    bus = make_bus(claim_idle_ms=200)
    bus.publish(CompleteJob("job-3"))
    first = bus.consume(1.0)
    assert bus.consume(0.05) == []  # not redelivered while it may still be in hand
    time.sleep(0.25)
    again = bus.consume(0.05)
    assert [(d.id, d.message) for d in again] == [(first[0].id, CompleteJob("job-3"))]


def test_entries_of_a_sigkilled_consumer_process_are_claimed(
    make_bus: Callable[..., RedisStreamsBus], redis_url: str, prefix: str, admin: redis.Redis
) -> None:
    survivor = make_bus(consumer="survivor", claim_idle_ms=300)
    sent = [AdmitJob("job-1"), AdmitJob("job-2")]
    for message in sent:
        survivor.publish(message)
    child_code = textwrap.dedent(
        f"""
        import time
        from app.bus.redis_streams import RedisStreamsBus
        bus = RedisStreamsBus({redis_url!r}, stream={survivor.stream!r}, consumer="victim")
        print(" ".join(d.id for d in bus.consume(5.0)), flush=True)
        time.sleep(60)
        """
    )
    child = subprocess.Popen(
        [sys.executable, "-c", child_code], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        taken_ids = child.stdout.readline().split()
        assert len(taken_ids) == 2
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=5)

    claimed = consume_until(survivor, 2)

    assert [d.id for d in claimed] == taken_ids
    assert [d.message for d in claimed] == sent
    survivor.ack(claimed)
    assert pending_count(admin, survivor) == 0


def test_poison_entries_are_acked_and_never_block_the_stream(
    make_bus: Callable[..., RedisStreamsBus], admin: redis.Redis
) -> None:
    bus = make_bus(claim_idle_ms=200)
    bus.consume(0.01)  # create the group
    poison: list[dict[bytes, bytes]] = [
        {b"message": b"\xff\xfe not utf-8"},
        {b"message": b"{not json"},
        {b"message": b'{"type":"LaunchMissiles","job_id":"x"}'},
        {b"message": b'{"type":"AdmitJob"}'},
        {b"message": b'{"type":"AdmitJob","job_id":"x","extra":1}'},
        {b"message": b"[1,2,3]"},
        {b"something_else": b"hello"},
    ]
    for fields in poison:
        admin.xadd(bus.stream, fields)  # type: ignore[arg-type]
    bus.publish(AdmitJob("good"))

    deliveries = bus.consume(1.0)

    assert [d.message for d in deliveries] == [AdmitJob("good")]
    assert pending_count(admin, bus) == 1  # only the good one awaits its ack
    bus.ack(deliveries)
    time.sleep(0.25)
    assert bus.consume(0.05) == []  # poison is not redelivered by a claim either
    assert admin.xlen(bus.stream) == 0


def test_group_is_recreated_when_the_stream_vanishes(
    make_bus: Callable[..., RedisStreamsBus], admin: redis.Redis
) -> None:
    bus = make_bus()
    bus.publish(AdmitJob("before"))
    bus.ack(bus.consume(0.5))
    admin.delete(bus.stream)  # e.g. Redis restarted without persistence
    assert bus.consume(0.05) == []
    bus.publish(AdmitJob("after"))
    assert [d.message for d in bus.consume(0.5)] == [AdmitJob("after")]


def test_publish_trims_the_stream_to_about_maxlen(
    make_bus: Callable[..., RedisStreamsBus], admin: redis.Redis
) -> None:
    bus = make_bus(maxlen=10)
    for i in range(1000):
        bus.publish(ReportTraffic(last_seq=i))
    # Approximate trimming removes whole internal nodes (100 entries by default).
    assert admin.xlen(bus.stream) < 250


def test_announced_changes_reach_every_listener(
    make_bus: Callable[..., RedisStreamsBus], admin: redis.Redis, prefix: str
) -> None:
    announcer, listening = make_bus(), make_bus()
    got: list[JobsChanged] = []
    also: list[JobsChanged] = []
    arrived = threading.Event()

    def broken(change: JobsChanged) -> None:
        raise RuntimeError("a listener bug")

    def record(change: JobsChanged) -> None:
        got.append(change)
        arrived.set()

    listening.listen(broken)
    listening.listen(record)
    listening.listen(also.append)
    admin.publish(f"{prefix}:changes", b"garbage")  # ignored, does not stop the thread
    announcer.announce(JobsChanged(("job-1", "job-2")))

    assert arrived.wait(5.0)
    assert got == [JobsChanged(("job-1", "job-2"))]
    assert also == got


def test_listener_reconnects_after_redis_drops_the_connection(
    make_bus: Callable[..., RedisStreamsBus], admin: redis.Redis
) -> None:
    announcer, listening = make_bus(), make_bus()
    got: list[JobsChanged] = []
    listening.listen(got.append)
    announcer.announce(JobsChanged(("before",)))
    deadline = time.monotonic() + 5
    while not got and time.monotonic() < deadline:
        time.sleep(0.02)
    assert got == [JobsChanged(("before",))]

    name = f"lightpath-bus:{listening.consumer}"
    victims = [c for c in admin.client_list() if c.get("name") == name and c.get("sub") != "0"]
    assert victims, "the listener's subscription is not visible"
    for client in victims:
        admin.client_kill_filter(_id=client["id"])

    # Pub/sub is fire-and-forget: announce until the reconnected listener hears one.
    deadline = time.monotonic() + 10
    while JobsChanged(("after",)) not in got and time.monotonic() < deadline:
        announcer.announce(JobsChanged(("after",)))
        time.sleep(0.05)
    assert JobsChanged(("after",)) in got


def test_listener_resubscribes_after_redis_was_unreachable_for_a_while(
    make_bus: Callable[..., RedisStreamsBus], proxy: TcpProxy, redis_url: str
) -> None:
    announcer = make_bus()
    listening = make_bus(redis_url=via(proxy, redis_url))
    got: list[JobsChanged] = []
    listening.listen(got.append)
    announcer.announce(JobsChanged(("before",)))
    assert wait_until(lambda: JobsChanged(("before",)) in got)

    proxy.cut()  # every reconnect is refused now: the thread must back off and retry
    time.sleep(0.6)
    proxy.start()

    def heard_after() -> bool:
        announcer.announce(JobsChanged(("after",)))
        return JobsChanged(("after",)) in got

    assert wait_until(heard_after, timeout_s=10)


def test_consume_and_publish_recover_when_redis_comes_back(
    make_bus: Callable[..., RedisStreamsBus], proxy: TcpProxy, redis_url: str
) -> None:
    bus = make_bus(redis_url=via(proxy, redis_url))
    bus.publish(AdmitJob("one"))
    bus.ack(bus.consume(0.5))

    proxy.cut()
    with pytest.raises(BusUnavailable):
        bus.consume(0.1)
    with pytest.raises(BusUnavailable):
        bus.publish(AdmitJob("lost"))
    with pytest.raises(BusUnavailable):
        bus.ping()
    proxy.start()

    bus.ping()
    bus.publish(AdmitJob("two"))
    assert [d.message for d in bus.consume(0.5)] == [AdmitJob("two")]


def test_close_leaves_the_group_only_without_pending_entries(
    make_bus: Callable[..., RedisStreamsBus], admin: redis.Redis
) -> None:
    idle, busy = make_bus(consumer="idle"), make_bus(consumer="busy")
    idle.publish(AdmitJob("a"))
    idle.ack(idle.consume(0.5))
    busy.publish(AdmitJob("b"))
    assert busy.consume(0.5)  # never acked

    idle.close()
    busy.close()

    names = {c["name"] for c in admin.xinfo_consumers(idle.stream, idle.group)}
    assert names == {b"busy"}  # its entry stays claimable


def test_ping_succeeds_on_the_live_server(make_bus: Callable[..., RedisStreamsBus]) -> None:
    make_bus().ping()


def test_unreachable_redis_fails_fast_as_bus_unavailable() -> None:
    bus = RedisStreamsBus(CLOSED_PORT_URL)
    try:
        for call in (
            bus.ping,
            lambda: bus.publish(AdmitJob("x")),
            lambda: bus.consume(0.1),
        ):
            start = time.monotonic()
            with pytest.raises(BusUnavailable) as caught:
                call()
            assert time.monotonic() - start < 1.0
            assert isinstance(caught.value, BusError)
            assert isinstance(caught.value.__cause__, redis.ConnectionError)
    finally:
        bus.close()


def test_a_change_notice_is_dropped_with_a_log_line_when_redis_is_unreachable(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A notice has no delivery guarantee: the worker that announces a committed change
    must not fail (and retry its pass) because Redis is down."""
    bus = RedisStreamsBus(CLOSED_PORT_URL)
    try:
        start = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="lightpath.bus"):
            bus.announce(JobsChanged(("x",)))
            bus.announce(JobsChanged(("y",)))
        assert time.monotonic() - start < 2.0
        # said once for the outage, not once a notice
        assert [r.getMessage() for r in caplog.records] == ["change notices dropped"]
    finally:
        bus.close()


def test_a_refused_command_is_a_bus_error_but_not_unavailable(
    make_bus: Callable[..., RedisStreamsBus], admin: redis.Redis
) -> None:
    bus = make_bus()
    admin.set(bus.stream, "not a stream")  # WRONGTYPE for every stream command
    with pytest.raises(BusError) as caught:
        bus.publish(AdmitJob("x"))
    assert not isinstance(caught.value, BusUnavailable)
    assert isinstance(caught.value.__cause__, redis.ResponseError)


def test_a_redis_prefix_keeps_two_stacks_on_one_database_apart(
    redis_url: str, admin: redis.Redis, prefix: str
) -> None:
    """LIGHTPATH_REDIS_PREFIX names the stream and the notice channel (the lease too)."""
    mine = RedisStreamsBus(redis_url, prefix=f"{prefix}:a", claim_idle_ms=200)
    theirs = RedisStreamsBus(redis_url, prefix=f"{prefix}:b", claim_idle_ms=200)
    try:
        db = redis_url.rsplit("/", 1)[1]
        assert mine.stream == f"{prefix}:a:commands"
        assert mine.changes_channel == f"{prefix}:a:{db}:changes"
        heard: list[JobsChanged] = []
        theirs.listen(heard.append)
        mine_heard: list[JobsChanged] = []
        mine.listen(mine_heard.append)
        theirs.consume(0.01)  # creates their group
        mine.publish(AdmitJob("only-mine"))
        assert [d.message for d in consume_until(mine, 1)] == [AdmitJob("only-mine")]
        assert theirs.consume(0.2) == []
        assert wait_until(lambda: mine.announce(JobsChanged(("j",))) is None and bool(mine_heard))
        time.sleep(0.2)
        assert heard == [], "a notice crossed prefixes"
    finally:
        mine.close()
        theirs.close()


def test_a_malformed_redis_prefix_is_refused() -> None:
    from pydantic import ValidationError

    from app.settings import Settings

    assert Settings().redis_prefix == "lightpath"
    for bad in ("", "two words", "x" * 65):
        with pytest.raises(ValidationError):
            Settings(redis_prefix=bad)

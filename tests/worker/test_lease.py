"""Leader election against the real Redis: one holder, renewal, takeover, fencing tokens."""

from __future__ import annotations

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

from app.worker.lease import LeaderLoop, LocalLease, RedisLease

pytestmark = [pytest.mark.redis, pytest.mark.timeout(30)]

REPO = Path(__file__).resolve().parents[2]
TTL_S = 0.5


@pytest.fixture
def make_lease(redis_url: str, prefix: str) -> Iterator[Callable[..., RedisLease]]:
    """Leases on this test's key, closed at the end."""
    made: list[RedisLease] = []

    def make(holder: str, ttl_s: float = TTL_S) -> RedisLease:
        lease = RedisLease(redis_url, f"{prefix}:leader", holder=holder, ttl_s=ttl_s)
        made.append(lease)
        return lease

    yield make
    for lease in made:
        lease.close()


def wait_for(condition: Callable[[], bool], timeout_s: float) -> float | None:
    """Seconds until `condition` held, or None if it never did within `timeout_s`."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if condition():
            return time.monotonic() - start
        time.sleep(0.01)
    return None


def test_only_one_of_two_holders_acquires(make_lease: Callable[..., RedisLease]) -> None:
    a, b = make_lease("a"), make_lease("b")
    assert a.try_acquire()
    assert not b.try_acquire()
    assert a.is_held and not b.is_held
    assert isinstance(a.token, int)
    assert b.token is None
    assert not b.renew()  # never held: nothing to renew


def test_renewal_keeps_the_lease_past_its_ttl(make_lease: Callable[..., RedisLease]) -> None:
    a, b = make_lease("a"), make_lease("b")
    assert a.try_acquire()
    token = a.token
    end = time.monotonic() + 3 * TTL_S
    while time.monotonic() < end:
        assert a.renew()
        assert not b.try_acquire()
        time.sleep(TTL_S / 4)
    assert a.is_held
    assert a.token == token  # renewing is not a new acquisition


def test_standby_takes_over_after_the_ttl_when_the_holder_stops_renewing(
    make_lease: Callable[..., RedisLease],
) -> None:
    a, b = make_lease("a"), make_lease("b")
    assert a.try_acquire()
    first_token = a.token
    assert first_token is not None

    took_s = wait_for(b.try_acquire, timeout_s=5 * TTL_S)

    assert took_s is not None
    assert TTL_S * 0.5 < took_s < TTL_S * 4  # generous upper bound for a loaded machine
    assert b.is_held
    assert b.token is not None and b.token > first_token  # a stale leader is detectable
    assert not a.is_held  # its own clock already told it
    a.release()  # a stale holder's release must not drop the new holder's key
    assert b.renew()
    assert not a.renew()  # and Redis confirms it lost
    assert a.token is None
    assert not a.try_acquire()


def test_is_held_turns_false_by_itself_once_the_lease_may_have_expired(
    make_lease: Callable[..., RedisLease],
) -> None:
    a = make_lease("a")
    assert a.try_acquire()
    time.sleep(TTL_S * 1.1)
    assert not a.is_held
    assert a.token is None


def test_release_by_a_non_holder_is_a_no_op(
    make_lease: Callable[..., RedisLease], admin: redis.Redis, prefix: str
) -> None:
    a, b = make_lease("a", ttl_s=5.0), make_lease("b", ttl_s=5.0)
    assert a.try_acquire()
    b.release()
    assert admin.get(f"{prefix}:leader") == f"{a.token}:a".encode()
    assert a.renew()
    assert not b.try_acquire()

    a.release()
    assert not a.is_held
    assert admin.get(f"{prefix}:leader") is None
    assert b.try_acquire()  # at once, no ttl wait
    a.release()  # released already: nothing left to do
    assert b.renew()


def test_fencing_token_grows_with_every_acquisition(make_lease: Callable[..., RedisLease]) -> None:
    a, b = make_lease("a", ttl_s=5.0), make_lease("b", ttl_s=5.0)
    tokens = []
    for lease in (a, b, a, a, b):
        assert lease.try_acquire()
        tokens.append(lease.token)
        assert lease.try_acquire()  # while held: extended, same token
        assert lease.token == tokens[-1]
        lease.release()
    assert all(isinstance(t, int) for t in tokens)
    assert tokens == sorted(set(tokens))  # strictly increasing


def test_unreachable_redis_means_not_held() -> None:
    lease = RedisLease("redis://127.0.0.1:1/15", "lightpath-test:nowhere", ttl_s=TTL_S)
    start = time.monotonic()
    assert not lease.try_acquire()
    assert not lease.renew()
    lease.release()
    assert not lease.is_held
    assert time.monotonic() - start < 1.0


def test_local_lease_is_always_held() -> None:
    lease = LocalLease()
    assert lease.try_acquire() and lease.renew() and lease.is_held
    lease.release()
    assert lease.is_held and lease.token == 1


def test_leader_loops_never_lead_together_and_hand_over_on_stop(
    make_lease: Callable[..., RedisLease],
) -> None:
    elected: list[tuple[str, int | None]] = []
    first = LeaderLoop(make_lease("first"), on_elected=lambda t: elected.append(("first", t)))
    first.start()
    assert wait_for(first.is_leader, 2.0) is not None
    second = LeaderLoop(make_lease("second"), on_elected=lambda t: elected.append(("second", t)))
    second.start()
    try:
        end = time.monotonic() + 4 * TTL_S  # several ttls: the leader keeps renewing
        while time.monotonic() < end:
            assert not (first.is_leader() and second.is_leader())
            time.sleep(0.01)
        assert first.is_leader()
        assert [name for name, _ in elected] == ["first"]

        first.stop()  # releases: the standby needs one interval, not a ttl
        took_s = wait_for(second.is_leader, 2.0)
        assert took_s is not None and took_s < TTL_S
        assert not first.is_leader()
    finally:
        second.stop()
        first.stop()
    assert [name for name, _ in elected] == ["first", "second"]
    assert elected[1][1] is not None and elected[0][1] is not None
    assert elected[1][1] > elected[0][1]


def test_standby_takes_over_within_the_ttl_of_a_sigkilled_leader(
    make_lease: Callable[..., RedisLease], redis_url: str, prefix: str
) -> None:
    child_code = textwrap.dedent(
        f"""
        import time
        from app.worker.lease import LeaderLoop, RedisLease
        lease = RedisLease({redis_url!r}, {prefix + ":leader"!r}, holder="doomed", ttl_s={TTL_S})
        loop = LeaderLoop(lease, on_elected=lambda token: print(token, flush=True))
        loop.start()
        time.sleep(60)
        """
    )
    child = subprocess.Popen(
        [sys.executable, "-c", child_code], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    standby: LeaderLoop | None = None
    try:
        assert child.stdout is not None
        leader_token = int(child.stdout.readline())
        deposed = threading.Event()
        standby = LeaderLoop(make_lease("standby"), on_deposed=deposed.set)
        standby.start()
        time.sleep(3 * TTL_S)
        assert not standby.is_leader()  # the live leader keeps it

        child.send_signal(signal.SIGKILL)
        child.wait(timeout=5)
        took_s = wait_for(standby.is_leader, 5.0)

        # Bound: ttl after the leader's last renewal plus one standby interval (ttl/3);
        # the slack absorbs a loaded machine while staying far below "a few seconds".
        assert took_s is not None and took_s < 2.0
        token = standby.lease.token
        assert token is not None and token > leader_token
        assert not deposed.is_set()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=5)
        if standby is not None:
            standby.stop()


def test_a_holder_advances_its_token_past_one_the_database_saw(
    make_lease: Callable[..., RedisLease],
) -> None:
    """Redis lost the counter (restart, flush): the holder jumps past the fencing row."""
    a, b = make_lease("a"), make_lease("b")
    assert a.try_acquire()
    token = a.token
    assert token is not None
    assert b.advance_past(100) is None  # not the holder: nothing moves
    assert a.advance_past(100) == 101
    assert a.token == 101 and a.is_held
    assert a.renew()  # the lease key names the new token
    assert a.advance_past(50) == 102  # the counter only grows


def test_a_leader_elected_with_a_token_the_store_already_saw_takes_a_fresh_one(
    make_lease: Callable[..., RedisLease], redis_url: str, prefix: str
) -> None:
    """Redis restarted empty hands out token 1 again while the fencing row holds 1 (the
    deposed leader's, still inside its lease by its own clock): before, both passed
    the fence until that lease ran out. The new leader moves past the row first."""
    old = make_lease("old")
    assert old.try_acquire() and old.token == 1
    used = old.token  # the fencing row now holds it
    redis.Redis.from_url(redis_url).delete(f"{prefix}:leader", f"{prefix}:leader:token")
    elected: list[int | None] = []
    loop = LeaderLoop(make_lease("new"), on_elected=elected.append, used_token=lambda: used)
    loop.step()
    assert loop.is_leader() and elected == [2]  # not the 1 the deposed leader holds


def test_a_fresh_token_is_kept_and_an_unreadable_store_does_not_block_election(
    make_lease: Callable[..., RedisLease],
) -> None:
    elected: list[int | None] = []
    loop = LeaderLoop(make_lease("a"), on_elected=elected.append, used_token=lambda: 0)
    loop.step()
    assert elected == [1]

    def store_down() -> int | None:
        raise ConnectionError("database unreachable")

    other = make_lease("b")
    loop.lease.release()
    down = LeaderLoop(other, on_elected=elected.append, used_token=store_down)
    down.step()
    assert down.is_leader() and elected == [1, 2]


def test_an_unreachable_lease_store_is_reported_once_per_outage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A standby retries every ttl/3: an outage used to log a warning each time."""
    lease = RedisLease("redis://127.0.0.1:1/15", "unreachable:leader", holder="x", ttl_s=TTL_S)
    try:
        with caplog.at_level("DEBUG", logger="lightpath.lease"):
            assert not lease.try_acquire()
            assert not lease.try_acquire()
            assert not lease.try_acquire()
        warned = [r for r in caplog.records if r.levelname == "WARNING"]
        assert [r.getMessage() for r in warned] == ["lease store unreachable"]
        assert len([r for r in caplog.records if r.levelname == "DEBUG"]) == 2
    finally:
        lease.close()


def test_two_leaders_under_different_leases_do_not_leapfrog(
    make_lease: Callable[..., RedisLease], redis_url: str, prefix: str
) -> None:
    """Two workers on one database with different Redis prefixes (or URLs) both held a
    lease; each moved its token past the other's in turn (29 times in 52 s in a fault
    sweep), and both wrote decisions. The second time the row passes a token a lease
    advanced to, it stands by instead, and the other leads alone."""
    a = make_lease("a")
    b = RedisLease(redis_url, f"{prefix}:elsewhere", holder="b", ttl_s=TTL_S)
    try:
        assert a.try_acquire() and b.try_acquire()  # token 1 each, on separate counters
        assert b.advance_past(1) == 2  # a wrote first: the row holds 1
        assert a.advance_past(2) == 3  # b's write raised it to 2
        assert b.advance_past(3) is None  # past b's own advance: another leader
        assert not b.is_held and not b.try_acquire()  # it stands by
        assert a.is_held and a.renew()
    finally:
        b.close()

"""Leader election for the worker: only the holder of a lease drives the switches.

`RedisLease` is a key with a time to live whose value names the holder and a
fencing token. Acquiring is SET-if-absent, renewing and releasing are Lua
check-and-set scripts on that exact value, so a worker can only extend or drop
a lease it still holds. The token comes from INCR on a companion key on every
new acquisition, so it only grows: a deposed leader that wakes up late carries
a smaller token than the current one, and anything that records the token
with its writes (decision log, southbound commands) can refuse the stale one.

`is_held` is also bounded by local time: it turns False once the lease may have
expired in Redis (ttl since the last confirmed renewal was sent, less a drift
margin), even if no renewal ran, so a stalled leader stops acting before a
standby can take over.

`LocalLease` is the embedded single process's lease: always held.
`LeaderLoop` keeps a lease in a daemon thread: renew every ttl/3 while held,
step down on a failed renewal, try to acquire at the same pace while not.

Must not import the store, the engine or the API.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Protocol

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from app.bus.outage import OutageLog

log = logging.getLogger("lightpath.lease")

_CONNECT_TIMEOUT_S = 1.0
# the fencing row passing a token we advanced to within this window means another
# leader under another lease; the lease then stands by this long
LEAPFROG_WINDOW_S = 60.0
# Redis expires the key at most ttl after it received our command, and we start
# the clock before sending it; the margin covers clock-rate drift between hosts.
_DRIFT_FACTOR = 0.01
_DRIFT_FLOOR_S = 0.002

# KEYS[1] lease key, KEYS[2] token counter; ARGV[1] holder, ARGV[2] ttl in ms.
# Returns the new token, or nil when someone holds the lease.
_ACQUIRE = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  return nil
end
local token = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], token .. ':' .. ARGV[1], 'PX', ARGV[2])
return token
"""

# KEYS[1] lease key; ARGV[1] the value we set, ARGV[2] ttl in ms. 1 if extended.
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

# KEYS[1] lease key, KEYS[2] token counter; ARGV[1] the value we set, ARGV[2] holder,
# ARGV[3] ttl in ms, ARGV[4] a token the counter must pass. The new token, or nil when
# the lease is not ours.
_ADVANCE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return nil
end
local floor = tonumber(ARGV[4])
if tonumber(redis.call('GET', KEYS[2]) or '0') < floor then
  redis.call('SET', KEYS[2], floor)
end
local token = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], token .. ':' .. ARGV[2], 'PX', ARGV[3])
return token
"""

# KEYS[1] lease key; ARGV[1] the value we set. 1 if deleted.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


class Lease(Protocol):
    """What the worker needs from a lease; `LocalLease` and `RedisLease` both fit."""

    @property
    def is_held(self) -> bool: ...
    @property
    def token(self) -> int | None: ...
    @property
    def ttl_s(self) -> float: ...
    def holding(self) -> tuple[int, float] | None: ...
    def try_acquire(self) -> bool: ...
    def renew(self) -> bool: ...
    def release(self) -> None: ...


def default_holder_name() -> str:
    """Unique per process: host, pid and a random suffix (pids repeat across containers)."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class LocalLease:
    """The embedded single process leads alone: always held, token 1."""

    ttl_s = 5.0

    @property
    def is_held(self) -> bool:
        return True

    @property
    def token(self) -> int | None:
        return 1

    def holding(self) -> tuple[int, float] | None:
        return (1, math.inf)

    def try_acquire(self) -> bool:
        return True

    def renew(self) -> bool:
        return True

    def release(self) -> None:
        """Nothing to release: no one else could take it."""


class RedisLease:
    """A lease on a Redis key with a fencing token; one holder at a time across processes.

    Redis errors never escape: an unreachable Redis means "not held" (False from
    `try_acquire` and `renew`), which is the safe answer for a leader.
    """

    def __init__(
        self,
        redis_url: str,
        name: str = "lightpath:worker-leader",
        *,
        holder: str | None = None,
        ttl_s: float = 5.0,
    ) -> None:
        if ttl_s <= 0:
            raise ValueError("ttl_s must be positive")
        self.name = name
        self.holder = holder or default_holder_name()
        self.ttl_s = ttl_s
        self.token_key = f"{name}:token"
        # A command must not outlive the lease it is renewing: time out within a third
        # of the ttl (bounded to stay usable on a slow link), and do not retry.
        timeout_s = min(max(ttl_s / 3, 0.05), 2.0)
        self._redis = redis.Redis.from_url(
            redis_url,
            protocol=2,
            decode_responses=True,
            socket_timeout=timeout_s,
            socket_connect_timeout=min(timeout_s, _CONNECT_TIMEOUT_S),
            retry=Retry(NoBackoff(), 0),
            client_name=f"lightpath-lease:{self.holder}",
        )
        self._acquire = self._redis.register_script(_ACQUIRE)
        self._renew = self._redis.register_script(_RENEW)
        self._release = self._redis.register_script(_RELEASE)
        self._advance = self._redis.register_script(_ADVANCE)
        self._lock = threading.Lock()
        self._value: str | None = None  # what we wrote into the key, while it may be ours
        self._token: int | None = None
        self._valid_until = 0.0  # time.monotonic() after which the key may have expired
        self._outage = OutageLog(log, "lease store unreachable", "lease store reachable again")
        self._advanced: tuple[int, float] | None = None  # (token, when) of the last advance
        self._stand_by_until = 0.0  # another leader's lease was seen: no election till then

    @property
    def ttl_ms(self) -> int:
        return max(1, round(self.ttl_s * 1000))

    @property
    def is_held(self) -> bool:
        """True while we hold the lease and it cannot have expired yet."""
        with self._lock:
            return self._value is not None and time.monotonic() < self._valid_until

    @property
    def token(self) -> int | None:
        """The fencing token of the current holding; None while not held."""
        with self._lock:
            held = self._value is not None and time.monotonic() < self._valid_until
            return self._token if held else None

    def holding(self) -> tuple[int, float] | None:
        """(token, the `time.monotonic()` until which it holds) while held, else None.

        The monotonic clock is the host's, so another process (the fabric process) can
        stop acting on the token when we would, without asking.
        """
        with self._lock:
            if self._value is None or self._token is None:
                return None
            if time.monotonic() >= self._valid_until:
                return None
            return (self._token, self._valid_until)

    def try_acquire(self) -> bool:
        """Take the lease if it is free (a new, larger token); extend it if still ours."""
        with self._lock:
            if self._value is not None and self._extend_locked():
                return True
            sent_at = time.monotonic()
            if sent_at < self._stand_by_until:
                return False  # another leader's lease is live (`advance_past`)
            try:
                token = self._acquire(
                    keys=[self.name, self.token_key], args=[self.holder, self.ttl_ms]
                )
            except redis.RedisError as exc:
                self._outage.failed(exc, lease=self.name, action="acquire")
                return False
            self._outage.ok(lease=self.name)
            if token is None:
                return False
            self._token = int(token)
            self._value = f"{self._token}:{self.holder}"
            self._valid_until = sent_at + self._safe_ttl_s()
        log.info(
            "lease acquired", extra={"lease": self.name, "holder": self.holder, "token": token}
        )
        return True

    def renew(self) -> bool:
        """Extend the lease; False when lost (someone else took it) or Redis did not answer."""
        with self._lock:
            if self._value is None:
                return False
            return self._extend_locked()

    def advance_past(self, floor: int) -> int | None:
        """While we hold the lease, take a token above `floor` (a token the database saw).

        The counter can fall behind the tokens already used when Redis lost its
        data (a restart without persistence, a flush): a leader elected then
        would be refused by the fencing row forever. Holding the lease, we may
        move past any earlier holder. Returns the new token, None when not held.
        """
        with self._lock:
            if self._value is None or time.monotonic() >= self._valid_until:
                return None
            sent_at = time.monotonic()
            last = self._advanced
            if last is not None and floor >= last[0] and sent_at - last[1] < LEAPFROG_WINDOW_S:
                # the row passed the token we advanced to: another leader writes to the
                # database under another lease (another Redis, another prefix). Two such
                # leaders leapfrogged 29 times in 52 s, both writing decisions: stand by
                self._stand_by_until = sent_at + LEAPFROG_WINDOW_S
                conflict = True
            else:
                conflict = False
        if conflict:
            log.error(
                "another leader writes to this database under a different lease: standing "
                "by; give every worker of one database the same LIGHTPATH_REDIS_URL and "
                "LIGHTPATH_REDIS_PREFIX",
                extra={"lease": self.name, "floor": floor, "stand_by_s": LEAPFROG_WINDOW_S},
            )
            self.release()
            return None
        with self._lock:
            if self._value is None or time.monotonic() >= self._valid_until:
                return None
            sent_at = time.monotonic()
            try:
                token = self._advance(
                    keys=[self.name, self.token_key],
                    args=[self._value, self.holder, self.ttl_ms, floor],
                )
            except redis.RedisError as exc:
                log.warning("lease advance failed", extra={"lease": self.name, "error": str(exc)})
                return None
            if token is None:
                return None
            self._token = int(token)
            self._value = f"{self._token}:{self.holder}"
            self._valid_until = sent_at + self._safe_ttl_s()
            self._advanced = (self._token, sent_at)
        log.warning(
            "lease token was behind the database; advanced",
            extra={"lease": self.name, "token": token, "floor": floor},
        )
        return int(token)

    def release(self) -> None:
        """Give the lease up now, if it is still ours; a no-op otherwise."""
        with self._lock:
            value, self._value, self._token, self._valid_until = self._value, None, None, 0.0
            if value is None:
                return
            try:
                self._release(keys=[self.name], args=[value])
            except redis.RedisError as exc:
                # The key expires by itself within the ttl.
                log.warning("lease release failed", extra={"lease": self.name, "error": str(exc)})
        log.info("lease released", extra={"lease": self.name, "holder": self.holder})

    def close(self) -> None:
        """Release the lease and drop the connections."""
        self.release()
        self._redis.close()

    def _extend_locked(self) -> bool:
        assert self._value is not None
        sent_at = time.monotonic()
        try:
            extended = self._renew(keys=[self.name], args=[self._value, self.ttl_ms])
        except redis.RedisError as exc:
            # Unknown whether the key still exists: stop acting now (is_held turns False),
            # but keep our value so a later try_acquire can extend it with the same token
            # if nobody took over meanwhile.
            self._valid_until = 0.0
            self._outage.failed(exc, lease=self.name, action="renew")
            return False
        self._outage.ok(lease=self.name)
        if not extended:
            log.warning(
                "lease lost",
                extra={"lease": self.name, "holder": self.holder, "token": self._token},
            )
            self._value, self._token, self._valid_until = None, None, 0.0
            return False
        self._valid_until = sent_at + self._safe_ttl_s()
        return True

    def _safe_ttl_s(self) -> float:
        return self.ttl_s - (self.ttl_s * _DRIFT_FACTOR + _DRIFT_FLOOR_S)


class LeaderLoop:
    """Keeps a lease in a daemon thread; pass `is_leader` to `Worker.run`.

    Every ttl/3: renew while leading (step down when that fails), otherwise try
    to acquire. A standby therefore takes over at most ttl + ttl/3 after the
    leader's last renewal. `on_elected(token)` and `on_deposed()` run on the
    loop's thread; keep them short (set a flag, request a replan).
    """

    def __init__(
        self,
        lease: Lease,
        *,
        on_elected: Callable[[int | None], None] = lambda token: None,
        on_deposed: Callable[[], None] = lambda: None,
        interval_s: float | None = None,
        used_token: Callable[[], int | None] | None = None,
    ) -> None:
        self.lease = lease
        self.on_elected = on_elected
        self.on_deposed = on_deposed
        # the newest token the fenced store has seen (`Fence.stored_token`): a token handed
        # out again (Redis restarted empty, its counter reset) is not a new leader's
        self.used_token = used_token
        self.interval_s = interval_s if interval_s is not None else lease.ttl_s / 3
        self._leading = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def is_leader(self) -> bool:
        """True while this process holds the lease (bounded by the lease's own expiry)."""
        return self._leading and self.lease.is_held

    def step(self) -> None:
        """One round: renew or acquire, and report a change of role."""
        if self._leading:
            if not self.lease.renew():
                self._leading = False
                log.warning("stepping down: lease not renewed")
                self.on_deposed()
        elif self.lease.try_acquire():
            self._take_a_fresh_token()
            self._leading = True
            log.info("elected leader", extra={"token": self.lease.token})
            self.on_elected(self.lease.token)

    def _take_a_fresh_token(self) -> None:
        """Move past the newest token the store has seen before leading with ours.

        A Redis that restarted empty hands out token 1 again; if the store's fencing
        row holds 1, the deposed leader (still inside its lease by its own clock)
        and we would both pass the fence until its lease ran out. The fence moves
        a token that is below the row; an equal one only this check catches.
        """
        if self.used_token is None:
            return
        mine = self.lease.token
        try:
            used = self.used_token()
        except Exception as exc:  # the store is down: the fence refuses writes anyway
            log.warning("could not read the fencing token", extra={"error": str(exc)})
            return
        advance = getattr(self.lease, "advance_past", None)
        if mine is not None and used is not None and mine <= used and advance is not None:
            advance(used)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="leader-loop", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the loop and release the lease so a standby takes over at once."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval_s * 2 + 1)
        was_leading, self._leading = self._leading, False
        self.lease.release()
        if was_leading:
            self.on_deposed()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.step()
            self._stop.wait(self.interval_s)

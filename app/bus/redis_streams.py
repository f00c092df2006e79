"""The event bus on Redis: commands on a stream with a consumer group, change notices on pub/sub.

Same interface as `InProcessBus`, chosen when `LIGHTPATH_REDIS_URL` is set.

- Commands are delivered at least once. A consumed entry stays pending in the
  group until acknowledged; entries left pending by a consumer that died (idle
  longer than `claim_idle_ms`) are claimed with XAUTOCLAIM by the next
  `consume` of any consumer, its own included, so a pass that failed is retried.
- Acknowledged entries are deleted, so the stream holds only the backlog.
  MAXLEN trimming (approximate) is a guard against a worker that never comes
  back; it drops the oldest entries, which is safe only because commands are
  wake-ups and the database rows are the truth.
- An entry that cannot be decoded (a poison message) is logged and
  acknowledged at once so it never blocks the stream.
- Change notices (`JobsChanged`) use pub/sub: fire-and-forget, so a listener
  that misses one (during a reconnect) must re-read state on its own poll.

Serialisation goes through `messages.py` only. redis-py errors are translated
into `app.bus.errors` here. Must not import the store, the engine or the API.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    ReadOnlyError,
    ResponseError,
)
from redis.retry import Retry

from .errors import BusError, BusUnavailable
from .messages import Delivery, JobsChanged, Message, decode, encode
from .outage import OutageLog

log = logging.getLogger("lightpath.bus")

_FIELD = b"message"  # the one field of a stream entry: the encoded message
_READ_COUNT = 1000  # most new entries taken by one consume
_CLAIM_COUNT = 100  # most stale entries claimed by one consume
# One consume blocks at most this long; the socket timeout sits above it so a
# blocked XREADGROUP is never mistaken for a dead connection.
_MAX_BLOCK_S = 5.0
_SOCKET_TIMEOUT_S = _MAX_BLOCK_S + 5.0
_CONNECT_TIMEOUT_S = 2.0
_HEALTH_CHECK_S = 5  # PING a connection idle this long before reusing it
_LISTEN_POLL_S = 0.5  # how often the listener thread checks for close()
_SUBSCRIBE_WAIT_S = 2.0  # how long the first listen() waits for its subscription
_BACKOFF_MIN_S = 0.1
_BACKOFF_MAX_S = 5.0


@contextmanager
def _translated(action: str) -> Iterator[None]:
    """Turn redis-py errors into the bus family, chained."""
    try:
        yield
    except (AuthenticationError, AuthorizationError) as exc:
        # Subclasses of ConnectionError, but waiting will not fix a wrong password.
        raise BusError(f"{action}: redis refused the credentials: {exc}") from exc
    except (redis.ConnectionError, redis.TimeoutError, ReadOnlyError) as exc:
        raise BusUnavailable(f"{action}: redis unavailable: {exc}") from exc
    except redis.RedisError as exc:
        raise BusError(f"{action}: {exc}") from exc


def _is_missing_group(exc: ResponseError) -> bool:
    return str(exc).startswith("NOGROUP")


def _block_ms(timeout_s: float) -> int | None:
    """XREADGROUP's BLOCK argument; None reads without blocking (BLOCK 0 would wait forever)."""
    if timeout_s <= 0:
        return None
    return max(1, round(min(timeout_s, _MAX_BLOCK_S) * 1000))


def default_consumer_name() -> str:
    """Unique per process: host, pid and a random suffix (pids repeat across containers)."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class RedisStreamsBus:
    """Commands on a Redis stream read through a consumer group; notices on a pub/sub channel."""

    def __init__(
        self,
        redis_url: str,
        *,
        prefix: str = "lightpath",
        stream: str | None = None,
        group: str = "workers",
        consumer: str | None = None,
        changes_channel: str | None = None,
        claim_idle_ms: int = 10_000,
        maxlen: int = 1_000_000,
    ) -> None:
        # every key and channel is named under `prefix` (LIGHTPATH_REDIS_PREFIX), so
        # stacks with different prefixes can share one Redis database
        self.stream = stream or f"{prefix}:commands"
        self.group = group
        self.consumer = consumer or default_consumer_name()
        self.claim_idle_ms = claim_idle_ms
        self.maxlen = maxlen
        # Bytes in and out: a poison entry that is not UTF-8 must not fail the whole reply.
        # One quick retry reconnects a pooled connection that went stale (Redis restarted);
        # anything longer is the caller's back-off.
        self._redis = redis.Redis.from_url(
            redis_url,
            protocol=2,
            decode_responses=False,
            socket_timeout=_SOCKET_TIMEOUT_S,
            socket_connect_timeout=_CONNECT_TIMEOUT_S,
            health_check_interval=_HEALTH_CHECK_S,
            retry=Retry(NoBackoff(), 1),
            client_name=f"lightpath-bus:{self.consumer}",
        )
        # pub/sub channels are server-wide, not per database: name ours after the
        # database so two stacks on one Redis never hear each other's notices
        db = self._redis.connection_pool.connection_kwargs.get("db", 0)
        self.changes_channel = changes_channel or f"{prefix}:{db}:changes"
        self._claim_cursor: bytes | str = "0-0"
        self._has_consumed = False
        self._lock = threading.Lock()
        self._listeners: list[Callable[[JobsChanged], None]] = []
        self._listen_thread: threading.Thread | None = None
        self._subscribed = threading.Event()
        self._closing = threading.Event()
        self._notices = OutageLog(log, "change notices dropped", "change notices sent again")

    # -- commands -------------------------------------------------------------------

    def publish(self, message: Message) -> None:
        """Append a command to the stream (trimmed to about `maxlen` entries)."""
        with _translated("publish"):
            self._redis.xadd(
                self.stream, {_FIELD: encode(message)}, maxlen=self.maxlen, approximate=True
            )

    def consume(self, timeout_s: float) -> list[Delivery]:
        """Stale entries claimed from dead consumers, then new ones.

        Blocks up to `timeout_s` (at most 5 s) for new entries, and not at all when
        something was claimed. Creates the stream and the group when missing.
        """
        self._has_consumed = True
        with _translated("consume"):
            try:
                entries = self._claim_and_read(timeout_s)
            except ResponseError as exc:
                if not _is_missing_group(exc):
                    raise
                self._create_group()
                entries = self._claim_and_read(timeout_s)
            return self._to_deliveries(entries)

    def ack(self, deliveries: Sequence[Delivery]) -> None:
        """Acknowledge handled deliveries and delete their entries."""
        with _translated("ack"):
            self._ack_ids([d.id for d in deliveries])

    def _create_group(self) -> None:
        # From id 0: commands published before any worker started are still delivered.
        try:
            self._redis.xgroup_create(self.stream, self.group, id="0", mkstream=True)
            log.info("bus consumer group created", extra={"stream": self.stream})
        except ResponseError as exc:
            if not str(exc).startswith("BUSYGROUP"):  # another consumer was faster
                raise

    def _claim_and_read(self, timeout_s: float) -> list[tuple[Any, Any]]:
        # XAUTOCLAIM scans the pending list like SCAN: keep the cursor between calls so a
        # long pending list is worked through a slice per consume ("0-0" = scan complete).
        cursor, claimed, _deleted = self._redis.xautoclaim(
            self.stream,
            self.group,
            self.consumer,
            self.claim_idle_ms,
            start_id=self._claim_cursor,
            count=_CLAIM_COUNT,
        )
        self._claim_cursor = cursor
        entries: list[tuple[Any, Any]] = list(claimed)
        if entries:
            log.info(
                "bus claimed stale entries",
                extra={"count": len(entries), "consumer": self.consumer},
            )
        reply: Any = self._redis.xreadgroup(
            self.group,
            self.consumer,
            {self.stream: ">"},
            count=_READ_COUNT,
            block=None if entries else _block_ms(timeout_s),
        )
        for _stream, stream_entries in reply or ():
            entries.extend(stream_entries)
        return entries

    def _to_deliveries(self, entries: list[tuple[Any, Any]]) -> list[Delivery]:
        deliveries: list[Delivery] = []
        poison: list[str] = []
        for raw_id, fields in entries:
            if raw_id is None:  # an entry deleted while pending (Redis < 7 reports these)
                continue
            entry_id = raw_id.decode() if isinstance(raw_id, bytes) else str(raw_id)
            message = _decode_entry(fields)
            if message is None:
                log.warning(
                    "bus dropped an undecodable entry",
                    extra={"entry_id": entry_id, "stream": self.stream},
                )
                poison.append(entry_id)
            else:
                deliveries.append(Delivery(entry_id, message))
        self._ack_ids(poison)
        return deliveries

    def _ack_ids(self, ids: list[str]) -> None:
        if not ids:
            return
        pipe = self._redis.pipeline(transaction=True)
        pipe.xack(self.stream, self.group, *ids)
        pipe.xdel(self.stream, *ids)
        pipe.execute()

    # -- change notices -------------------------------------------------------------

    def announce(self, change: JobsChanged) -> None:
        """Tell every listener (in any process) which jobs changed; no delivery guarantee.

        A notice lost while Redis is unreachable is dropped with a log line, not
        raised: the changes it names are committed, and waiters re-read the
        database when their wait ends.
        """
        try:
            with _translated("announce"):
                self._redis.publish(self.changes_channel, encode(change))
        except BusUnavailable as exc:
            self._notices.failed(exc)
        else:
            self._notices.ok()

    def listen(self, listener: Callable[[JobsChanged], None]) -> None:
        """Call `listener` from a daemon thread for every notice on the changes channel.

        The first call starts the thread and waits up to 2 s for the subscription,
        so notices announced after it returns are seen; when Redis is down it
        returns anyway and the thread keeps reconnecting with back-off.
        """
        with self._lock:
            self._listeners.append(listener)
            if self._listen_thread is not None:
                return
            self._listen_thread = threading.Thread(
                target=self._listen_forever, name="bus-listen", daemon=True
            )
            self._listen_thread.start()
        self._subscribed.wait(_SUBSCRIBE_WAIT_S)

    def _listen_forever(self) -> None:
        backoff_s = _BACKOFF_MIN_S
        while not self._closing.is_set():
            pubsub = self._redis.pubsub()  # type: ignore[no-untyped-call]
            try:
                self._subscribe(pubsub)
                backoff_s = _BACKOFF_MIN_S
                while not self._closing.is_set():
                    item = pubsub.get_message(timeout=_LISTEN_POLL_S)
                    if item is not None and item["type"] == "message":
                        self._dispatch(item["data"])
            except redis.RedisError as exc:
                log.warning(
                    "bus listener lost redis; reconnecting",
                    extra={"error": str(exc), "backoff_s": backoff_s},
                )
                self._closing.wait(backoff_s)
                backoff_s = min(backoff_s * 2, _BACKOFF_MAX_S)
            finally:
                pubsub.close()

    def _subscribe(self, pubsub: Any) -> None:
        """Subscribe and wait for Redis to confirm, so no notice after this is missed."""
        pubsub.subscribe(self.changes_channel)
        while not self._closing.is_set():
            item = pubsub.get_message(timeout=_LISTEN_POLL_S)
            if item is not None and item["type"] == "subscribe":
                self._subscribed.set()
                return
            if item is not None and item["type"] == "message":
                self._dispatch(item["data"])

    def _dispatch(self, raw: bytes) -> None:
        try:
            change = decode(raw)
        except (ValueError, KeyError, TypeError, AttributeError):
            change = None
        if not isinstance(change, JobsChanged):
            log.warning("bus ignored an unreadable change notice", extra={"size": len(raw)})
            return
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener(change)
            except Exception:
                # One broken listener must not stop notices reaching the others.
                log.exception("bus listener raised", extra={"job_ids": change.job_ids})

    # -- lifecycle ------------------------------------------------------------------

    def ping(self) -> None:
        """Raise `BusUnavailable` unless Redis answers now."""
        with _translated("ping"):
            self._redis.ping()

    def close(self) -> None:
        """Stop the listener thread, leave the group if nothing is pending, drop connections."""
        if self._closing.is_set():
            return
        self._closing.set()
        thread = self._listen_thread
        if thread is not None:
            thread.join(timeout=_LISTEN_POLL_S * 4)
        if self._has_consumed:
            try:
                with _translated("close"):
                    self._forget_consumer()
            except BusError as exc:
                log.debug("bus could not leave the group", extra={"error": str(exc)})
        self._redis.close()

    def _forget_consumer(self) -> None:
        # Deleting a consumer drops its pending entries, so only an idle one is removed;
        # a consumer with pending entries stays for another to claim them.
        pending = self._redis.xpending_range(
            self.stream, self.group, min="-", max="+", count=1, consumername=self.consumer
        )
        if not pending:
            self._redis.xgroup_delconsumer(self.stream, self.group, self.consumer)


def _decode_entry(fields: Any) -> Message | None:
    """The entry's message, or None when the entry is not one of ours."""
    if not isinstance(fields, dict) or _FIELD not in fields:
        return None
    try:
        return decode(fields[_FIELD])
    except (ValueError, KeyError, TypeError, AttributeError):
        # ValueError covers bad JSON and bad UTF-8; the rest are wrong shapes or types.
        return None

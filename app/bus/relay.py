"""The outbox relay: moves recorded events from the database onto the bus."""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from app.logs import log_pass_failure
from app.store import Store

from .errors import BusUnavailable
from .messages import Message, from_outbox
from .outage import OutageLog

log = logging.getLogger("lightpath.relay")

# after a writer's own send fails (the bus is down), writers leave their events to the
# relay for this long instead of each waiting for the bus's timeouts
DIRECT_PAUSE_S = 5.0


class OutboxRelay:
    """Drains the outbox after every kick and at least every `interval_s`."""

    def __init__(
        self,
        store: Store,
        publish: Callable[[Message], None],
        interval_s: float = 1.0,
        ping: Callable[[], None] | None = None,
    ) -> None:
        self.store = store
        self.publish = publish
        # asked after an outage when there was nothing to send: "reachable again" was
        # logged (sent=0) while the bus was still down
        self.ping = ping
        self.interval_s = interval_s
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._drains = 0
        self._direct_paused_until = 0.0

    def publish_payload(self, payload: dict[str, Any]) -> None:
        """Send one outbox payload (the relay's own drain, or a writer sending its event)."""
        self.publish(from_outbox(payload))

    def direct_sender(self) -> Callable[[dict[str, Any]], None] | None:
        """A sender for a writer's own event after its commit, or None: leave it to the relay.

        None for `DIRECT_PAUSE_S` after such a send failed, so a bus outage costs
        one request its timeout, not every request.
        """
        if time.monotonic() < self._direct_paused_until:
            return None
        return self._send_direct

    def _send_direct(self, payload: dict[str, Any]) -> None:
        try:
            self.publish_payload(payload)
        except Exception:
            self._direct_paused_until = time.monotonic() + DIRECT_PAUSE_S
            raise

    def drain(self) -> int:
        total = 0
        while True:
            n = self.store.relay_outbox(self.publish_payload)
            total += n
            if n == 0:
                return total

    def kick(self) -> None:
        self._wake.set()

    def _run(self) -> None:
        outage = OutageLog(
            log,
            "event bus unavailable; events wait in the outbox",  # committed: nothing is lost
            "event bus reachable again; outbox relayed",
        )
        while not self._stop.is_set():
            self._wake.wait(self.interval_s)
            self._wake.clear()
            try:
                sent = self.drain()
                if outage.down and not sent and self.ping is not None:
                    self.ping()  # an empty outbox touched no bus: ask it
                outage.ok(sent=sent)
                self._drains += 1
                if self._drains % 600 == 0:
                    self.store.prune_outbox(dt.timedelta(hours=1))
            except BusUnavailable as exc:
                outage.failed(exc)
                self._stop.wait(1.0)
            except Exception as exc:
                log_pass_failure(log, "outbox relay pass", exc)
                self._stop.wait(1.0)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="outbox-relay", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

"""The embedded default's event bus: in-process queues, same interface as Redis Streams."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence

from .messages import Delivery, JobsChanged, Message


class InProcessBus:
    """Commands go to one consumer (the worker); change notices fan out to listeners."""

    def __init__(self) -> None:
        self._commands: queue.Queue[Message] = queue.Queue()
        self._listeners: list[Callable[[JobsChanged], None]] = []
        self._lock = threading.Lock()

    def publish(self, message: Message) -> None:
        self._commands.put(message)

    def consume(self, timeout_s: float) -> list[Delivery]:
        """Block up to `timeout_s` for a command, then drain what else is waiting."""
        try:
            first = self._commands.get(timeout=timeout_s)
        except queue.Empty:
            return []
        batch = [first]
        while True:
            try:
                batch.append(self._commands.get_nowait())
            except queue.Empty:
                return [Delivery(str(i), m) for i, m in enumerate(batch)]

    def ack(self, deliveries: Sequence[Delivery]) -> None:
        """Nothing to do: an in-process message is gone once taken (the tick re-reads state)."""

    def announce(self, change: JobsChanged) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            listener(change)

    def listen(self, listener: Callable[[JobsChanged], None]) -> None:
        with self._lock:
            self._listeners.append(listener)

    def ping(self) -> None:
        """Always reachable: it lives in this process."""

    def close(self) -> None:
        """Nothing to release."""

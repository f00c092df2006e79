"""Logging a dependency's outage once when it starts and once when it ends.

A loop that retries a call to Redis every second would otherwise log every
failure: an operator reading the log needs when it went away and when it came
back. Imports nothing but the standard library.
"""

from __future__ import annotations

import logging
from typing import Any


class OutageLog:
    """Says `down` (warning) at the first failure of an outage, `up` (warning) at the
    first success after it; the failures in between go to debug."""

    __slots__ = ("_log", "_down", "_up", "down")

    def __init__(self, log: logging.Logger, down: str, up: str) -> None:
        self._log = log
        self._down = down
        self._up = up
        self.down = False

    def failed(self, exc: BaseException, **extra: Any) -> None:
        level = logging.DEBUG if self.down else logging.WARNING
        self.down = True
        self._log.log(level, self._down, extra={**extra, "detail": str(exc)})

    def ok(self, **extra: Any) -> None:
        if self.down:
            self.down = False
            self._log.warning(self._up, extra=extra)


__all__ = ["OutageLog"]

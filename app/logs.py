"""Structured logs: one JSON object per line, with job id and decision seq when known.

Secrets never reach a log line: settings hold tokens as SecretStr, request
headers are not logged, and a URL's password (`scheme://user:password@host`, as
in LIGHTPATH_SOUTHBOUND_URL or LIGHTPATH_DATABASE_URL) is masked in every line,
whichever library wrote it.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy.exc import DisconnectionError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from app.store.fencing import Fenced

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


# the password of a URL's userinfo; the user name stays (it says which account)
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*):[^/\s@]*@")


def first_few(names: Sequence[str], n: int = 3) -> str:
    """The first `n` names for a message, then `...` when there are more."""
    return ", ".join(names[:n]) + (", ..." if len(names) > n else "")


def mask_url_passwords(text: str) -> str:
    """`http://ops:hunter2@oxc` -> `http://ops:***@oxc`."""
    return _URL_PASSWORD.sub(r"\g<head>:***@", text) if "@" in text else text


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return mask_url_passwords(json.dumps(entry, default=str))


def configure_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # httpx logs every southbound request at INFO (URL and all): hundreds a second
    for noisy in ("uvicorn.access", "alembic.runtime.plugins", "httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


# what a database that is down, restarting, locked or out of connections raises
_DATABASE_UNAVAILABLE = (OperationalError, PoolTimeout, DisconnectionError)


def log_pass_failure(
    log: logging.Logger, what: str, exc: BaseException, then: str = "retrying"
) -> None:
    """A background pass (`what`) failed and will be retried (`then` says how): one
    warning line naming the driver's message when the database is unavailable
    (expected during an outage, and its traceback would carry the statement and its
    parameters), else the error with its traceback."""
    if isinstance(exc, Fenced):
        # a deposed leader's refused write: expected after a takeover, not an error
        log.warning(f"{what} fenced: {exc}; {then}")
        return
    if isinstance(exc, _DATABASE_UNAVAILABLE):
        cause = str(getattr(exc, "orig", None) or exc).strip().splitlines()
        log.warning(
            f"{what} failed: the database is unavailable; {then}",
            extra={"error": (cause[0] if cause else type(exc).__name__)[:300]},
        )
    else:
        log.error(f"{what} failed; {then}", exc_info=exc)

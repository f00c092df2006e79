"""Log lines: a database outage is one warning per failed pass, not a traceback."""

from __future__ import annotations

import logging

import psycopg
import pytest
from sqlalchemy.exc import OperationalError

from app.logs import JsonFormatter, log_pass_failure


def test_a_database_outage_is_one_warning_and_anything_else_keeps_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A fault sweep found 45 error-level tracebacks in 35 s of database faults, each
    with the statement and its parameters."""
    log = logging.getLogger("lightpath.test")
    orig = psycopg.errors.LockNotAvailable("canceling statement due to lock timeout")
    down = OperationalError("UPDATE jobs SET body = %(body)s", {"body": "a job's body"}, orig)
    with caplog.at_level(logging.WARNING, logger="lightpath"):
        log_pass_failure(log, "worker pass", down, "retrying from the durable state")
        log_pass_failure(log, "fabric pass", ValueError("a bug"))
    outage, bug = caplog.records
    assert outage.levelno == logging.WARNING and outage.exc_info is None
    line = JsonFormatter().format(outage)
    assert "canceling statement due to lock timeout" in line
    assert "UPDATE jobs" not in line and "a job's body" not in line
    assert outage.getMessage() == (
        "worker pass failed: the database is unavailable; retrying from the durable state"
    )
    assert bug.levelno == logging.ERROR and bug.exc_info is not None
    assert "ValueError: a bug" in JsonFormatter().format(bug)


def test_a_deposed_leaders_refused_write_is_a_warning_without_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A fault sweep found every takeover logged at error with a full traceback: a
    fenced write is the fence working, expected once another leader took over."""
    from app.store.fencing import Fenced

    log = logging.getLogger("lightpath.test")
    with caplog.at_level(logging.INFO, logger="lightpath.test"):
        log_pass_failure(log, "fabric pass", Fenced("the fencing row holds 7 (ours 3)"))
    (record,) = caplog.records
    assert record.levelno == logging.WARNING and record.exc_info is None
    assert "fencing row holds 7" in record.getMessage()

"""RFC 9457 problem details: the one place that turns errors into HTTP responses.

Routes raise `Problem`; validation errors, unknown routes and anything
unexpected are converted here, so every 4xx/5xx body is
`application/problem+json` with `type`, `title`, `status`, `detail` (and
`errors`, the offending fields, for validation problems).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import InternalError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

log = logging.getLogger("lightpath.api")

PROBLEM_JSON = "application/problem+json"
TYPE_BASE = "https://lightpath.dev/problems/"


class Problem(Exception):
    """An error the client can act on, carried to the problem+json handler."""

    def __init__(
        self,
        status: int,
        title: str,
        detail: str,
        *,
        kind: str | None = None,
        extra: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.title = title
        self.detail = detail
        self.kind = kind or title.lower().replace(" ", "-")
        self.extra = extra or {}
        self.headers = headers


def problem_response(
    status: int,
    title: str,
    detail: str,
    *,
    kind: str | None = None,
    extra: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body: dict[str, Any] = {
        "type": TYPE_BASE + (kind or title.lower().replace(" ", "-")),
        "title": title,
        "status": status,
        "detail": detail,
    }
    body.update(extra or {})
    return JSONResponse(body, status_code=status, media_type=PROBLEM_JSON, headers=headers)


_ABOVE_MAXIMUM = {"less_than_equal", "less_than"}
BODY_UNPARSABLE = "There was an error parsing the body"  # fastapi.routing's 400 detail


def _field_errors(exc: RequestValidationError) -> list[dict[str, Any]]:
    fields = []
    for err in exc.errors():
        loc = [str(part) for part in err.get("loc", ())]
        fields.append(
            {"field": ".".join(loc), "message": err.get("msg", ""), "type": err.get("type")}
        )
    return fields


async def _on_problem(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, Problem)
    return problem_response(
        exc.status, exc.title, exc.detail, kind=exc.kind, extra=exc.extra, headers=exc.headers
    )


async def _on_validation(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = _field_errors(exc)
    if any(e["type"] == "json_invalid" for e in errors):
        return problem_response(
            400,
            "Malformed JSON",
            "the request body is not valid JSON",
            kind="malformed-json",
            extra={"errors": errors},
        )
    detail = "; ".join(f"{e['field']}: {e['message']}" for e in errors[:5])
    if all(e["type"] in _ABOVE_MAXIMUM for e in errors):
        # well-formed numbers past what any real job states (e.g. "parameters": 1e308)
        return problem_response(
            422, "Numbers out of range", detail, kind="out-of-range", extra={"errors": errors}
        )
    return problem_response(
        422, "Invalid request", detail, kind="validation", extra={"errors": errors}
    )


def _allowed_methods(request: Request) -> str | None:
    """Every method some route serves at the request's path (Starlette's 405 names
    only the first route's: `PUT /v1/jobs/x` said `Allow: GET`, not GET, DELETE)."""
    routes = request.app.router.routes
    methods = {
        m
        for m in _METHODS
        if any(r.matches({**request.scope, "method": m})[0] == Match.FULL for r in routes)
    }
    if "GET" in methods:
        methods.add("HEAD")  # served by the HEAD middleware
    return ", ".join(sorted(methods)) or None


_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")


async def _on_http(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 400 and exc.detail == BODY_UNPARSABLE:
        # FastAPI's answer to a body json.loads cannot read at all (bytes that are not
        # UTF-8, nesting deeper than the parser goes): malformed JSON like any other
        return problem_response(
            400,
            "Malformed JSON",
            "the request body is not valid JSON (not UTF-8 text, nested too deeply, or an integer"
            " of more than 4,300 digits)",
            kind="malformed-json",
        )
    titles = {404: "Not found", 405: "Method not allowed", 401: "Unauthorized"}
    headers = dict(getattr(exc, "headers", None) or {})
    if exc.status_code == 405 and (allow := _allowed_methods(request)):
        headers["Allow"] = allow
    return problem_response(
        exc.status_code,
        titles.get(exc.status_code, "HTTP error"),
        str(exc.detail),
        headers=headers or None,
    )


RETRY_AFTER_S = "1"


async def _on_database_busy(request: Request, exc: Exception) -> JSONResponse:
    """No pooled connection within the pool timeout, a lock not granted in time, the
    database unreachable or read-only: the request did nothing; the client retries
    shortly."""
    log.warning(
        "database busy or unreachable",
        extra={"path": request.url.path, "error": type(exc).__name__},
    )
    return problem_response(
        503,
        "Service unavailable",
        "the database is busy or unreachable; retry after the Retry-After seconds",
        kind="unavailable",
        headers={"Retry-After": RETRY_AFTER_S},
    )


def _transaction_refused(exc: BaseException) -> bool:
    """The database refused the transaction as such, whatever it held: SQLSTATE class
    25, chiefly 25006 read-only (a PostgreSQL failover leaves a standby, or an
    operator sets `default_transaction_read_only`); nothing was written."""
    return str(getattr(getattr(exc, "orig", None), "sqlstate", None) or "").startswith("25")


async def _on_database_internal(request: Request, exc: Exception) -> JSONResponse:
    if _transaction_refused(exc):
        return await _on_database_busy(request, exc)
    return await _on_unexpected(request, exc)


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error", extra={"path": request.url.path})
    return problem_response(
        500,
        "Internal error",
        "the server failed to handle this request; it was logged",
        kind="internal",
    )


def install_problem_handlers(app: FastAPI) -> None:
    app.add_exception_handler(Problem, _on_problem)
    app.add_exception_handler(RequestValidationError, _on_validation)
    app.add_exception_handler(StarletteHTTPException, _on_http)
    app.add_exception_handler(PoolTimeout, _on_database_busy)
    app.add_exception_handler(OperationalError, _on_database_busy)
    app.add_exception_handler(InternalError, _on_database_internal)
    app.add_exception_handler(Exception, _on_unexpected)

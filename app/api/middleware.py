"""ASGI middleware: request body limit, request latency metrics, cached job views, HEAD."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .bodies import BODY_METHODS, is_json
from .deps import Services, admits, forbidden_detail, required_scopes, scope_of
from .metrics import ApiMetrics
from .problems import problem_response


class _TooLarge(Exception):
    pass


class BodyLimit:
    """Refuse request bodies over `max_bytes` with 413, declared or streamed."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        seen = 0
        too_large = False
        answered = False

        async def limited_receive() -> Message:
            nonlocal seen, too_large
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    too_large = True
                    raise _TooLarge
            return message

        async def guarded_send(message: Message) -> None:
            # the app may swallow _TooLarge and answer 400; answer 413 instead
            nonlocal answered
            if too_large:
                if message["type"] == "http.response.start" and not answered:
                    answered = True
                    await self._refuse(scope, receive, send)
                return
            answered = answered or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except _TooLarge:
            if not answered:
                await self._refuse(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = problem_response(
            413,
            "Request too large",
            f"the request body exceeds {self.max_bytes} bytes (LIGHTPATH_MAX_BODY_BYTES)",
            kind="too-large",
        )
        await response(scope, receive, send)


class TokenFirst:
    """401 for a `/v1` request without a valid token, 403 for one whose scope the route
    does not admit, before its body is looked at.

    Every `/v1` route needs a token when tokens are configured. Checked here first, so
    a caller without one (or with a telemetry token on a launcher route) learns only
    that: not whether its body was too large, not JSON, or malformed. The route's own
    check (`deps.require`) still runs; the scopes are read from it.
    """

    def __init__(self, app: ASGIApp, services: Services, routes: Sequence[Any] = ()) -> None:
        self.app = app
        self.services = services
        # (path regex, methods, scopes) of every route that requires a scope
        self.scoped = [
            (r.path_regex, r.methods or set(), found)
            for r in routes
            if (found := required_scopes(r)) is not None
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1/"):
            tokens = self.services.token_scopes()
            if tokens:
                header = dict(scope.get("headers") or ()).get(b"authorization", b"")
                caller = scope_of(header.decode("latin-1"), tokens)
                if caller is None:
                    response = problem_response(
                        401,
                        "Unauthorized",
                        "a valid bearer token is required",
                        headers={"WWW-Authenticate": "Bearer"},
                    )
                    await response(scope, receive, send)
                    return
                needed = self._route_scopes(scope["method"], scope["path"])
                if needed is not None and not admits(caller, needed):
                    response = problem_response(403, "Forbidden", forbidden_detail(caller, needed))
                    await response(scope, receive, send)
                    return
        await self.app(scope, receive, send)

    def _route_scopes(self, method: str, path: str) -> tuple[str, ...] | None:
        """The scopes the route this request reaches admits (None: no such route, or
        one without `require`: the app answers as it would)."""
        for regex, methods, scopes in self.scoped:
            if method in methods and regex.match(path):
                return scopes
        return None


class JsonBodies:
    """Refuse a request body that is not declared JSON with 415, before any route reads it.

    Every body the API takes is JSON; without this a form-encoded body (what
    `curl -d` sends) reached validation and came back as a puzzling 422.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"].lower() in BODY_METHODS:
            headers = dict(scope.get("headers") or ())
            length = headers.get(b"content-length", b"")
            sent = (length.isdigit() and int(length) > 0) or b"transfer-encoding" in headers
            kind = headers.get(b"content-type")
            declared = kind.decode("latin-1") if kind is not None else None
            coding = headers.get(b"content-encoding", b"identity").decode("latin-1")
            why = None
            if sent and not is_json(declared):
                why = (
                    "request bodies are JSON: send them with Content-Type: application/json"
                    f" (this one came as {declared or 'no Content-Type'})"
                )
            elif sent and coding.strip().lower() not in ("", "identity"):
                # the body is read as it comes: a gzip body would be a puzzling 400, and
                # an uncompressed one labelled gzip was taken as if the label were not there
                why = (
                    f"request bodies are not decoded: send them with no Content-Encoding ({coding})"
                )
            if why is not None:
                response = problem_response(
                    415, "Unsupported media type", why, kind="unsupported-media-type"
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class HeadAsGet:
    """HEAD answers as GET would, without the body (RFC 9110 section 9.3.2: a server
    that answers GET answers HEAD). The GET routes and the cached job views serve it;
    the headers, Content-Length included, are GET's."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def headers_only(message: Message) -> None:
            if message["type"] == "http.response.body":
                if message.get("more_body", False):
                    return
                message = {"type": "http.response.body", "body": b"", "more_body": False}
            await send(message)

        await self.app(dict(scope, method="GET"), receive, headers_only)


class RequestTiming:
    """Observe each request's latency under its route template (not its raw path)."""

    def __init__(self, app: ASGIApp, metrics: ApiMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status: dict[str, Any] = {"code": 500}

        async def capture(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, capture)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", "unmatched")
            self.metrics.request_seconds.labels(
                scope.get("method", "?"), template, str(status["code"])
            ).observe(time.perf_counter() - start)


class _Route:
    """What RequestTiming reads of a matched route: its template."""

    def __init__(self, path: str) -> None:
        self.path = path


_JOB_ROUTE = _Route("/v1/jobs/{job_id}")
_JOB_PREFIX = "/v1/jobs/"
_JSON_HEADERS = [(b"content-type", b"application/json")]


class CachedJobViews:
    """`GET /v1/jobs/{job_id}` (no query) from the read cache, before FastAPI's routing.

    Launchers poll their jobs; on a cache hit the answer is bytes already rendered,
    and most of a request's cost was routing and dependency solving. Served here
    only to a caller the route itself admits (no tokens configured, or a launcher or
    operator token) and only on a hit; anything else goes through the route, which
    answers it (misses, long polls, 401/403/404/422) exactly as before.
    """

    def __init__(self, app: ASGIApp, services: Services) -> None:
        self.app = app
        self.services = services

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["method"] == "GET"
            and not scope.get("query_string")
            and scope["path"].startswith(_JOB_PREFIX)
        ):
            job_id = scope["path"][len(_JOB_PREFIX) :]
            view = self.services.read_cache.get(job_id) if "/" not in job_id else None
            if view is not None and self._admits(scope):
                scope["route"] = _JOB_ROUTE
                await send(
                    {
                        "type": "http.response.start",
                        "status": 200,
                        "headers": [*_JSON_HEADERS, (b"content-length", str(len(view)).encode())],
                    }
                )
                await send({"type": "http.response.body", "body": view})
                return
        await self.app(scope, receive, send)

    def _admits(self, scope: Scope) -> bool:
        tokens = self.services.token_scopes()
        if not tokens:
            return True
        header = b""
        for name, value in scope.get("headers") or ():
            if name == b"authorization":
                header = value
                break
        caller = scope_of(header.decode("latin-1"), tokens)
        return caller is not None and admits(caller, ("launcher",))  # as get_job's route

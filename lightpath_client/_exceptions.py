"""What the Lightpath client raises: one hierarchy, rooted at `LightpathError`.

LightpathError
├── InvalidJobId            not a job id the API can address (checked before sending)
├── TransportError          the server could not be reached (after retries)
├── WaitTimeout             a wait reached its deadline before the state
└── ProblemError            the server answered 4xx/5xx (RFC 9457 problem+json)
    ├── BadRequest          400 (malformed JSON)
    ├── Unauthorized        401
    ├── Forbidden           403 (wrong scope, or another launcher's job)
    ├── NotFound            404
    ├── Conflict            409 (id in use with another body; job already ended)
    ├── PayloadTooLarge     413
    ├── ValidationFailed    422 (invalid body, never fits, out of memory)
    └── ServerError         5xx
        └── ServiceUnavailable  503 (after retries)
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BadRequest",
    "Conflict",
    "Forbidden",
    "InvalidJobId",
    "LightpathError",
    "NotFound",
    "PayloadTooLarge",
    "ProblemError",
    "ServerError",
    "ServiceUnavailable",
    "TransportError",
    "Unauthorized",
    "ValidationFailed",
    "WaitTimeout",
    "problem_from_response",
]


class LightpathError(Exception):
    """Base class of every error the client raises."""


class InvalidJobId(LightpathError, ValueError):
    """A job id the API's pattern does not admit (empty, `.`, a space, a `/`...):
    refused before any request, since no route could address it."""


class TransportError(LightpathError):
    """No answer from the server (connection refused, reset, timed out) after every retry."""


class UnexpectedAnswer(LightpathError):
    """A success status whose body is not what the API answers (not JSON, or another
    shape): the URL is likely not a Lightpath server."""


class WaitTimeout(LightpathError):
    """A long-poll loop reached its deadline; `job` is the last state seen."""

    def __init__(self, message: str, job: Any = None) -> None:
        super().__init__(message)
        self.job = job


class ProblemError(LightpathError):
    """An RFC 9457 problem the server answered with; its fields are attributes."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        self.status = status
        self.body = body
        self.type: str = str(body.get("type", "about:blank"))
        self.title: str = str(body.get("title", ""))
        self.detail: str = str(body.get("detail", ""))
        self.errors: list[dict[str, Any]] = list(body.get("errors") or [])
        super().__init__(f"{status} {self.title}: {self.detail}")

    @property
    def kind(self) -> str:
        """The last segment of `type`, e.g. `never-fits`, `job-state`, `not-owner`."""
        return self.type.rstrip("/").rsplit("/", 1)[-1]


class BadRequest(ProblemError):
    pass


class Unauthorized(ProblemError):
    pass


class Forbidden(ProblemError):
    pass


class NotFound(ProblemError):
    pass


class Conflict(ProblemError):
    pass


class PayloadTooLarge(ProblemError):
    pass


class ValidationFailed(ProblemError):
    pass


class ServerError(ProblemError):
    pass


class ServiceUnavailable(ServerError):
    pass


_BY_STATUS: dict[int, type[ProblemError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    422: ValidationFailed,
    503: ServiceUnavailable,
}


def problem_from_response(status: int, body: Any, text: str = "") -> ProblemError:
    """The typed exception for an error answer (a non-JSON body becomes `detail`)."""
    if not isinstance(body, dict):
        # not problem+json (a proxy's or another server's page): its first line, short
        first = " ".join(text.split())[:200]
        body = {"title": "HTTP error", "detail": first, "status": status}
    cls = _BY_STATUS.get(status) or (ServerError if status >= 500 else ProblemError)
    return cls(status, body)

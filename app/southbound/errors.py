"""The southbound exception family: everything a switch or the way to it can do wrong.

Nothing outside `app.southbound` needs to know about sockets, HTTP status codes
or the mock switch: drivers translate their low-level errors into these at the
boundary (`raise SwitchUnreachable(...) from exc`). Imports nothing but the
standard library.

Hierarchy::

    SouthboundError
    ├── TransientError                  retrying the same command later may succeed
    │   ├── SwitchUnreachable
    │   ├── SwitchTimeout
    │   └── SwitchFault
    └── TerminalError                   retrying the same command cannot succeed
        ├── CommandRefused
        │   ├── PortBusy
        │   ├── PortFailed
        │   ├── PortOutOfRange
        │   ├── NotConnected
        │   └── RequestIdReused
        ├── StaleToken
        ├── UnknownSwitch
        ├── SwitchUnauthorized
        └── SwitchProtocolError

Every class carries a stable `code` (the suffix of the problem+json `type` the
mock switch answers with) and `is_transient`, so a caller can decide between
"back off and retry" and "re-plan" without an `isinstance` ladder.
"""

from __future__ import annotations

PROBLEM_TYPE_PREFIX = "urn:lightpath:southbound:"


class SouthboundError(Exception):
    """Base class: a switch command or read did not succeed."""

    code = "southbound-error"
    is_transient = False

    def __init__(
        self, detail: str, *, oxc_id: str | None = None, ports: tuple[int, ...] = ()
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.oxc_id = oxc_id
        self.ports = ports

    @property
    def problem_type(self) -> str:
        return PROBLEM_TYPE_PREFIX + self.code


class TransientError(SouthboundError):
    """A retry of the same command (same request_id) after a back-off may succeed."""

    code = "transient"
    is_transient = True


class SwitchUnreachable(TransientError):
    """No connection to the switch's management interface (refused, reset, DNS)."""

    code = "switch-unreachable"


class SwitchTimeout(TransientError):
    """No answer in time; the command may or may not have been applied (retry it by id)."""

    code = "switch-timeout"


class SwitchFault(TransientError):
    """The switch answered that it could not execute the command now; nothing was applied."""

    code = "switch-fault"


class TerminalError(SouthboundError):
    """Retrying the same command cannot succeed; the caller must re-read or re-plan."""

    code = "terminal"


class CommandRefused(TerminalError):
    """The switch refused the command as invalid for its state; nothing was applied."""

    code = "command-refused"


class PortBusy(CommandRefused):
    """A connect names a port that already belongs to a cross-connect (or is named twice)."""

    code = "port-busy"


class PortFailed(CommandRefused):
    """A connect names a port marked failed (loss of light)."""

    code = "port-failed"


class PortOutOfRange(CommandRefused):
    """A port number is outside the switch's 0..ports-1."""

    code = "port-out-of-range"


class NotConnected(CommandRefused):
    """A disconnect names a port pair that is not a cross-connect on the switch."""

    code = "not-connected"


class RequestIdReused(CommandRefused):
    """A request_id already used for a different command."""

    code = "request-id-reused"


class StaleToken(TerminalError):
    """The command carries a fencing token older than the newest the switch has seen.

    A newer leader has spoken to this switch: the sender was deposed and must
    stop driving the switches (no retry, no re-plan). Nothing was applied.
    """

    code = "stale-token"


class UnknownSwitch(TerminalError):
    """No OXC with that id behind this driver."""

    code = "unknown-switch"


class SwitchUnauthorized(TerminalError):
    """The switch refused our credentials (HTTP 401/403): LIGHTPATH_SOUTHBOUND_TOKEN
    is missing or not the one the switches expect. No retry can succeed."""

    code = "unauthorized"


class SwitchProtocolError(TerminalError):
    """The switch answered something the driver cannot read (a bug on one side)."""

    code = "protocol-error"


def _all_subclasses(cls: type[SouthboundError]) -> list[type[SouthboundError]]:
    found: list[type[SouthboundError]] = [cls]
    for sub in cls.__subclasses__():
        found.extend(_all_subclasses(sub))
    return found


ERRORS_BY_CODE: dict[str, type[SouthboundError]] = {
    cls.code: cls for cls in _all_subclasses(SouthboundError)
}


def error_class_for_problem_type(problem_type: str) -> type[SouthboundError] | None:
    """The error class a problem+json `type` names, or None when it names none of ours."""
    if not problem_type.startswith(PROBLEM_TYPE_PREFIX):
        return None
    return ERRORS_BY_CODE.get(problem_type[len(PROBLEM_TYPE_PREFIX) :])

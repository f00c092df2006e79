"""The southbound driver interface and its two implementations.

`SouthboundDriver` is the one seam between the worker and the switches: apply a
bulk cross-connect change, read back what a switch holds, close. Applies and
reads carry the sender's fencing token (the worker lease's); a switch refuses a
token older than the newest it has seen with `StaleToken`. The engine
never sees it; a real switch driver (Polatis TL1/NETCONF, Calient REST) is a
third class with these three methods and touches nothing else.

- `InProcessDriver` drives `OpticalSwitch` models in this process
  (`lightpath serve`, tests).
- `HttpDriver` drives the `mock-oxc` service over HTTP with httpx. Its base URL
  is a constructor argument (the CLI passes `settings.southbound_url`); nothing
  here reads the environment. Every httpx error and every problem+json answer
  is translated into the `app.southbound.errors` family with `raise ... from exc`.

Must not import FastAPI, SQLAlchemy or Redis.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, Self, runtime_checkable
from urllib.parse import quote

if TYPE_CHECKING:  # imported by HttpDriver itself: a process without one never loads httpx
    import httpx

from ..engine.cluster import Cluster
from .errors import (
    CommandRefused,
    SouthboundError,
    SwitchFault,
    SwitchProtocolError,
    SwitchTimeout,
    SwitchUnauthorized,
    SwitchUnreachable,
    UnknownSwitch,
    error_class_for_problem_type,
)
from .state import ConfirmedState
from .switch import OpticalSwitch, switches_for_cluster


@runtime_checkable
class SouthboundDriver(Protocol):
    """Apply cross-connect changes to OXCs and read back what they hold."""

    def apply(
        self,
        oxc_id: str,
        connect: Sequence[tuple[int, int]],
        disconnect: Sequence[tuple[int, int]],
        request_id: str,
        *,
        token: int | None = None,
    ) -> None:
        """Disconnect then connect on `oxc_id`, all or nothing, visible on return.

        Idempotent by `request_id`: repeating a call with the same id and the
        same pairs has no further effect (retry after `SwitchTimeout` this way).
        `token`: the sender's fencing token; `StaleToken` when the switch has
        seen a newer one (the sender was deposed: stop). Raises
        `TransientError` (retry) or `TerminalError` (re-read, re-plan).
        """
        ...

    def read(self, oxc_id: str, *, token: int | None = None) -> ConfirmedState:
        """The cross-connects and failed ports `oxc_id` reports now (fenced like `apply`)."""
        ...

    def close(self) -> None:
        """Release connections; the driver is unusable afterwards."""
        ...


class InProcessDriver:
    """Drives in-memory switch models in this process (embedded mode, tests)."""

    def __init__(self, switches: Mapping[str, OpticalSwitch]) -> None:
        self._switches = dict(switches)

    @classmethod
    def for_cluster(
        cls,
        cluster: Cluster,
        *,
        reconfig_ms: float | None = None,
        fault_rate: float = 0.0,
        seed: int = 0,
        on_reconfiguration: Callable[[str, float], None] | None = None,
    ) -> InProcessDriver:
        """One switch model per OXC of `cluster` (`reconfig_ms=None`: each OXC's own).

        `on_reconfiguration(oxc_id, seconds)` lets the host count reconfigurations.
        """
        switches = switches_for_cluster(
            cluster,
            reconfig_ms=reconfig_ms,
            fault_rate=fault_rate,
            seed=seed,
            on_reconfiguration=on_reconfiguration,
        )
        return cls(switches)

    @property
    def switches(self) -> Mapping[str, OpticalSwitch]:
        """The models, for operators and tests (fail a port, inspect without faults)."""
        return self._switches

    def apply(
        self,
        oxc_id: str,
        connect: Sequence[tuple[int, int]],
        disconnect: Sequence[tuple[int, int]],
        request_id: str,
        *,
        token: int | None = None,
    ) -> None:
        self._switch(oxc_id).apply(connect, disconnect, request_id, token=token)

    def read(self, oxc_id: str, *, token: int | None = None) -> ConfirmedState:
        return self._switch(oxc_id).read(token=token)

    def list_oxcs(self) -> list[str]:
        """The OXC ids this driver reaches."""
        return list(self._switches)

    def close(self) -> None:
        """Nothing to release."""

    def _switch(self, oxc_id: str) -> OpticalSwitch:
        try:
            return self._switches[oxc_id]
        except KeyError:
            raise UnknownSwitch(f"no OXC {oxc_id!r}", oxc_id=oxc_id) from None


# Status codes a problem+json answer may carry without a `type` we know.
_ERROR_FOR_STATUS: dict[int, type[SouthboundError]] = {
    400: CommandRefused,
    401: SwitchUnauthorized,
    403: SwitchUnauthorized,
    404: UnknownSwitch,
    409: CommandRefused,
    422: CommandRefused,
    502: SwitchUnreachable,
    503: SwitchFault,
    504: SwitchTimeout,
}


class HttpDriver:
    """Drives the `lightpath mock-oxc` service (or anything speaking its HTTP API)."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 5.0,
        transport: httpx.BaseTransport | None = None,
        token: str | None = None,
    ) -> None:
        # timeout_s must exceed the slowest bulk reconfiguration (Calient: up to
        # 500 ms), or every large change ends as SwitchTimeout and a retry.
        import httpx

        self._httpx = httpx
        headers = {"Authorization": f"Bearer {token}"} if token else None
        self._client = httpx.Client(
            base_url=base_url.rstrip("/"), timeout=timeout_s, transport=transport, headers=headers
        )

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def apply(
        self,
        oxc_id: str,
        connect: Sequence[tuple[int, int]],
        disconnect: Sequence[tuple[int, int]],
        request_id: str,
        *,
        token: int | None = None,
    ) -> None:
        body: dict[str, Any] = {
            "request_id": request_id,
            "connect": [[a, b] for a, b in connect],
            "disconnect": [[a, b] for a, b in disconnect],
        }
        if token is not None:
            body["fencing_token"] = token
        self._request("POST", f"/oxcs/{quote(oxc_id, safe='')}/apply", oxc_id, body)

    def read(self, oxc_id: str, *, token: int | None = None) -> ConfirmedState:
        params = {"fencing_token": token} if token is not None else None
        data = self._request("GET", f"/oxcs/{quote(oxc_id, safe='')}", oxc_id, params=params)
        try:
            return ConfirmedState(
                oxc_id=str(data["id"]),
                ports=int(data["ports"]),
                cross_connects=frozenset(
                    (min(int(c["a"]), int(c["b"])), max(int(c["a"]), int(c["b"])))
                    for c in data["cross_connects"]
                ),
                failed_ports=frozenset(int(p) for p in data["failed_ports"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise SwitchProtocolError(
                f"{oxc_id}: unreadable switch state: {exc!r}", oxc_id=oxc_id
            ) from exc

    def list_oxcs(self) -> list[str]:
        """The OXC ids the service hosts (also a cheap reachability check for /readyz)."""
        data = self._request("GET", "/oxcs", None)
        try:
            return [str(o["id"]) for o in data["oxcs"]]
        except (KeyError, TypeError) as exc:
            raise SwitchProtocolError(f"unreadable OXC list: {exc!r}") from exc

    def close(self) -> None:
        self._client.close()

    def _request(
        self,
        method: str,
        path: str,
        oxc_id: str | None,
        body: dict[str, Any] | None = None,
        params: dict[str, Any] | None = None,
    ) -> Any:
        """One HTTP exchange; every failure leaves as a SouthboundError."""
        httpx = self._httpx
        try:
            response = self._client.request(method, path, json=body, params=params)
        except httpx.TimeoutException as exc:
            raise SwitchTimeout(
                f"{method} {path}: no answer in time ({exc.__class__.__name__})", oxc_id=oxc_id
            ) from exc
        except httpx.TransportError as exc:
            raise SwitchUnreachable(f"{method} {path}: {exc!r}", oxc_id=oxc_id) from exc
        try:
            response.raise_for_status()
        except httpx.HTTPStatusError as exc:
            raise _error_from_problem(response, oxc_id) from exc
        try:
            return response.json()
        except ValueError as exc:
            raise SwitchProtocolError(
                f"{method} {path}: answer is not JSON", oxc_id=oxc_id
            ) from exc


def _error_from_problem(response: httpx.Response, oxc_id: str | None) -> SouthboundError:
    """The southbound error a 4xx/5xx answer stands for (problem+json `type` first)."""
    try:
        problem = response.json()
    except ValueError:
        problem = {}
    if not isinstance(problem, dict):
        problem = {}
    detail = str(problem.get("detail") or problem.get("title") or response.reason_phrase)
    cls = error_class_for_problem_type(str(problem.get("type", "")))
    if cls is None:
        status = response.status_code
        cls = _ERROR_FOR_STATUS.get(status, SwitchFault if status >= 500 else SwitchProtocolError)
    raw_ports = problem.get("ports", [])
    ports = tuple(p for p in raw_ports if isinstance(p, int)) if isinstance(raw_ports, list) else ()
    return cls(f"HTTP {response.status_code}: {detail}", oxc_id=oxc_id, ports=ports)

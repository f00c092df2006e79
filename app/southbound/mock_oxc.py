"""The `lightpath mock-oxc` service: one optical switch model per OXC behind HTTP.

Routes (JSON; every 4xx/5xx is RFC 9457 `application/problem+json` whose
`type` is `urn:lightpath:southbound:<code>` of the matching error class):

- `GET /oxcs`: the hosted OXCs with counts (never faulted: an inventory).
- `GET /oxcs/{id}[?fencing_token=N]`: `cross_connects` ([{"a", "b"}]),
  `failed_ports`, `ports`, `fencing_token` (the newest seen) (a command:
  injected faults apply).
- `POST /oxcs/{id}/apply` with `{"request_id", "connect": [[a, b]], "disconnect":
  [[a, b]], "fencing_token": N}`: the bulk change, answered once visible. 409
  `stale-token` when `fencing_token` is older than the newest the switch has
  seen (or missing after one was seen): the sender was deposed; 409 when a
  port is busy or failed or a disconnect names no cross-connect, 422 for a malformed
  command or a port out of range, 404 for an unknown OXC, 503 on an injected
  fault (nothing applied), 504 on an injected timeout (may have been applied).
- `POST /oxcs/{id}/ports/{port}/fail` and `/restore`: loss of light, and back.
- `GET /healthz`, `GET /metrics` (Prometheus text, a registry per app).

The factory builds everything; nothing happens at import time and nothing reads
the environment. Route functions are plain `def`: FastAPI runs them in its
thread pool, so a command waiting out the reconfiguration latency does not
block reads. The switch state lives in this process's memory: run exactly one
process (no uvicorn `--workers`, one replica in Kubernetes); a restart is a
switch that lost its configuration, which the reconciler repairs. Must not
import SQLAlchemy or Redis.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterator, Mapping
from typing import Annotated, Any

from fastapi import FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..engine.cluster import Cluster
from .errors import (
    PROBLEM_TYPE_PREFIX,
    CommandRefused,
    NotConnected,
    PortBusy,
    PortFailed,
    RequestIdReused,
    SouthboundError,
    StaleToken,
    SwitchFault,
    SwitchTimeout,
    SwitchUnauthorized,
    UnknownSwitch,
)
from .switch import OpticalSwitch, switches_for_cluster

PROBLEM_JSON = "application/problem+json"
_MAX_PAIRS_PER_COMMAND = 8192

# Most specific class first: the first isinstance match decides the status.
_STATUS_FOR_ERROR: tuple[tuple[type[SouthboundError], int], ...] = (
    (PortBusy, 409),
    (PortFailed, 409),
    (NotConnected, 409),
    (RequestIdReused, 409),
    (StaleToken, 409),
    (CommandRefused, 422),
    (UnknownSwitch, 404),
    (SwitchFault, 503),
    (SwitchTimeout, 504),
)

PortPairBody = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=2, max_length=2)]


class ApplyCommand(BaseModel):
    """The body of `POST /oxcs/{id}/apply`."""

    model_config = ConfigDict(extra="forbid")

    request_id: str = Field(min_length=1, max_length=200)
    connect: list[PortPairBody] = Field(default_factory=list, max_length=_MAX_PAIRS_PER_COMMAND)
    disconnect: list[PortPairBody] = Field(default_factory=list, max_length=_MAX_PAIRS_PER_COMMAND)
    fencing_token: int | None = Field(None, ge=0, le=2**63 - 1)


class _Metrics:
    """The service's Prometheus series, in a registry of its own (one per app)."""

    def __init__(self, switches: Mapping[str, OpticalSwitch]) -> None:
        self.registry = CollectorRegistry()
        self.commands = Counter(
            "lightpath_oxc_commands_total",
            "Commands received by the mock OXCs, by outcome.",
            ["oxc", "command", "outcome"],
            registry=self.registry,
        )
        self.refusals = Counter(
            "lightpath_oxc_refusals_total",
            "Commands refused as invalid for the switch state, by reason.",
            ["oxc", "reason"],
            registry=self.registry,
        )
        self.reconfigurations = Counter(
            "lightpath_oxc_reconfigurations_total",
            "Accepted bulk changes that moved at least one cross-connect.",
            ["oxc"],
            registry=self.registry,
        )
        self.reconfiguration_seconds = Histogram(
            "lightpath_oxc_reconfiguration_seconds",
            "Time from accepting a bulk change to it being visible.",
            ["oxc"],
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0),
            registry=self.registry,
        )
        self.registry.register(_StateCollector(switches))

    def observe_reconfiguration(self, oxc_id: str, seconds: float) -> None:
        self.reconfigurations.labels(oxc_id).inc()
        self.reconfiguration_seconds.labels(oxc_id).observe(seconds)

    def count(self, oxc_id: str, command: str, error: SouthboundError | None) -> None:
        if error is None:
            outcome = "ok"
        elif isinstance(error, SwitchTimeout):
            outcome = "timeout"
        elif error.is_transient:
            outcome = "fault"
        else:
            outcome = "refused"
            self.refusals.labels(oxc_id, error.code).inc()
        self.commands.labels(oxc_id, command, outcome).inc()


class _StateCollector(Collector):
    """Cross-connect and failed-port gauges, read from the models at scrape time."""

    def __init__(self, switches: Mapping[str, OpticalSwitch]) -> None:
        self._switches = switches

    def collect(self) -> Iterator[GaugeMetricFamily]:
        cross_connects = GaugeMetricFamily(
            "lightpath_oxc_cross_connects", "Cross-connects set on the switch.", labels=["oxc"]
        )
        failed = GaugeMetricFamily(
            "lightpath_oxc_failed_ports", "Ports marked failed (loss of light).", labels=["oxc"]
        )
        token = GaugeMetricFamily(
            "lightpath_oxc_fencing_token",
            "The newest fencing token the switch has seen (older ones are refused).",
            labels=["oxc"],
        )
        for oxc_id, switch in self._switches.items():
            state = switch.inspect()
            cross_connects.add_metric([oxc_id], len(state.cross_connects))
            failed.add_metric([oxc_id], len(state.failed_ports))
            token.add_metric([oxc_id], switch.fencing_token)
        yield cross_connects
        yield failed
        yield token


def create_mock_oxc_app(
    cluster: Cluster,
    *,
    reconfig_ms: float | None = None,
    fault_rate: float = 0.0,
    seed: int = 0,
    token: str | None = None,
) -> FastAPI:
    """The mock OXC service for `cluster` (`reconfig_ms=None`: each OXC's own latency).

    With `token`, every route but `/healthz` and `/metrics` needs
    `Authorization: Bearer <token>` (401 otherwise): anyone who can reach the
    control API could rewire the fabric.

    The switch models are on `app.state.switches` (a dict by OXC id) for tests.
    """
    switches: dict[str, OpticalSwitch] = {}
    metrics = _Metrics(switches)
    switches.update(
        switches_for_cluster(
            cluster,
            reconfig_ms=reconfig_ms,
            fault_rate=fault_rate,
            seed=seed,
            on_reconfiguration=metrics.observe_reconfiguration,
        )
    )
    app = FastAPI(
        title="lightpath mock-oxc",
        summary="Optical circuit switch models for the Lightpath southbound driver.",
        version="1",
    )
    app.state.switches = switches
    _install_problem_handlers(app)

    if token:
        expected = f"Bearer {token}".encode()

        @app.middleware("http")
        async def require_token(request: Request, call_next: Any) -> Any:
            if request.url.path in ("/healthz", "/metrics"):
                return await call_next(request)
            presented = request.headers.get("authorization", "").encode()
            if not hmac.compare_digest(presented, expected):
                return _problem(
                    401,
                    "Unauthorized",
                    "a valid bearer token is required",
                    PROBLEM_TYPE_PREFIX + SwitchUnauthorized.code,
                )
            return await call_next(request)

    def switch_for(oxc_id: str) -> OpticalSwitch:
        try:
            return switches[oxc_id]
        except KeyError:
            raise UnknownSwitch(f"no OXC {oxc_id!r}", oxc_id=oxc_id) from None

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/metrics")
    def metrics_text() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/oxcs")
    def list_oxcs() -> dict[str, Any]:
        rows = []
        for oxc_id, switch in switches.items():
            state = switch.inspect()
            rows.append(
                {
                    "id": oxc_id,
                    "ports": switch.ports,
                    "reconfig_ms": switch.reconfig_ms,
                    "cross_connects": len(state.cross_connects),
                    "failed_ports": len(state.failed_ports),
                    "reconfiguring": switch.is_reconfiguring(),
                }
            )
        return {"oxcs": rows}

    @app.get("/oxcs/{oxc_id}")
    def read_oxc(
        oxc_id: str, fencing_token: Annotated[int | None, Query(ge=0, le=2**63 - 1)] = None
    ) -> dict[str, Any]:
        switch = switch_for(oxc_id)
        try:
            state = switch.read(token=fencing_token)
        except SouthboundError as exc:
            metrics.count(oxc_id, "read", exc)
            raise
        metrics.count(oxc_id, "read", None)
        return {
            "id": oxc_id,
            "ports": state.ports,
            "reconfig_ms": switch.reconfig_ms,
            "cross_connects": [{"a": a, "b": b} for a, b in sorted(state.cross_connects)],
            "failed_ports": sorted(state.failed_ports),
            "fencing_token": switch.fencing_token,
        }

    @app.post("/oxcs/{oxc_id}/apply")
    def apply_command(oxc_id: str, command: ApplyCommand) -> dict[str, Any]:
        switch = switch_for(oxc_id)
        try:
            outcome = switch.apply(
                [(p[0], p[1]) for p in command.connect],
                [(p[0], p[1]) for p in command.disconnect],
                command.request_id,
                token=command.fencing_token,
            )
        except SouthboundError as exc:
            metrics.count(oxc_id, "apply", exc)
            raise
        metrics.count(oxc_id, "apply", None)
        return {
            "oxc_id": oxc_id,
            "request_id": outcome.request_id,
            "replayed": outcome.is_replay,
            "changed_pairs": outcome.changed_pairs,
            "reconfig_ms": outcome.reconfig_s * 1000.0,
        }

    @app.post("/oxcs/{oxc_id}/ports/{port}/fail")
    def fail_port(oxc_id: str, port: Annotated[int, Path(ge=0)]) -> dict[str, Any]:
        switch_for(oxc_id).fail_port(port)
        return {"oxc_id": oxc_id, "port": port, "failed": True}

    @app.post("/oxcs/{oxc_id}/ports/{port}/restore")
    def restore_port(oxc_id: str, port: Annotated[int, Path(ge=0)]) -> dict[str, Any]:
        switch_for(oxc_id).restore_port(port)
        return {"oxc_id": oxc_id, "port": port, "failed": False}

    return app


def _problem(status: int, title: str, detail: str, problem_type: str, **extra: Any) -> JSONResponse:
    body = {"type": problem_type, "title": title, "status": status, "detail": detail, **extra}
    return JSONResponse(body, status_code=status, media_type=PROBLEM_JSON)


def _install_problem_handlers(app: FastAPI) -> None:
    """Every error this service answers is problem+json."""

    @app.exception_handler(SouthboundError)
    def southbound_error(_: Request, exc: SouthboundError) -> JSONResponse:
        status = next((s for cls, s in _STATUS_FOR_ERROR if isinstance(exc, cls)), 500)
        title = exc.code.replace("-", " ").capitalize()
        return _problem(
            status,
            title,
            exc.detail,
            exc.problem_type,
            oxc_id=exc.oxc_id,
            ports=list(exc.ports),
            transient=exc.is_transient,
        )

    @app.exception_handler(RequestValidationError)
    def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            {
                "loc": [str(part) for part in e.get("loc", ())],
                "msg": e.get("msg", ""),
                "type": e.get("type", ""),
            }
            for e in exc.errors()
        ]
        return _problem(
            422,
            "Invalid command",
            "the request does not match the command schema",
            PROBLEM_TYPE_PREFIX + CommandRefused.code,
            errors=errors,
        )

    @app.exception_handler(StarletteHTTPException)
    def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _problem(exc.status_code, str(exc.detail), str(exc.detail), "about:blank")

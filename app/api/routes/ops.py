"""Operations: liveness, readiness, Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool

from ..deps import ServicesDep
from ..problems import problem_response
from ..schemas import HealthOut, ReadyOut

router = APIRouter(tags=["operations"])


@router.get(
    "/healthz", response_model=HealthOut, summary="The process is alive", operation_id="getHealth"
)
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get(
    "/readyz",
    response_model=ReadyOut,
    summary="Database, event bus (and, under serve, the switches) reachable",
    operation_id="getReadiness",
    responses={
        503: {
            "description": "a dependency is unreachable; the problem's `checks` say which",
        }
    },
)
async def readyz(services: ServicesDep) -> JSONResponse:
    checks: dict[str, str] = {}

    def probe(name: str, fn: object) -> None:
        try:
            fn()  # type: ignore[operator]
            checks[name] = "ok"
        except Exception as exc:  # a readiness probe reports, it does not raise
            checks[name] = f"unreachable: {type(exc).__name__}"

    # what this process needs: `lightpath serve` drives the switches itself, so it
    # probes them too; `lightpath api` does not (switches that are down do not stop
    # launchers submitting or completing jobs; the worker's own /readyz probes them)
    await run_in_threadpool(probe, "database", services.store.ping)
    await run_in_threadpool(probe, "bus", services.bus.ping)
    if services.southbound is not None:
        await run_in_threadpool(probe, "southbound", services.southbound.list_oxcs)
    if all(v == "ok" for v in checks.values()):
        return JSONResponse({"status": "ready", "checks": checks})
    down = ", ".join(f"{k}: {v}" for k, v in checks.items() if v != "ok")
    return problem_response(503, "Not ready", down, kind="not-ready", extra={"checks": checks})


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    response_class=Response,
    operation_id="getMetrics",
    responses={200: {"content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}}}},
)
async def metrics(services: ServicesDep) -> Response:
    registry = services.metrics.registry
    data = await run_in_threadpool(generate_latest, registry)
    return Response(data, media_type=CONTENT_TYPE_LATEST)

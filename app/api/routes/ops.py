"""Operations: liveness, readiness, Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool

from ..deps import ServicesDep

router = APIRouter(tags=["operations"])


@router.get("/healthz", summary="The process is alive")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", summary="Database, event bus and southbound reachable")
async def readyz(services: ServicesDep) -> JSONResponse:
    checks: dict[str, str] = {}

    def probe(name: str, fn: object) -> None:
        try:
            fn()  # type: ignore[operator]
            checks[name] = "ok"
        except Exception as exc:  # a readiness probe reports, it does not raise
            checks[name] = f"unreachable: {type(exc).__name__}"

    await run_in_threadpool(probe, "database", services.store.ping)
    await run_in_threadpool(probe, "bus", services.bus.ping)
    if services.southbound is not None:
        await run_in_threadpool(probe, "southbound", services.southbound.list_oxcs)
    ready = all(v == "ok" for v in checks.values())
    return JSONResponse(
        {"status": "ready" if ready else "not ready", "checks": checks},
        status_code=200 if ready else 503,
    )


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
async def metrics(services: ServicesDep) -> Response:
    registry = services.metrics.registry
    data = await run_in_threadpool(generate_latest, registry)
    return Response(data, media_type=CONTENT_TYPE_LATEST)

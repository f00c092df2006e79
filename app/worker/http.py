"""The worker's own small HTTP surface: /healthz, /readyz, /metrics (no API routes)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool


def create_worker_app(runtime: Any) -> FastAPI:
    """Probes and metrics for a `lightpath worker` process."""
    app = FastAPI(title="Lightpath worker", docs_url=None, redoc_url=None)
    services = runtime.services

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        checks: dict[str, str] = {}
        for name, probe in (
            ("database", services.store.ping),
            ("bus", services.bus.ping),
            ("southbound", services.southbound.list_oxcs),
        ):
            try:
                await run_in_threadpool(probe)
                checks[name] = "ok"
            except Exception as exc:  # a probe reports, it does not raise
                checks[name] = f"unreachable: {type(exc).__name__}"
        ready = all(v == "ok" for v in checks.values())
        return JSONResponse(
            {
                "status": "ready" if ready else "not ready",
                "leader": runtime.is_leader(),
                "checks": checks,
            },
            status_code=200 if ready else 503,
        )

    @app.get("/metrics")
    async def metrics() -> Response:
        registry = services.metrics.registry
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app

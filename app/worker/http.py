"""The worker's own small HTTP surface: /healthz, /readyz, /metrics (no API routes)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from app.api.routes.ops import NotReady, readiness, switches_ready


def create_worker_app(runtime: Any) -> FastAPI:
    """Probes and metrics for a `lightpath worker` process."""
    app = FastAPI(title="Lightpath worker", docs_url=None, redoc_url=None)
    services = runtime.services
    worker = getattr(runtime, "worker", None)
    fabric_process = getattr(worker, "fabric_process", None)

    def fabric() -> None:
        assert fabric_process is not None
        if (why := fabric_process.health()) is not None:
            raise NotReady(why)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        probes = [
            ("database", services.store.ping),
            ("bus", services.bus.ping),
            ("southbound", lambda: switches_ready(services.southbound, services.cluster)),
        ]
        if fabric_process is not None:  # the planner's own process (`lightpath worker`)
            probes.append(("fabric", fabric))
        return await readiness(probes, {"leader": runtime.is_leader()})

    @app.get("/metrics")
    async def metrics() -> Response:
        registry = services.metrics.registry
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app

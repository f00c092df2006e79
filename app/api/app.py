"""The FastAPI application factory. Nothing is built at import time."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from .deps import Services
from .middleware import BodyLimit, RequestTiming
from .problems import install_problem_handlers
from .routes import advice, fabric, jobs, ops, telemetry

DESCRIPTION = """Online scheduler control plane for optically interconnected GPU datacenters.

Auth: `Authorization: Bearer <token>`; scopes launcher (jobs), telemetry (traffic
reports), operator (everything). Every error is `application/problem+json` (RFC 9457).
"""

PROBLEM_SCHEMA = {
    "type": "object",
    "description": "RFC 9457 problem details",
    "properties": {
        "type": {"type": "string"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "errors": {
            "type": "array",
            "description": "offending fields of a validation problem",
            "items": {"type": "object"},
        },
    },
    "required": ["type", "title", "status", "detail"],
}


def create_app(services: Services) -> FastAPI:
    """Build the API around `services` (real or fake parts chosen by the caller)."""
    app = FastAPI(title="Lightpath", version="0.1.0", description=DESCRIPTION)
    app.state.services = services
    metrics = services.metrics
    install_problem_handlers(app)
    for router in (jobs.router, telemetry.router, advice.router, fabric.router, ops.router):
        app.include_router(router)
    app.add_middleware(BodyLimit, max_bytes=services.settings.max_body_bytes)
    app.add_middleware(RequestTiming, metrics=metrics)

    def openapi() -> dict:  # type: ignore[type-arg]
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
            )
            schema.setdefault("components", {}).setdefault("schemas", {})["Problem"] = (
                PROBLEM_SCHEMA
            )
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app

"""The FastAPI application factory. Nothing is built at import time."""

from __future__ import annotations

from fastapi import FastAPI

from .deps import Services
from .middleware import (
    BodyLimit,
    CachedJobViews,
    HeadAsGet,
    JsonBodies,
    RequestTiming,
    TokenFirst,
)
from .openapi import install_openapi_and_docs
from .problems import install_problem_handlers
from .routes import advice, fabric, jobs, ops, telemetry

DESCRIPTION = """Online scheduler control plane for optically interconnected GPU datacenters.

Auth: `Authorization: Bearer <token>` (the Authorize button); scopes launcher (jobs),
telemetry (traffic reports), operator (everything). With no tokens configured the
server binds loopback only and needs none.

Every error is `application/problem+json` (RFC 9457): `type`, `title`, `status`,
`detail`, and `errors` (the offending fields) for validation problems.

Paginated lists (`GET /v1/jobs`, `GET /v1/decisions`) follow one rule: `next` is the
`after` to pass for the next page.
"""

TAGS = [
    {"name": "jobs", "description": "a job's arrival, state and ending (launchers)"},
    {"name": "telemetry", "description": "traffic reports and learned cycles"},
    {"name": "advice", "description": "memory model"},
    {"name": "fabric", "description": "cluster, switches and the decision log (operators)"},
    {"name": "operations", "description": "probes and metrics (no token)"},
]


def create_app(services: Services) -> FastAPI:
    """Build the API around `services` (real or fake parts chosen by the caller)."""
    app = FastAPI(
        title="Lightpath",
        version="0.1.0",
        description=DESCRIPTION,
        openapi_tags=TAGS,
        docs_url=None,
        redoc_url=None,
        # no 307 to the path without its trailing slash (an undocumented answer whose
        # Location echoes the client's Host header): such a path is a 404 problem
        redirect_slashes=False,
    )
    app.state.services = services
    metrics = services.metrics
    install_problem_handlers(app)
    routers = (jobs.router, telemetry.router, advice.router, fabric.router, ops.router)
    for router in routers:
        app.include_router(router)
    app.add_middleware(CachedJobViews, services=services)
    app.add_middleware(JsonBodies)
    app.add_middleware(BodyLimit, max_bytes=services.settings.max_body_bytes)
    # 401 and 403 before any body check
    routes = [route for router in routers for route in router.routes]
    app.add_middleware(TokenFirst, services=services, routes=routes)
    app.add_middleware(HeadAsGet)  # outside the cached views, which serve GET
    app.add_middleware(RequestTiming, metrics=metrics)

    install_openapi_and_docs(app)
    return app

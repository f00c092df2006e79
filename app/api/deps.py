"""What routes need, declared once: the services bundle and the auth check."""

from __future__ import annotations

import hmac
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Annotated, Any

from fastapi import Depends, Request, Security
from fastapi.security import HTTPBearer

from app.engine.cluster import Cluster
from app.settings import Settings
from app.store import Store
from app.store.fabric_repository import FabricRepository
from app.store.traffic_repository import TrafficRepository

from .metrics import ApiMetrics
from .problems import Problem
from .read_cache import JobViewCache
from .waiters import JobWaiters


@dataclass
class Services:
    """Everything the API talks to; built by `app.wiring` (real or fake parts)."""

    settings: Settings
    cluster: Cluster
    store: Store
    bus: Any
    metrics: ApiMetrics
    traffic: TrafficRepository
    fabric: FabricRepository
    waiters: JobWaiters = field(default_factory=JobWaiters)
    read_cache: JobViewCache = field(default_factory=lambda: JobViewCache(ttl_s=1.0))
    southbound: Any = None
    kick_relay: Callable[[], None] = field(default=lambda: None)
    # after traffic reports commit: wake the worker (with the newest seq), or nothing
    # (no bus: the worker's tick reads them)
    wake_worker: Callable[[int], None] = field(default=lambda last_seq: None)
    # a sender for an event the API just committed (its outbox row written as sent), or
    # None: the relay sends it (no relay here, or the bus is failing)
    direct_sender: Callable[[], Callable[[dict[str, Any]], None] | None] = field(
        default=lambda: None
    )
    tokens: dict[str, str] | None = None  # bearer token -> scope, parsed on first use

    def token_scopes(self) -> dict[str, str]:
        """Bearer token -> scope, parsed once; empty when auth is off."""
        if self.tokens is None:
            self.tokens = self.settings.token_scopes()
        return self.tokens

    @cached_property
    def server_ids(self) -> frozenset[str]:
        """Every server id of the cluster (traffic ingest checks a batch's names against it)."""
        return frozenset(s.id for p in self.cluster.pods for t in p.tors for s in t.servers)


async def get_services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


# Declares the bearer scheme to OpenAPI (so /docs can send a token); the scopes a
# route admits are listed in its security requirement. The check is ours: `check`.
BEARER = HTTPBearer(
    scheme_name="bearerAuth",
    description="a token from LIGHTPATH_API_TOKENS; its scope is launcher, telemetry or "
    "operator (operator may call anything)",
    auto_error=False,
)


def scope_of(header: str, tokens: dict[str, str]) -> str | None:
    """The scope of the bearer token in an Authorization header, or None."""
    scheme, _, presented = header.partition(" ")
    if scheme.lower() != "bearer" or not presented:
        return None
    presented = presented.strip()
    for token, scope in tokens.items():
        if hmac.compare_digest(token.encode(), presented.encode()):
            return scope
    return None


def admits(scope: str, scopes: tuple[str, ...]) -> bool:
    """Does a token of `scope` pass a route admitting `scopes` (operator passes all)?"""
    return scope == "operator" or not scopes or scope in scopes


def require(*scopes: str) -> Any:
    """A dependency admitting a bearer token of one of `scopes` (operator admits all).

    With no tokens configured auth is off; the CLI only allows that on loopback.
    An empty `scopes` admits any valid token.
    """

    async def check(
        request: Request,
        services: ServicesDep,
        _bearer: Any = Security(BEARER, scopes=list(scopes)),  # noqa: B008 (FastAPI's idiom)
    ) -> str | None:
        tokens = services.token_scopes()
        if not tokens:
            return None
        scope = scope_of(request.headers.get("authorization", ""), tokens)
        if scope is None:
            raise Problem(
                401,
                "Unauthorized",
                "a valid bearer token is required",
                headers={"WWW-Authenticate": "Bearer"},
            )
        if not admits(scope, scopes):
            raise Problem(403, "Forbidden", forbidden_detail(scope, scopes))
        return scope

    check.lightpath_scopes = scopes  # type: ignore[attr-defined]  # for `required_scopes`
    return Depends(check)


def forbidden_detail(scope: str, scopes: tuple[str, ...]) -> str:
    return f"this token's scope is {scope}; this call needs {' or '.join(scopes)}"


def required_scopes(route: Any) -> tuple[str, ...] | None:
    """The scopes a route's `require` admits, None for a route without one."""
    pending = list(getattr(getattr(route, "dependant", None), "dependencies", ()))
    while pending:
        dep = pending.pop()
        found = getattr(dep.call, "lightpath_scopes", None)
        if found is not None:
            return tuple(found)
        pending.extend(dep.dependencies)
    return None

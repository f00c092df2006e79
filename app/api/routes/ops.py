"""Operations: liveness, readiness, Prometheus metrics."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool

from app.engine.cluster import Cluster
from app.logs import first_few
from app.store import DatabaseNotReady

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
            "description": "a dependency is unreachable (or, under serve, the switches do "
            "not host every OXC of the cluster); the problem's `checks` say which",
        }
    },
)
async def readyz(services: ServicesDep) -> JSONResponse:
    # what this process needs: `lightpath serve` drives the switches itself, so it
    # probes them too; `lightpath api` does not (switches that are down do not stop
    # launchers submitting or completing jobs; the worker's own /readyz probes them)
    probes: list[tuple[str, Callable[[], object]]] = [
        ("database", services.store.ping),
        ("bus", services.bus.ping),
    ]
    if services.southbound is not None:
        southbound = services.southbound
        probes.append(("southbound", lambda: switches_ready(southbound, services.cluster)))
    return await readiness(probes)


def switches_ready(southbound: Any, cluster: Cluster) -> None:
    """The switches answer and host every OXC of the cluster: a switch service started on
    another cluster file answered `unknown-switch` for 14 of seed-15k's 16 OXCs on every
    pass while this probe, a bare listing, said ok."""
    hosted = set(southbound.list_oxcs())
    missing = [o.id for o in cluster.oxcs if o.id not in hosted]
    if missing:
        raise NotReady(
            f"the switches do not host {len(missing)} of the cluster's {len(cluster.oxcs)} "
            f"OXCs ({first_few(missing)})"
        )


# a probe that has not answered by then is reported unreachable: Kubernetes' probes
# give up after 1 s by default, and a hung switch held the worker's answer for 5 s
PROBE_TIMEOUT_S = 0.8


class NotReady(Exception):
    """A readiness probe's answer other than ok: the message is what `checks` reports."""


async def readiness(
    probes: Sequence[tuple[str, Callable[[], object]]], extra: dict[str, Any] | None = None
) -> JSONResponse:
    """200 with every check `ok`, else a 503 problem whose `checks` say what is down.

    The probes run at once, each in the threadpool, and each is given
    `PROBE_TIMEOUT_S` (one left hanging finishes in its thread, unawaited)."""

    async def probe(fn: Callable[[], object]) -> str:
        try:
            await asyncio.wait_for(run_in_threadpool(fn), PROBE_TIMEOUT_S)
            return "ok"
        except TimeoutError:
            return f"unreachable: no answer within {PROBE_TIMEOUT_S} s"
        except (DatabaseNotReady, NotReady) as exc:
            return str(exc)
        except Exception as exc:  # a readiness probe reports, it does not raise
            return f"unreachable: {type(exc).__name__}"

    answers = await asyncio.gather(*(probe(fn) for _, fn in probes))
    checks = {name: answer for (name, _), answer in zip(probes, answers, strict=True)}
    if all(v == "ok" for v in checks.values()):
        return JSONResponse({"status": "ready", **(extra or {}), "checks": checks})
    down = ", ".join(f"{k}: {v}" for k, v in checks.items() if v != "ok")
    return problem_response(
        503, "Not ready", down, kind="not-ready", extra={**(extra or {}), "checks": checks}
    )


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
